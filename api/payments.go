package api

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"sort"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// createPayment implements POST /v1/payments: every row of the answers table in docs/openapi.yaml.
func (s *Server) createPayment(c *gin.Context) {
	s.create(c, s.payments, store.ScopePayment, func(merchantID uuid.UUID, key string, body []byte) (creation, error) {
		req, err := payment.ParseRequest(body)
		if err != nil {
			return creation{}, err
		}
		countDuplicate := func(err error) {
			var dup *payment.DuplicatePaymentError
			if errors.As(err, &dup) {
				s.metrics.idempotency.WithLabelValues("duplicate_payment").Inc()
				s.metrics.conflicts.WithLabelValues("payments_business_key").Inc()
			}
		}
		return creation{hash: req.Hash(), queueable: true, begin: func(ctx context.Context, queue bool) (store.Record, op, store.Began, error) {
			rec, p, began, err := s.Store.Begin(ctx, store.BeginInput{
				MerchantID: merchantID, Key: key, Request: req, OperationID: payment.NewID(), Lease: s.Lease, Queue: queue,
				CaptureWindow: s.CaptureWindow,
			})
			countDuplicate(err)
			return rec, s.payments.op(p), began, err
		}, refusal: func(ctx context.Context) error {
			err := s.Store.Refusal(ctx, merchantID, req)
			countDuplicate(err)
			return err
		}}, nil
	})
}

func (s *Server) getPayment(c *gin.Context) {
	if !s.queryOK(c) {
		return
	}
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		s.writeError(c, payment.ErrNotFound)
		return
	}
	p, err := s.Store.Payment(c.Request.Context(), id)
	if err == nil && p.MerchantID != merchantOf(c).ID {
		err = payment.ErrNotFound // another merchant's payment does not exist for this one
	}
	if err == nil {
		err = s.markCaptureClosed(c.Request.Context(), &p)
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	writeJSON(c, http.StatusOK, p.Resource())
}

func (s *Server) paymentByKey(c *gin.Context) {
	if !s.queryOK(c, "idempotency_key") {
		return
	}
	keys := c.Request.URL.Query()["idempotency_key"]
	switch {
	case len(keys) == 0:
		s.writeError(c, &payment.ValidationError{Fields: []payment.FieldError{{Field: "idempotency_key", Message: "query parameter is required"}}})
		return
	case len(keys) > 1 || !payment.ValidKey(keys[0]):
		// Checked here, not by the database: a byte sequence that is not UTF-8 is an error there.
		s.writeError(c, payment.ErrKeyInvalid)
		return
	}
	p, err := s.Store.PaymentByKey(c.Request.Context(), merchantOf(c).ID, keys[0])
	if err == nil {
		err = s.markCaptureClosed(c.Request.Context(), &p)
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	writeJSON(c, http.StatusOK, p.Resource())
}

// markCaptureClosed marks the manual payments that read requires_capture but take no capture
// now (a capture or cancel is under way, or the window is over): their capturable is nothing,
// not the authorization a capture is taking.
func (s *Server) markCaptureClosed(ctx context.Context, ps ...*payment.Payment) error {
	var ids []uuid.UUID
	for _, p := range ps {
		if p.CaptureManual && p.Status == payment.StatusRequiresCapture {
			ids = append(ids, p.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	closed, err := s.Store.CaptureClosed(ctx, ids)
	if err != nil {
		return err
	}
	for _, p := range ps {
		p.CaptureClosed = slices.Contains(closed, p.ID)
	}
	return nil
}

// queryOK checks the query string against the parameters a route takes (a trailing "*" marks
// one that may repeat) and answers 400 invalid_request when it is malformed, names a parameter
// the route does not take, or repeats one that may not repeat: a misspelt option is an error,
// never silently ignored. Each handler validates the values.
func (s *Server) queryOK(c *gin.Context, params ...string) bool {
	raw := c.Request.URL.RawQuery
	if raw == "" {
		return true
	}
	values, err := url.ParseQuery(raw)
	if err != nil {
		s.writeError(c, &payment.ValidationError{Fields: []payment.FieldError{{Field: "query", Message: "malformed query string"}}})
		return false
	}
	var ve payment.ValidationError
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		switch {
		case slices.Contains(params, name+"*"):
		case !slices.Contains(params, name):
			ve.Fields = append(ve.Fields, payment.FieldError{Field: name, Message: "unknown query parameter"})
		case len(values[name]) > 1:
			ve.Fields = append(ve.Fields, payment.FieldError{Field: name, Message: "may be given once"})
		}
	}
	if len(ve.Fields) > 0 {
		s.writeError(c, &ve)
		return false
	}
	return true
}

func (s *Server) getAccount(c *gin.Context) {
	if !s.queryOK(c) {
		return
	}
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		s.writeError(c, payment.ErrNotFound)
		return
	}
	a, err := s.Store.Account(c.Request.Context(), id)
	if err == nil && a.MerchantID != merchantOf(c).ID {
		err = payment.ErrNotFound
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	writeJSON(c, http.StatusOK, accountResource(a))
}

func idempotencyKey(c *gin.Context) (string, error) {
	vals := c.Request.Header.Values("Idempotency-Key")
	switch {
	case len(vals) == 0:
		return "", payment.ErrKeyMissing
	case len(vals) > 1 || !payment.ValidKey(vals[0]):
		return "", payment.ErrKeyInvalid
	}
	return vals[0], nil
}

// readJSONBody enforces the content type and the 64 KiB limit before anything is parsed.
func readJSONBody(c *gin.Context) ([]byte, error) {
	mt, _, err := mime.ParseMediaType(c.GetHeader("Content-Type"))
	if err != nil || mt != "application/json" {
		return nil, errUnsupportedMedia
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, payment.MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, errBodyTooLarge
	}
	if err != nil {
		return nil, &payment.ValidationError{Fields: []payment.FieldError{{Field: "body", Message: "could not be read"}}}
	}
	return body, nil
}

type accountBody struct {
	ID         string `json:"id"`
	MerchantID string `json:"merchant_id"`
	Kind       string `json:"kind"`
	Currency   string `json:"currency"`
	Balance    string `json:"balance"`
	Reserved   string `json:"reserved"`
	Available  string `json:"available"`
}

func accountResource(a payment.Account) accountBody {
	return accountBody{
		ID: a.ID.String(), MerchantID: a.MerchantID.String(), Kind: a.Kind, Currency: a.Currency,
		Balance:   payment.FormatAmount(a.Balance, a.Currency),
		Reserved:  payment.FormatAmount(a.Reserved, a.Currency),
		Available: payment.FormatAmount(a.Balance-a.Reserved, a.Currency),
	}
}
