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

func (r captureRecord) view(time.Time) any { return r.capture }
func (r voidRecord) view(time.Time) any    { return r.void }

// viewAuthorization is the provider API's answer for an authorization: its state at now.
// Callers hold mu.
func (s *Sim) viewAuthorization(a authRecord, now time.Time) any {
	return s.current(a, now, false).authorization
}

// holding returns the authorization id names if it has booked by now, in the state a capture or
// void must decide on (see current, with pending). Callers hold mu.
func (s *Sim) holding(id string, now time.Time) (authRecord, error) {
	for _, i := range s.authorizations.byLink[id] { // one at most: it is linked by its own id
		if a := s.authorizations.records[i]; a.meta().bookedBy(now) {
			return s.current(a, now, true), nil
		}
	}
	return authRecord{}, errNoAuthorization
}

// current is a with its state at now, from the succeeded captures and voids booked by then;
// with pending, also from those still to book (their money will move: decisions count them).
// Callers hold mu.
func (s *Sim) current(a authRecord, now time.Time, pending bool) authRecord {
	a.State, a.CapturedMinor = stateAuthorized, 0
	if a.Status != statusSucceeded {
		a.State = stateDeclined
		return a
	}
	for _, i := range s.captures.byLink[a.ID] {
		if c := s.captures.records[i]; c.meta().succeeded() && (pending || c.meta().bookedBy(now)) {
			a.State, a.CapturedMinor = stateCaptured, c.AmountMinor
		}
	}
	for _, i := range s.voids.byLink[a.ID] {
		if m := s.voids.records[i].meta(); m.succeeded() && (pending || m.bookedBy(now)) {
			a.State = stateVoided
		}
	}
	if a.State == stateAuthorized && !now.Before(a.CreatedAt.Add(authorizationTTL)) {
		a.State = stateExpired
	}
	return a
}

// captureRequest needs no validation: an amount the authorization cannot give is declined.
type captureRequest struct {
	AmountMinor int64 `json:"amount_minor"`
}

type voidRequest struct{}

func (s *Sim) postAuthorization(w http.ResponseWriter, r *http.Request) {
	post(s, w, r, onAuthorize, &s.authorizations, func(req chargeRequest, prev authRecord) bool {
		return req == chargeRequest{prev.Reference, prev.AmountMinor, prev.Currency, prev.AccountID}
	}, func(req chargeRequest, a arrival) (authRecord, error) {
		return s.current(authRecord{
			authorization: authorization{
				ID:          "au_" + uuid.Must(uuid.NewV7()).String(),
				Reference:   req.Reference,
				AmountMinor: req.AmountMinor,
				Currency:    req.Currency,
				Status:      statusOf(a.declined),
			},
			AccountID: req.AccountID,
			booking:   a.booking,
		}, a.now, true), nil
	}, s.viewAuthorization)
}

// postCapture takes amount from the authorization id names, once: it must still hold the money
// (a pending late capture or void already took it), and the amount must fit in it.
func (s *Sim) postCapture(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	post(s, w, r, onCapture, &s.captures, func(req captureRequest, prev captureRecord) bool {
		return prev.AuthorizationID == id && prev.AmountMinor == req.AmountMinor
	}, func(req captureRequest, at arrival) (captureRecord, error) {
		a, err := s.holding(id, at.now)
		if err != nil {
			return captureRecord{}, err
		}
		fits := req.AmountMinor > 0 && req.AmountMinor <= a.AmountMinor
		return captureRecord{
			capture: capture{
				ID:              "cp_" + uuid.Must(uuid.NewV7()).String(),
				AuthorizationID: a.ID,
				Reference:       a.Reference,
				AmountMinor:     req.AmountMinor,
				Status:          statusOf(at.declined || !fits || a.State != stateAuthorized),
			},
			Currency: a.Currency,
			booking:  at.booking,
		}, nil
	}, captureRecord.view)
}

// postVoid releases the hold of the authorization id names. Voiding what is already let go
// (voided, expired) succeeds again: the hold is gone either way.
func (s *Sim) postVoid(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 { // a void needs no body
		r.Body = io.NopCloser(strings.NewReader("{}"))
	}
	id := r.PathValue("id")
	post(s, w, r, onVoid, &s.voids, func(_ voidRequest, prev voidRecord) bool {
		return prev.AuthorizationID == id
	}, func(_ voidRequest, at arrival) (voidRecord, error) {
		a, err := s.holding(id, at.now)
		if err != nil {
			return voidRecord{}, err
		}
		return voidRecord{
			void: void{
				ID:              "vd_" + uuid.Must(uuid.NewV7()).String(),
				AuthorizationID: a.ID,
				Reference:       a.Reference,
				Status:          statusOf(at.declined || a.State == stateCaptured || a.State == stateDeclined),
			},
			booking: at.booking,
		}, nil
	}, voidRecord.view)
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
