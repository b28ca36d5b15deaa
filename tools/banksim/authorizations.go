package banksim

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Where an authorization is now (its state): read from the captures and voids that name it.
const (
	stateAuthorized = "authorized"
	stateCaptured   = "captured"
	stateVoided     = "voided"
	stateDeclined   = "declined"
	stateExpired    = "expired" // neither captured nor voided within the bank's authorization TTL
)

var errNoAuthorization = errors.New("no such authorization")

// authorization is the provider API's view of an authorization. Status answers the authorize
// call (succeeded: the hold was placed); State and CapturedMinor say where it is now.
type authorization struct {
	ID            string `json:"id"`
	Reference     string `json:"reference"`
	AmountMinor   int64  `json:"amount_minor"`
	Currency      string `json:"currency"`
	Status        string `json:"status"`
	State         string `json:"state"`
	CapturedMinor int64  `json:"captured_minor"`
}

// capture is the provider API's view of a capture; Reference is its authorization's.
type capture struct {
	ID              string `json:"id"`
	AuthorizationID string `json:"authorization_id"`
	Reference       string `json:"reference"`
	AmountMinor     int64  `json:"amount_minor"`
	Status          string `json:"status"`
}

// void is the provider API's view of a void; Reference is its authorization's.
type void struct {
	ID              string `json:"id"`
	AuthorizationID string `json:"authorization_id"`
	Reference       string `json:"reference"`
	Status          string `json:"status"`
}

// booking is what the bank keeps of an authorization, capture or void beside its view: the key
// it came with and when it books (ReceivedAt: when a late booking arrived).
type booking struct {
	CreatedAt      time.Time  `json:"created_at"`
	IdempotencyKey string     `json:"idempotency_key"`
	ReceivedAt     *time.Time `json:"received_at,omitempty"`
}

func newBooking(key string, now time.Time, late time.Duration) booking {
	b := booking{CreatedAt: now.Add(late), IdempotencyKey: key}
	if late > 0 {
		b.ReceivedAt = &now
	}
	return b
}

func (b booking) key() string                 { return b.IdempotencyKey }
func (b booking) bookedBy(now time.Time) bool { return !b.CreatedAt.After(now) }

// authRecord is one line of the authorization log. Its State and CapturedMinor are those it
// was made with; every read fills in the current ones (see current).
type authRecord struct {
	authorization
	AccountID string `json:"account_id"`
	booking
}

// captureRecord is one line of the capture log; Currency is the authorization's, for the
// settlement file and refunds.
type captureRecord struct {
	capture
	Currency string `json:"currency"`
	booking
}

type voidRecord struct {
	void
	booking
}

func (r authRecord) ref() string        { return r.Reference }
func (r authRecord) succeeded() bool    { return r.Status == statusSucceeded }
func (r captureRecord) ref() string     { return r.Reference }
func (r captureRecord) succeeded() bool { return r.Status == statusSucceeded }
func (r captureRecord) link() string    { return r.AuthorizationID }
func (r voidRecord) ref() string        { return r.Reference }
func (r voidRecord) succeeded() bool    { return r.Status == statusSucceeded }
func (r voidRecord) link() string       { return r.AuthorizationID }

// authorizationBook is the bank's record of authorizations, found by id too. Guarded by mu.
type authorizationBook struct {
	book[authRecord]
	byID map[string]int
}

func (b *authorizationBook) index(r authRecord) {
	b.book.index(r)
	b.byID[r.ID] = len(b.records) - 1
}

// find returns the authorization id names if it has booked by now.
func (b *authorizationBook) find(id string, now time.Time) (authRecord, bool) {
	i, ok := b.byID[id]
	if !ok || !b.records[i].bookedBy(now) {
		return authRecord{}, false
	}
	return b.records[i], true
}

// current is a with its state at now, from the succeeded captures and voids booked by then;
// with pending, also from those still to book (their money will move: decisions count them).
// Callers hold mu.
func (s *Sim) current(a authRecord, now time.Time, pending bool) authRecord {
	a.State, a.CapturedMinor = stateAuthorized, 0
	if !a.succeeded() {
		a.State = stateDeclined
		return a
	}
	for _, i := range s.captures.byLink[a.ID] {
		if c := s.captures.records[i]; c.succeeded() && (pending || c.bookedBy(now)) {
			a.State, a.CapturedMinor = stateCaptured, c.AmountMinor
		}
	}
	for _, i := range s.voids.byLink[a.ID] {
		if v := s.voids.records[i]; v.succeeded() && (pending || v.bookedBy(now)) {
			a.State = stateVoided
		}
	}
	if a.State == stateAuthorized && !now.Before(a.CreatedAt.Add(s.authTTL)) {
		a.State = stateExpired
	}
	return a
}

// view is the provider API's answer for an authorization: its state now.
func (s *Sim) view(a authRecord) authorization {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current(a, s.now(), false).authorization
}

func (s *Sim) doAuthorize(key string, req chargeRequest, decline bool, late time.Duration) (authRecord, error) {
	return enter(s, onAuthorize, &s.authorizations.book, s.authorizations.index, key, func(prev authRecord) bool {
		return prev.Reference == req.Reference && prev.AmountMinor == req.AmountMinor &&
			prev.Currency == req.Currency && prev.AccountID == req.AccountID
	}, func(now time.Time) (authRecord, error) {
		a := authRecord{
			authorization: authorization{
				ID:          "au_" + uuid.Must(uuid.NewV7()).String(),
				Reference:   req.Reference,
				AmountMinor: req.AmountMinor,
				Currency:    req.Currency,
				Status:      statusOf(decline),
			},
			AccountID: req.AccountID,
			booking:   newBooking(key, now, late),
		}
		return s.current(a, now, true), nil
	})
}

// captureRequest needs no validation: an amount the authorization cannot give is declined.
type captureRequest struct {
	AmountMinor int64 `json:"amount_minor"`
}

func (captureRequest) validate() error { return nil }

type voidRequest struct{}

func (voidRequest) validate() error { return nil }

// doCapture takes amount from the authorization id names, once: it must still hold the money
// (a pending late capture or void already took it), and the amount must fit in it.
func (s *Sim) doCapture(key, id string, req captureRequest, decline bool, late time.Duration) (captureRecord, error) {
	return enter(s, onCapture, &s.captures.book, s.captures.index, key, func(prev captureRecord) bool {
		return prev.AuthorizationID == id && prev.AmountMinor == req.AmountMinor
	}, func(now time.Time) (captureRecord, error) {
		a, ok := s.authorizations.find(id, now)
		if !ok {
			return captureRecord{}, errNoAuthorization
		}
		fits := req.AmountMinor > 0 && req.AmountMinor <= a.AmountMinor
		return captureRecord{
			capture: capture{
				ID:              "cp_" + uuid.Must(uuid.NewV7()).String(),
				AuthorizationID: a.ID,
				Reference:       a.Reference,
				AmountMinor:     req.AmountMinor,
				Status:          statusOf(decline || !fits || s.current(a, now, true).State != stateAuthorized),
			},
			Currency: a.Currency,
			booking:  newBooking(key, now, late),
		}, nil
	})
}

// doVoid releases the hold of the authorization id names. Voiding a voided one succeeds again:
// the hold is released either way.
func (s *Sim) doVoid(key, id string, decline bool, late time.Duration) (voidRecord, error) {
	return enter(s, onVoid, &s.voids.book, s.voids.index, key, func(prev voidRecord) bool {
		return prev.AuthorizationID == id
	}, func(now time.Time) (voidRecord, error) {
		a, ok := s.authorizations.find(id, now)
		if !ok {
			return voidRecord{}, errNoAuthorization
		}
		state := s.current(a, now, true).State
		return voidRecord{
			void: void{
				ID:              "vd_" + uuid.Must(uuid.NewV7()).String(),
				AuthorizationID: a.ID,
				Reference:       a.Reference,
				// Voiding what is already let go (voided, expired) succeeds: the hold is gone.
				Status: statusOf(decline || (state != stateAuthorized && state != stateVoided && state != stateExpired)),
			},
			booking: newBooking(key, now, late),
		}, nil
	})
}

func (s *Sim) postAuthorization(w http.ResponseWriter, r *http.Request) {
	post(s, w, r, onAuthorize, func(key string, req chargeRequest, decline bool, late time.Duration) (any, error) {
		rec, err := s.doAuthorize(key, req, decline, late)
		if err != nil {
			return nil, err
		}
		return s.view(rec), nil
	})
}

func (s *Sim) postCapture(w http.ResponseWriter, r *http.Request) {
	post(s, w, r, onCapture, func(key string, req captureRequest, decline bool, late time.Duration) (any, error) {
		rec, err := s.doCapture(key, r.PathValue("id"), req, decline, late)
		return rec.capture, err
	})
}

func (s *Sim) postVoid(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 { // a void needs no body
		r.Body = io.NopCloser(strings.NewReader("{}"))
	}
	post(s, w, r, onVoid, func(key string, _ voidRequest, decline bool, late time.Duration) (any, error) {
		rec, err := s.doVoid(key, r.PathValue("id"), decline, late)
		return rec.void, err
	})
}

// getAuthorization is the authorization inquiry: the latest booked for the reference,
// preferring one that placed its hold, in its state now.
func (s *Sim) getAuthorization(w http.ResponseWriter, r *http.Request) {
	s.inquire(w, r, func(ref string) (any, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		now := s.now()
		rec, ok := s.authorizations.latest(ref, now)
		return s.current(rec, now, false).authorization, ok
	})
}

func (s *Sim) simAuthorizations(w http.ResponseWriter, r *http.Request) {
	var out struct {
		Count          int          `json:"count"`          // authorizations made (holds placed)
		CapturedMinor  int64        `json:"captured_minor"` // money their captures moved
		Voided         bool         `json:"voided"`         // one of them was voided
		Authorizations []authRecord `json:"authorizations"`
		Pending        int          `json:"pending"` // late bookings whose time has not come
	}
	s.mu.Lock()
	now := s.now()
	out.Authorizations, out.Count, out.Pending = s.authorizations.tally(r.URL.Query().Get("reference"), now)
	for i, a := range out.Authorizations {
		a = s.current(a, now, false)
		out.Authorizations[i] = a
		out.CapturedMinor += a.CapturedMinor
		out.Voided = out.Voided || a.State == stateVoided
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}
