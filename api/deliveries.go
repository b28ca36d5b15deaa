package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// Deliveries is what the webhook delivery routes need; *store.Store implements it.
type Deliveries interface {
	MerchantDeliveries(ctx context.Context, merchantID uuid.UUID, limit int) ([]store.Delivery, error)
	Redeliver(ctx context.Context, id uuid.UUID) (store.Delivery, error)
}

var errNoDeliveries = errors.New("webhook deliveries are not available on this server's store")

// deliveryStore is the server's Store when it can list and redeliver webhooks.
func (s *Server) deliveryStore() (Deliveries, error) {
	if d, ok := s.Store.(Deliveries); ok {
		return d, nil
	}
	return nil, errNoDeliveries
}

// Limits of GET /admin/v1/merchants/{id}/deliveries.
const (
	defaultDeliveryLimit = 50
	maxDeliveryLimit     = 200
)

type deliveryList struct {
	MerchantID string         `json:"merchant_id"`
	Deliveries []deliveryBody `json:"deliveries"`
}

type deliveryBody struct {
	ID             string        `json:"id"` // the event id, sent as Kasa-Event-Id
	EventType      string        `json:"event_type"`
	PaymentID      string        `json:"payment_id"`
	EventCreatedAt string        `json:"event_created_at"`
	URL            *string       `json:"url"`
	Status         string        `json:"status"`
	AttemptCount   int           `json:"attempt_count"`
	NextAttemptAt  *string       `json:"next_attempt_at"` // pending only
	LastStatusCode *int          `json:"last_status_code"`
	LastError      *string       `json:"last_error"`
	CreatedAt      string        `json:"created_at"`
	UpdatedAt      string        `json:"updated_at"`
	DeliveredAt    *string       `json:"delivered_at"`
	Attempts       []attemptBody `json:"attempts"`
}

type attemptBody struct {
	Attempt    int     `json:"attempt"`
	StartedAt  string  `json:"started_at"`
	DurationMS int64   `json:"duration_ms"`
	StatusCode *int    `json:"status_code"` // null: no HTTP answer (timeout, connection error)
	Error      *string `json:"error"`
}

func deliveryResource(d store.Delivery) deliveryBody {
	b := deliveryBody{
		ID: d.ID.String(), EventType: d.EventType, PaymentID: d.AggregateID.String(),
		EventCreatedAt: payment.FormatTime(d.EventCreatedAt), URL: optionalString(d.URL), Status: string(d.Status),
		AttemptCount: d.AttemptCount, LastStatusCode: optionalInt(d.LastStatusCode), LastError: optionalString(d.LastError),
		CreatedAt: payment.FormatTime(d.CreatedAt), UpdatedAt: payment.FormatTime(d.UpdatedAt),
		DeliveredAt: optionalTime(d.DeliveredAt), Attempts: []attemptBody{},
	}
	if d.Status == store.DeliveryPending {
		b.NextAttemptAt = optionalTime(&d.NextAttemptAt)
	}
	for _, a := range d.Attempts {
		b.Attempts = append(b.Attempts, attemptBody{
			Attempt: a.Attempt, StartedAt: payment.FormatTime(a.StartedAt), DurationMS: a.Duration.Milliseconds(),
			StatusCode: optionalInt(a.StatusCode), Error: optionalString(a.Error),
		})
	}
	return b
}

func optionalString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func optionalInt(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}

func optionalTime(t *time.Time) *string {
	if t == nil || t.IsZero() {
		return nil
	}
	s := payment.FormatTime(*t)
	return &s
}

// merchantDeliveries lists a merchant's most recent webhook deliveries, newest first, each with
// its attempt log. ?limit=1..200 (default 50).
func (s *Server) merchantDeliveries(c *gin.Context) {
	if !s.queryOK(c, "limit") {
		return
	}
	ds, err := s.deliveryStore()
	if err != nil {
		s.writeError(c, err)
		return
	}
	merchantID, err := uuid.Parse(c.Param("id"))
	if err != nil {
		s.writeError(c, payment.ErrNotFound)
		return
	}
	limit := defaultDeliveryLimit
	if q, ok := c.GetQuery("limit"); ok {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > maxDeliveryLimit || strconv.Itoa(n) != q { // digits only: no sign, no leading zeros
			s.writeError(c, &payment.ValidationError{Fields: []payment.FieldError{{Field: "limit", Message: "must be an integer from 1 to 200"}}})
			return
		}
		limit = n
	}
	list, err := ds.MerchantDeliveries(c.Request.Context(), merchantID, limit)
	if err != nil {
		s.writeError(c, err)
		return
	}
	out := deliveryList{MerchantID: merchantID.String(), Deliveries: make([]deliveryBody, 0, len(list))}
	for _, d := range list {
		out.Deliveries = append(out.Deliveries, deliveryResource(d))
	}
	writeJSON(c, http.StatusOK, out)
}

// redeliver sends a delivery's event again, now, to the merchant's current webhook URL: same
// event id, same body, a fresh signature and a fresh retry window. 202 with the delivery (status
// pending); 404 for no such delivery; 400 when the merchant has no webhook URL.
func (s *Server) redeliver(c *gin.Context) {
	if !s.queryOK(c) {
		return
	}
	ds, err := s.deliveryStore()
	if err != nil {
		s.writeError(c, err)
		return
	}
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		s.writeError(c, payment.ErrNotFound)
		return
	}
	d, err := ds.Redeliver(c.Request.Context(), id)
	if err != nil {
		s.writeError(c, err)
		return
	}
	writeJSON(c, http.StatusAccepted, deliveryResource(d))
}
