package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/payment"
)

// decodeStrict decodes one JSON object into v, rejecting unknown fields and trailing data.
func decodeStrict(c *gin.Context, v any) error {
	body, err := readJSONBody(c)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &payment.ValidationError{Fields: []payment.FieldError{{Field: "body", Message: err.Error()}}}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &payment.ValidationError{Fields: []payment.FieldError{{Field: "body", Message: "unexpected data after the JSON object"}}}
	}
	return nil
}

type merchantRequest struct {
	Name       string `json:"name"`
	WebhookURL string `json:"webhook_url"`
}

type merchantCreated struct {
	ID            string  `json:"id"`
	Name          string  `json:"name"`
	WebhookURL    *string `json:"webhook_url"`
	APIKey        string  `json:"api_key"`
	WebhookSecret string  `json:"webhook_secret"`
}

func (s *Server) createMerchant(c *gin.Context) {
	var req merchantRequest
	if err := decodeStrict(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	var ve payment.ValidationError
	req.Name = strings.TrimSpace(req.Name)
	if req.Name == "" || len(req.Name) > 200 {
		ve.Fields = append(ve.Fields, payment.FieldError{Field: "name", Message: "is required, at most 200 characters"})
	}
	if req.WebhookURL != "" {
		if err := outbox.CheckWebhookURL(req.WebhookURL, s.AllowPrivateWebhooks); err != nil {
			ve.Fields = append(ve.Fields, payment.FieldError{Field: "webhook_url", Message: err.Error()})
		}
	}
	if len(ve.Fields) > 0 {
		s.writeError(c, &ve)
		return
	}
	m := payment.Merchant{ID: payment.NewID(), Name: req.Name, WebhookURL: req.WebhookURL}
	apiKey, secret := payment.NewSecret("sk_"), payment.NewSecret("whsec_")
	if err := s.Store.CreateMerchant(c.Request.Context(), m, apiKey, secret); err != nil {
		s.writeError(c, err)
		return
	}
	out := merchantCreated{ID: m.ID.String(), Name: m.Name, APIKey: apiKey, WebhookSecret: secret}
	if m.WebhookURL != "" {
		out.WebhookURL = &m.WebhookURL
	}
	writeJSON(c, http.StatusCreated, out)
}

type accountRequest struct {
	MerchantID string `json:"merchant_id"`
	Currency   string `json:"currency"`
}

func (s *Server) createAccount(c *gin.Context) {
	var req accountRequest
	if err := decodeStrict(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	var ve payment.ValidationError
	merchantID, err := uuid.Parse(req.MerchantID)
	if err != nil {
		ve.Fields = append(ve.Fields, payment.FieldError{Field: "merchant_id", Message: "must be a merchant id"})
	}
	currency, err := payment.ParseCurrency(req.Currency)
	if err != nil {
		ve.Fields = append(ve.Fields, payment.FieldError{Field: "currency", Message: err.Error()})
	}
	if len(ve.Fields) > 0 {
		s.writeError(c, &ve)
		return
	}
	a, err := s.Store.CreateAccount(c.Request.Context(), merchantID, currency)
	if errors.Is(err, payment.ErrNotFound) {
		err = &payment.ValidationError{Fields: []payment.FieldError{{Field: "merchant_id", Message: "no such merchant"}}}
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	writeJSON(c, http.StatusCreated, accountResource(a))
}

type depositRequest struct {
	Amount json.RawMessage `json:"amount"`
}

type depositBody struct {
	ID        string `json:"id"`
	AccountID string `json:"account_id"`
	Amount    string `json:"amount"`
	Currency  string `json:"currency"`
	CreatedAt string `json:"created_at"`
}

func (s *Server) deposit(c *gin.Context) {
	key, err := idempotencyKey(c)
	if err != nil {
		s.writeError(c, err)
		return
	}
	accountID, err := uuid.Parse(c.Param("id"))
	if err != nil {
		s.writeError(c, payment.ErrNotFound)
		return
	}
	var req depositRequest
	if err := decodeStrict(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	acct, err := s.Store.Account(c.Request.Context(), accountID)
	if err != nil {
		s.writeError(c, err)
		return
	}
	amount, err := payment.ParseAmountJSON(req.Amount, acct.Currency)
	if err != nil {
		s.writeError(c, &payment.ValidationError{Fields: []payment.FieldError{{Field: "amount", Message: err.Error()}}})
		return
	}
	d, replayed, err := s.Store.Deposit(c.Request.Context(), accountID, key, amount)
	if err != nil {
		s.writeError(c, err)
		return
	}
	if replayed {
		c.Header("Idempotent-Replayed", "true")
	}
	writeJSON(c, http.StatusCreated, depositBody{
		ID: d.ID.String(), AccountID: d.AccountID.String(), Amount: payment.FormatAmount(d.AmountMinor, d.Currency),
		Currency: d.Currency, CreatedAt: payment.FormatTime(d.CreatedAt),
	})
}
