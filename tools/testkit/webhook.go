package testkit

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// Webhook is a delivered webhook body as a merchant parses it.
type Webhook struct {
	ID        string           `json:"id"`
	Type      string           `json:"type"`
	CreatedAt string           `json:"created_at"`
	Data      payment.Resource `json:"data"`
}

// DecodeWebhook parses a webhook body strictly: a field the merchant does not know fails the test.
func DecodeWebhook(t testing.TB, body []byte) Webhook {
	t.Helper()
	var w Webhook
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&w), "%s", body)
	return w
}

// Hook is a merchant's webhook endpoint that records every request it gets.
type Hook struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []HookRequest
}

// HookOptions name the headers a Hook records (the sender's, passed in so that the tests of the
// sender's own package can use a Hook too) and say how it answers.
type HookOptions struct {
	EventIDHeader, SignatureHeader string
	// Respond answers the n-th request (from 1); nil answers 200.
	Respond func(n int, w http.ResponseWriter, r *http.Request)
}

// HookRequest is one request a Hook got.
type HookRequest struct {
	EventID, Signature, ContentType string
	Header                          http.Header // every header, as it came
	Body                            []byte
	At                              time.Time
}

// NewHook starts a Hook; it stops when the test ends.
func NewHook(t testing.TB, o HookOptions) *Hook {
	t.Helper()
	h := &Hook{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.reqs = append(h.reqs, HookRequest{EventID: r.Header.Get(o.EventIDHeader), Signature: r.Header.Get(o.SignatureHeader),
			ContentType: r.Header.Get("Content-Type"), Header: r.Header.Clone(), Body: body, At: time.Now()})
		n := len(h.reqs)
		h.mu.Unlock()
		if o.Respond != nil {
			o.Respond(n, w, r)
		}
	}))
	t.Cleanup(h.Close)
	return h
}

// Requests are the requests so far, in the order they came.
func (h *Hook) Requests() []HookRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]HookRequest(nil), h.reqs...)
}

// Count is how many requests came so far.
func (h *Hook) Count() int { return len(h.Requests()) }
