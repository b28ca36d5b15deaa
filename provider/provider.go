// Package provider is the client of the bank/payment provider API (the one banksim serves).
package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Errors classify every answer: only a definite one may decide a payment. A decline is not an
// error: it is a Charge whose Status is "declined".
var (
	// ErrAmbiguous: the charge may or may not have happened. Every answer but a charge with a
	// known status is this, 4xx included: a real provider answers 409 "in progress" or 429 while
	// the money may still move.
	ErrAmbiguous = errors.New("provider outcome unknown")
	// ErrNotFound: an inquiry found no charge for the reference.
	ErrNotFound = errors.New("provider has no such charge")
	// ErrInquiryUnsupported: the provider offers no status inquiry.
	ErrInquiryUnsupported = errors.New("provider does not support status inquiry")
)

// ChargeRequest asks the provider to move money.
type ChargeRequest struct {
	Reference   string `json:"reference"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
	AccountID   string `json:"account_id"`
}

// Charge is the provider's record of a charge.
type Charge struct {
	ID        string `json:"id"`
	Reference string `json:"reference"`
	Status    string `json:"status"` // "succeeded" or "declined"
}

// Charge statuses; any other is an answer kasa cannot read.
const (
	StatusSucceeded = "succeeded"
	StatusDeclined  = "declined"
)

// Succeeded reports whether money moved.
func (c Charge) Succeeded() bool { return c.Status == StatusSucceeded }

// maxErrorBody bounds how much of a provider's answer reaches an error, and through it the
// workflow history and the logs: a misbehaving provider must not fill either.
const maxErrorBody = 200

// Client talks HTTP to the provider.
type Client struct {
	base string
	http *http.Client
}

// New returns a client; timeout bounds each call.
func New(baseURL string, timeout time.Duration) *Client {
	return &Client{base: baseURL, http: &http.Client{Timeout: timeout}}
}

// Charge sends a charge with the operation id as its idempotency key.
func (c *Client) Charge(ctx context.Context, idempotencyKey string, r ChargeRequest) (Charge, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return Charge{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return Charge{}, err
	}
	// Without GetBody, net/http cannot silently re-send the POST on a fresh connection when a
	// kept-alive one dies mid-request: that re-send would be a second charge at a provider
	// without idempotency, and would hide an ambiguous outcome behind a normal 201.
	req.GetBody = nil
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idempotencyKey)
	var ch Charge
	return ch, c.do(req, http.StatusCreated, &ch)
}

// Inquire asks for the charge made with the reference (the operation id).
func (c *Client) Inquire(ctx context.Context, reference string) (Charge, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/charges?reference="+url.QueryEscape(reference), nil)
	if err != nil {
		return Charge{}, err
	}
	var ch Charge
	return ch, c.do(req, http.StatusOK, &ch)
}

func (c *Client) do(req *http.Request, want int, out *Charge) error {
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrAmbiguous, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%w: reading answer: %v", ErrAmbiguous, err)
	}
	switch {
	case resp.StatusCode == want:
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("%w: undecodable answer %s: %v", ErrAmbiguous, excerpt(body), err)
		}
		if out.Status != StatusSucceeded && out.Status != StatusDeclined {
			return fmt.Errorf("%w: charge with unknown status in %s", ErrAmbiguous, excerpt(body))
		}
		return nil
	case resp.StatusCode == http.StatusNotFound && req.Method == http.MethodGet:
		return ErrNotFound
	case resp.StatusCode == http.StatusNotImplemented && req.Method == http.MethodGet:
		return ErrInquiryUnsupported
	default:
		return fmt.Errorf("%w: %s: %s", ErrAmbiguous, resp.Status, excerpt(body))
	}
}

// excerpt quotes the start of a provider's answer for an error message.
func excerpt(body []byte) string {
	b := bytes.TrimSpace(body)
	if len(b) > maxErrorBody {
		return fmt.Sprintf("%q (%d bytes)", b[:maxErrorBody], len(b))
	}
	return fmt.Sprintf("%q", b)
}
