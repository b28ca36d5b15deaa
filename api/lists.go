package api

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// Limits of every list route's page.
const (
	defaultListLimit = 20
	maxListLimit     = 100
)

// paymentListParams are the query parameters GET /v1/payments takes when it lists.
var paymentListParams = []string{"limit", "starting_after", "status", "created_gte", "created_lt"}

// paymentStatuses are the values of the status filter.
var paymentStatuses = []string{
	string(payment.StatusProcessing), string(payment.StatusSucceeded), string(payment.StatusFailed), string(payment.StatusUnknown),
	string(payment.StatusRequiresCapture), string(payment.StatusCanceled),
}

// listPage is the body of every list answer: a page, newest first, and whether a page follows.
type listPage[T any] struct {
	Data    []T  `json:"data"`
	HasMore bool `json:"has_more"`
}

// listQuery reads a list route's query parameters. A bad value is recorded rather than
// returned, so that one answer names every bad parameter; err reports them. The route's
// parameter names are checked first, by queryOK.
type listQuery struct {
	values url.Values
	errs   []payment.FieldError
}

func newListQuery(c *gin.Context) *listQuery {
	return &listQuery{values: c.Request.URL.Query()}
}

func (q *listQuery) fail(field, message string) {
	q.errs = append(q.errs, payment.FieldError{Field: field, Message: message})
}

// limit is the page size: limit, 1 to maxListLimit, default defaultListLimit.
func (q *listQuery) limit() int {
	v, ok := q.lookup("limit")
	if !ok {
		return defaultListLimit
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxListLimit || strconv.Itoa(n) != v { // digits only: no sign, no leading zeros
		q.fail("limit", "must be an integer from 1 to "+strconv.Itoa(maxListLimit))
		return defaultListLimit
	}
	return n
}

// startingAfter is the id of the row the page starts after (nil: the first page).
func (q *listQuery) startingAfter(what string) *uuid.UUID {
	v, ok := q.lookup("starting_after")
	if !ok {
		return nil
	}
	id, err := uuid.Parse(v)
	if err != nil || len(v) != 36 { // the canonical form only, as ids are answered
		q.fail("starting_after", "must be the id of a "+what)
		return nil
	}
	return &id
}

// oneOf is the value of name, which must be one of allowed ("" when absent).
func (q *listQuery) oneOf(name string, allowed []string) string {
	v, ok := q.lookup(name)
	if !ok {
		return ""
	}
	if !slices.Contains(allowed, v) {
		q.fail(name, "must be one of "+strings.Join(allowed, ", "))
		return ""
	}
	return v
}

// time is the RFC 3339 time of name (nil when absent).
func (q *listQuery) time(name string) *time.Time {
	v, ok := q.lookup(name)
	if !ok {
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(v)) // RFC 3339 allows a lower-case t and z
	if err != nil {
		q.fail(name, "must be an RFC 3339 time such as 2025-03-01T00:00:00Z (send a + in an offset as %2B)")
		return nil
	}
	return &t
}

// createdRange checks that a created_gte/created_lt pair can hold a row at all: an empty range
// is a mistake, not a question with an empty answer.
func (q *listQuery) createdRange(gte, lt *time.Time) {
	if gte != nil && lt != nil && !lt.After(*gte) {
		q.fail("created_lt", "must be later than created_gte")
	}
}

func (q *listQuery) lookup(name string) (string, bool) {
	vs, ok := q.values[name]
	if !ok || len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

// err is the recorded bad parameters as one invalid_request, or nil.
func (q *listQuery) err() error {
	if len(q.errs) == 0 {
		return nil
	}
	return &payment.ValidationError{Fields: q.errs}
}

// cursorError turns the store's answer for a starting_after that is not one of the merchant's
// rows into the parameter's 400: an empty page would look like the end of the list.
func cursorError(err error, what string) error {
	if errors.Is(err, store.ErrUnknownCursor) {
		return &payment.ValidationError{Fields: []payment.FieldError{{Field: "starting_after", Message: "no such " + what}}}
	}
	return err
}

// getPayments is GET /v1/payments: with idempotency_key, the payment that key created; without
// it, the merchant's payments.
func (s *Server) getPayments(c *gin.Context) {
	if _, lookup := c.Request.URL.Query()["idempotency_key"]; lookup {
		s.paymentByKey(c)
		return
	}
	s.listPayments(c)
}

// listPayments answers a page of the merchant's payments, newest first.
func (s *Server) listPayments(c *gin.Context) {
	if !s.queryOK(c, paymentListParams...) {
		return
	}
	q := newListQuery(c)
	in := store.ListPaymentsInput{MerchantID: merchantOf(c).ID, Limit: q.limit(), StartingAfter: q.startingAfter("payment")}
	in.Status = payment.Status(q.oneOf("status", paymentStatuses))
	in.CreatedGTE, in.CreatedLT = q.time("created_gte"), q.time("created_lt")
	q.createdRange(in.CreatedGTE, in.CreatedLT)
	if err := q.err(); err != nil {
		s.writeError(c, err)
		return
	}
	ps, more, err := s.Store.ListPayments(c.Request.Context(), in)
	if err != nil {
		s.writeError(c, cursorError(err, "payment"))
		return
	}
	marks := make([]*payment.Payment, len(ps))
	for i := range ps {
		marks[i] = &ps[i]
	}
	if err := s.markCaptureClosed(c.Request.Context(), marks...); err != nil {
		s.writeError(c, err)
		return
	}
	out := listPage[payment.Resource]{Data: make([]payment.Resource, 0, len(ps)), HasMore: more}
	for _, p := range ps {
		out.Data = append(out.Data, p.Resource())
	}
	writeJSON(c, http.StatusOK, out)
}
