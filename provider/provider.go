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
	"strings"
	"time"
	"unicode"
)

// Errors classify every answer, to a charge, refund, authorization, capture or void: only a
// definite one may decide an operation. A decline is not an error: it is a Charge (Refund, ...)
// whose Status is "declined".
var (
	// ErrAmbiguous: the charge may or may not have happened. Every answer but a charge with a
	// known status is this, 4xx included: a real provider answers 409 "in progress" or 429 while
	// the money may still move.
	ErrAmbiguous = errors.New("provider outcome unknown")
	// ErrNotFound: an inquiry found no charge (or refund) for the reference.
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

// Charge is the provider's record of a charge. The amount and currency are what the provider
// says it moved, when it says (zero when it does not; an answer naming zero is ambiguous).
type Charge struct {
	ID          string `json:"id"`
	Reference   string `json:"reference"`
	Status      string `json:"status"` // "succeeded" or "declined"
	AmountMinor int64  `json:"amount_minor,omitempty"`
	Currency    string `json:"currency,omitempty"`
}

// Charge statuses; any other is an answer kasa cannot read.
const (
	StatusSucceeded = "succeeded"
	StatusDeclined  = "declined"
)

// Succeeded reports whether money moved.
func (c Charge) Succeeded() bool { return c.Status == StatusSucceeded }

func (c Charge) status() string         { return c.Status }
func (c Charge) about() string          { return c.Reference }
func (c Charge) money() (int64, string) { return c.AmountMinor, c.Currency }

// RefundRequest asks the provider to pay back (part of) a charge. ChargeReference is the
// charge's reference (the payment id); Reference is the refund's operation id.
type RefundRequest struct {
	Reference       string `json:"reference"`
	ChargeReference string `json:"charge_reference"`
	AmountMinor     int64  `json:"amount_minor"`
	Currency        string `json:"currency"`
}

// Refund is the provider's record of a refund; the amount and currency as for a Charge.
type Refund struct {
	ID          string `json:"id"`
	Reference   string `json:"reference"`
	Status      string `json:"status"` // "succeeded" or "declined"
	AmountMinor int64  `json:"amount_minor,omitempty"`
	Currency    string `json:"currency,omitempty"`
}

// Succeeded reports whether money moved back.
func (r Refund) Succeeded() bool { return r.Status == StatusSucceeded }

func (r Refund) status() string         { return r.Status }
func (r Refund) about() string          { return r.Reference }
func (r Refund) money() (int64, string) { return r.AmountMinor, r.Currency }

// Authorization is the provider's record of a hold. Status answers the authorize call
// (succeeded: the money is held); State is where it is now, one of the State constants.
type Authorization struct {
	ID            string `json:"id"`
	Reference     string `json:"reference"`
	AmountMinor   int64  `json:"amount_minor"`
	Currency      string `json:"currency"`
	Status        string `json:"status"`
	State         string `json:"state"`
	CapturedMinor int64  `json:"captured_minor"`
}

// An authorization's states.
const (
	StateAuthorized = "authorized"
	StateCaptured   = "captured"
	StateVoided     = "voided"
	StateDeclined   = "declined"
	StateExpired    = "expired" // the bank let the hold go itself
)

// Succeeded reports whether the money was held.
func (a Authorization) Succeeded() bool { return a.Status == StatusSucceeded }

func (a Authorization) status() string         { return a.Status }
func (a Authorization) about() string          { return a.Reference }
func (a Authorization) money() (int64, string) { return a.AmountMinor, a.Currency }

// CaptureResult is the provider's answer to a capture; Reference is the authorization's.
type CaptureResult struct {
	ID              string `json:"id"`
	AuthorizationID string `json:"authorization_id"`
	Reference       string `json:"reference"`
	AmountMinor     int64  `json:"amount_minor"`
	Status          string `json:"status"`
}

// Succeeded reports whether the money moved (and the rest of the hold was released).
func (r CaptureResult) Succeeded() bool { return r.Status == StatusSucceeded }

func (r CaptureResult) status() string         { return r.Status }
func (r CaptureResult) about() string          { return r.AuthorizationID }
func (r CaptureResult) money() (int64, string) { return r.AmountMinor, "" }

// VoidResult is the provider's answer to a void; Reference is the authorization's.
type VoidResult struct {
	ID              string `json:"id"`
	AuthorizationID string `json:"authorization_id"`
	Reference       string `json:"reference"`
	Status          string `json:"status"`
}

// Succeeded reports whether the hold is released.
func (r VoidResult) Succeeded() bool { return r.Status == StatusSucceeded }

func (r VoidResult) status() string         { return r.Status }
func (r VoidResult) about() string          { return r.AuthorizationID }
func (r VoidResult) money() (int64, string) { return 0, "" }

// answer is what a definite provider answer decodes into: its status, what it is about (the
// reference of a charge, refund or authorization; the authorization of a capture or void), and
// the money it names (zero and empty when it names none). An answer about something else than
// what was asked, or naming other money, is no answer: ambiguous.
type answer interface {
	status() string
	about() string
	money() (amountMinor int64, currency string)
}

// asked is what a call asks about: the reference (or authorization), and the money when it
// moves some (zero and empty for an inquiry, which names none).
type asked struct {
	about       string
	amountMinor int64
	currency    string
}

// maxErrorBody bounds how much of a provider's answer reaches an error, and through it the
// workflow history and the logs: a misbehaving provider must not fill either.
const maxErrorBody = 200

// maxAnswer bounds how much of a provider's answer is read; a longer one is not read at all.
const maxAnswer = 1 << 20

// Client talks HTTP to the provider.
type Client struct {
	base string
	http *http.Client
}

// New returns a client; timeout bounds each call. A redirect is not followed: it is no answer
// from the bank, and what another address says (a 404 read as "no such charge", a POST turned
// into a GET) must never decide an operation. It is ambiguous, as any other unexpected status.
func New(baseURL string, timeout time.Duration) *Client {
	return &Client{base: baseURL, http: &http.Client{Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Charge sends a charge with the operation id as its idempotency key.
func (c *Client) Charge(ctx context.Context, idempotencyKey string, r ChargeRequest) (Charge, error) {
	return post[Charge](ctx, c, "/v1/charges", idempotencyKey, r, asked{r.Reference, r.AmountMinor, r.Currency})
}

// Inquire asks for the charge made with the reference (the operation id).
func (c *Client) Inquire(ctx context.Context, reference string) (Charge, error) {
	return get[Charge](ctx, c, "/v1/charges", reference)
}

// Refund sends a refund with the refund's operation id as its idempotency key.
func (c *Client) Refund(ctx context.Context, idempotencyKey string, r RefundRequest) (Refund, error) {
	return post[Refund](ctx, c, "/v1/refunds", idempotencyKey, r, asked{r.Reference, r.AmountMinor, r.Currency})
}

// InquireRefund asks for the refund made with the reference (the refund's operation id).
func (c *Client) InquireRefund(ctx context.Context, reference string) (Refund, error) {
	return get[Refund](ctx, c, "/v1/refunds", reference)
}

// Authorize holds money with the payment's operation id as its idempotency key; r is a
// charge's request.
func (c *Client) Authorize(ctx context.Context, idempotencyKey string, r ChargeRequest) (Authorization, error) {
	return post[Authorization](ctx, c, "/v1/authorizations", idempotencyKey, r, asked{r.Reference, r.AmountMinor, r.Currency})
}

// InquireAuthorization asks for the authorization made with the reference (the operation id),
// in its state now.
func (c *Client) InquireAuthorization(ctx context.Context, reference string) (Authorization, error) {
	return get[Authorization](ctx, c, "/v1/authorizations", reference)
}

// Capture takes amountMinor of the authorization; the provider releases the rest of the hold.
func (c *Client) Capture(ctx context.Context, idempotencyKey, authorizationID string, amountMinor int64) (CaptureResult, error) {
	body := struct {
		AmountMinor int64 `json:"amount_minor"`
	}{amountMinor}
	return post[CaptureResult](ctx, c, authorizationPath(authorizationID, "capture"), idempotencyKey, body, asked{authorizationID, amountMinor, ""})
}

// Void releases the authorization's hold.
func (c *Client) Void(ctx context.Context, idempotencyKey, authorizationID string) (VoidResult, error) {
	return post[VoidResult](ctx, c, authorizationPath(authorizationID, "void"), idempotencyKey, struct{}{}, asked{about: authorizationID})
}

// authorizationPath is the path of an action on an authorization; the id comes from the
// provider, so it is escaped rather than trusted to be one path segment.
func authorizationPath(id, action string) string {
	return "/v1/authorizations/" + url.PathEscape(id) + "/" + action
}

func post[T answer](ctx context.Context, c *Client, path, idempotencyKey string, in any, want asked) (T, error) {
	var out T
	body, err := json.Marshal(in)
	if err != nil {
		return out, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return out, err
	}
	// Without GetBody, net/http cannot silently re-send the POST on a fresh connection when a
	// kept-alive one dies mid-request: that re-send would be a second charge at a provider
	// without idempotency, and would hide an ambiguous outcome behind a normal 201.
	req.GetBody = nil
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idempotencyKey)
	err = c.do(req, http.StatusCreated, &out)
	return out, checkAbout(out, err, want)
}

func get[T answer](ctx context.Context, c *Client, path, reference string) (T, error) {
	var out T
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path+"?reference="+url.QueryEscape(reference), nil)
	if err != nil {
		return out, err
	}
	err = c.do(req, http.StatusOK, &out)
	return out, checkAbout(out, err, asked{about: reference})
}

// do sends req and decodes a definite answer into out (a pointer to an answer).
func (c *Client) do(req *http.Request, want int, out any) error {
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrAmbiguous, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return fmt.Errorf("%w: reading answer: %v", ErrAmbiguous, err)
	}
	if len(body) > maxAnswer { // a part of an answer is not the answer: its rest may undo it
		return fmt.Errorf("%w: %s: an answer longer than %d bytes: %s", ErrAmbiguous, resp.Status, maxAnswer, excerpt(body[:maxErrorBody]))
	}
	switch {
	case resp.StatusCode == want:
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("%w: undecodable answer %s: %v", ErrAmbiguous, excerpt(body), err)
		}
		if err := oneAnswer(body); err != nil {
			return fmt.Errorf("%w: %v in %s", ErrAmbiguous, err, excerpt(body))
		}
		if st := out.(answer).status(); st != StatusSucceeded && st != StatusDeclined {
			return fmt.Errorf("%w: answer with unknown status in %s", ErrAmbiguous, excerpt(body))
		}
		return nil
	case resp.StatusCode == http.StatusNotFound && req.Method == http.MethodGet:
		// A 404 whose body is a record with a known status contradicts itself: no "not found"
		// that would let the operation be sent again.
		var rec struct {
			Status string `json:"status"`
		}
		if json.Unmarshal(body, &rec) == nil && (rec.Status == StatusSucceeded || rec.Status == StatusDeclined) {
			return fmt.Errorf("%w: %s with a record in it: %s", ErrAmbiguous, resp.Status, excerpt(body))
		}
		return ErrNotFound
	case resp.StatusCode == http.StatusNotImplemented && req.Method == http.MethodGet:
		return ErrInquiryUnsupported
	default:
		return fmt.Errorf("%w: %s: %s", ErrAmbiguous, resp.Status, excerpt(body))
	}
}

// oneAnswer refuses an object that names a field twice with different values, and one whose
// fields kasa takes but cannot act on. encoding/json keeps the last of two values, matching names
// case-insensitively, so a "declined" could be read over a "succeeded" (or the reverse) the same
// answer gives. An amount of zero is refused because one not named is zero too, which CheckMoney
// reads as the money asked; an id longer than maxID could never match a settlement file's.
func oneAnswer(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return err // not an object: Unmarshal said what it is
	}
	seen := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		name := foldName(t.(string))
		if prev, ok := seen[name]; ok && !bytes.Equal(prev, v) {
			return fmt.Errorf("the field %.40q twice, with different values", t)
		}
		seen[name] = v
		var amount int64
		var id string
		switch {
		case name == foldName("amount_minor") && string(v) != "null" && json.Unmarshal(v, &amount) == nil && amount == 0:
			return errors.New("an answer naming an amount of zero")
		case name == foldName("id") && json.Unmarshal(v, &id) == nil && len(id) > maxID:
			return fmt.Errorf("an id longer than %d bytes", maxID)
		}
	}
	return nil
}

// maxID is the longest bank id kasa records, as a settlement file's provider_charge_id: the id
// becomes the operation's provider_reference, which reconciliation matches with the file's.
const maxID = 255

// foldName maps the names encoding/json takes for the same field to one string: the smallest
// rune of each one's case folding orbit (so "status", "Status" and "ſtatus" are one name).
func foldName(s string) string {
	return strings.Map(func(r rune) rune {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		return least
	}, s)
}

// checkAbout turns a definite answer about something else than want into an ambiguous one: a
// provider (or a proxy) that mixes up answers must never decide an operation, nor an answer that
// names other money than asked be posted as if the provider had moved what was asked.
func checkAbout(out answer, err error, want asked) error {
	if err != nil {
		return err
	}
	if out.about() != want.about {
		return fmt.Errorf("%w: the answer is about %s, not %q", ErrAmbiguous, excerpt([]byte(out.about())), want.about)
	}
	amount, currency := out.money()
	return CheckMoney(amount, currency, want.amountMinor, want.currency)
}

// CheckMoney says whether an answer naming amountMinor and currency (zero and empty: it names
// none) can be about an operation of wantMinor and wantCurrency (zero and empty: not known):
// ErrAmbiguous when it names other money. An inquiry names only a reference: its caller, who
// knows the operation, checks the answer with it.
func CheckMoney(amountMinor int64, currency string, wantMinor int64, wantCurrency string) error {
	switch {
	case wantMinor != 0 && amountMinor != 0 && amountMinor != wantMinor:
		return fmt.Errorf("%w: the answer names %d (minor units), not the %d asked", ErrAmbiguous, amountMinor, wantMinor)
	case wantCurrency != "" && currency != "" && currency != wantCurrency:
		return fmt.Errorf("%w: the answer names the currency %s, not the %s asked", ErrAmbiguous, excerpt([]byte(currency)), wantCurrency)
	}
	return nil
}

// excerpt quotes the start of a provider's answer for an error message.
func excerpt(body []byte) string {
	b := bytes.TrimSpace(body)
	if len(b) > maxErrorBody {
		return fmt.Sprintf("%q (%d bytes)", b[:maxErrorBody], len(b))
	}
	return fmt.Sprintf("%q", b)
}
