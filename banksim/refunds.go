package banksim

import (
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"
)

// Why the bank declined a refund (kept in its record, for whoever reads /_sim/refunds).
const (
	declineFault      = "fault"           // a decline rule said so
	declineNoCharge   = "no_such_charge"  // no succeeded charge for charge_reference in the currency
	declineOverRefund = "exceeds_charged" // more than is left of what was charged
)

// refund is the provider API's view of a refund.
type refund struct {
	ID              string    `json:"id"`
	Reference       string    `json:"reference"`
	ChargeReference string    `json:"charge_reference"`
	AmountMinor     int64     `json:"amount_minor"`
	Currency        string    `json:"currency"`
	Status          string    `json:"status"`
	DeclineReason   string    `json:"decline_reason,omitempty"`
	CreatedAt       time.Time `json:"created_at"`
}

// refundRecord is one line of the durable refund log, as record is for charges.
type refundRecord struct {
	refund
	IdempotencyKey string     `json:"idempotency_key"`
	ReceivedAt     *time.Time `json:"received_at,omitempty"` // set for a late booking only
}

func (r refundRecord) bookedBy(now time.Time) bool { return !r.CreatedAt.After(now) }

// refundBook is the bank's record of refunds, in its own log. Guarded by the Sim's mu.
type refundBook struct {
	log      *journal
	records  []refundRecord
	byKey    map[string]int   // first record per idempotency key
	byRef    map[string][]int // all records per reference, in log order
	byCharge map[string][]int // all records per charge reference, in log order
}

func newRefundBook() refundBook {
	return refundBook{byKey: map[string]int{}, byRef: map[string][]int{}, byCharge: map[string][]int{}}
}

func (b *refundBook) index(rec refundRecord) {
	i := len(b.records)
	b.records = append(b.records, rec)
	if _, ok := b.byKey[rec.IdempotencyKey]; !ok {
		b.byKey[rec.IdempotencyKey] = i
	}
	b.byRef[rec.Reference] = append(b.byRef[rec.Reference], i)
	b.byCharge[rec.ChargeReference] = append(b.byCharge[rec.ChargeReference], i)
}

type refundRequest struct {
	Reference       string `json:"reference"`
	ChargeReference string `json:"charge_reference"`
	AmountMinor     int64  `json:"amount_minor"`
	Currency        string `json:"currency"`
}

func (r refundRequest) validate() error {
	switch {
	case r.Reference == "":
		return errors.New("reference is required")
	case r.ChargeReference == "":
		return errors.New("charge_reference is required")
	case r.AmountMinor <= 0:
		return errors.New("amount_minor must be > 0")
	case !isCurrencyCode(r.Currency):
		return errors.New("currency must be an ISO 4217 code such as TRY")
	}
	return nil
}

// refundable is what is left to refund of the charges made for ref in currency: what they
// charged (booked by now) less every succeeded refund, a pending late one included (its money
// will move). charged is false when no succeeded charge in the currency exists. Callers hold mu.
func (s *Sim) refundable(ref, currency string, now time.Time) (left int64, charged bool) {
	for _, i := range s.byRef[ref] {
		c := s.records[i]
		if c.Status == statusSucceeded && c.Currency == currency && c.bookedBy(now) {
			left += c.AmountMinor
			charged = true
		}
	}
	for _, i := range s.refunds.byCharge[ref] {
		r := s.refunds.records[i]
		if r.Status == statusSucceeded && r.Currency == currency {
			left -= r.AmountMinor
		}
	}
	return left, charged
}

// doRefund decides and records a refund as doCharge does a charge: under the lock, so parallel
// refunds of one charge never return more than it charged.
func (s *Sim) doRefund(key string, req refundRequest, decline bool, late time.Duration) (refundRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().UTC()
	if s.capability == CapabilityIdempotent {
		if i, ok := s.refunds.byKey[key]; ok {
			prev := s.refunds.records[i]
			if prev.Reference != req.Reference || prev.ChargeReference != req.ChargeReference ||
				prev.AmountMinor != req.AmountMinor || prev.Currency != req.Currency {
				return refundRecord{}, errKeyReuse
			}
			if !prev.bookedBy(now) {
				return refundRecord{}, errInProgress
			}
			return prev, nil
		}
	}
	status, reason := statusSucceeded, ""
	left, charged := s.refundable(req.ChargeReference, req.Currency, now)
	switch {
	case decline:
		status, reason = statusDeclined, declineFault
	case !charged:
		status, reason = statusDeclined, declineNoCharge
	case req.AmountMinor > left:
		status, reason = statusDeclined, declineOverRefund
	}
	rec := refundRecord{
		refund: refund{
			ID:              "rf_" + uuid.Must(uuid.NewV7()).String(),
			Reference:       req.Reference,
			ChargeReference: req.ChargeReference,
			AmountMinor:     req.AmountMinor,
			Currency:        req.Currency,
			Status:          status,
			DeclineReason:   reason,
			CreatedAt:       now.Add(late),
		},
		IdempotencyKey: key,
	}
	if late > 0 {
		rec.ReceivedAt = &now
	}
	if err := s.refunds.log.append(rec); err != nil {
		return refundRecord{}, err
	}
	s.refunds.index(rec)
	s.log.Info("banksim refund", "id", rec.ID, "reference", rec.Reference, "charge_reference", rec.ChargeReference,
		"amount_minor", rec.AmountMinor, "currency", rec.Currency, "status", rec.Status, "books_at", rec.CreatedAt)
	return rec, nil
}

// lookupRefund returns the latest booked refund for ref, preferring a succeeded one.
func (s *Sim) lookupRefund(ref string) (refund, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var found *refund
	for _, i := range s.refunds.byRef[ref] {
		rec := &s.refunds.records[i]
		if !rec.bookedBy(now) {
			continue
		}
		if found == nil || rec.Status == statusSucceeded || found.Status != statusSucceeded {
			found = &rec.refund
		}
	}
	if found == nil {
		return refund{}, false
	}
	return *found, true
}

func (s *Sim) postRefund(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		writeError(w, http.StatusBadRequest, "Idempotency-Key header is required")
		return
	}
	var req refundRequest
	if err := decodeStrict(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := req.validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	fault, done := s.applyFault(w, r, onRefund)
	if done {
		return
	}
	var late time.Duration
	if fault.Action == actLateBooking {
		late = fault.lateBy()
	}
	rec, err := s.doRefund(key, req, fault.Action == actDecline, late)
	switch {
	case errors.Is(err, errKeyReuse):
		writeError(w, http.StatusUnprocessableEntity, err.Error())
		return
	case errors.Is(err, errInProgress):
		writeError(w, http.StatusConflict, err.Error())
		return
	case err != nil:
		s.log.Error("banksim: recording refund", "err", err)
		writeError(w, http.StatusInternalServerError, "could not record refund")
		return
	}
	if answerFault(w, fault.Action, rec.refund) {
		return
	}
	writeJSON(w, http.StatusCreated, rec.refund)
}

// getRefund is the refund inquiry; the `inquiry` fault rules apply to it as to a charge's.
func (s *Sim) getRefund(w http.ResponseWriter, r *http.Request) {
	if s.capability == CapabilityNone {
		writeError(w, http.StatusNotImplemented, "inquiry not supported")
		return
	}
	ref := r.URL.Query().Get("reference")
	if ref == "" {
		writeError(w, http.StatusBadRequest, "reference is required")
		return
	}
	fault, done := s.applyFault(w, r, onInquiry)
	if done {
		return
	}
	status, body := http.StatusOK, any(nil)
	if rf, ok := s.lookupRefund(ref); ok {
		body = rf
	} else {
		status, body = http.StatusNotFound, map[string]string{"error": "not found"}
	}
	if !answerFault(w, fault.Action, body) {
		writeJSON(w, status, body)
	}
}

func (s *Sim) simRefunds(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("reference")
	out := struct {
		Count   int            `json:"count"` // times money moved back for this reference
		Refunds []refundRecord `json:"refunds"`
		Pending int            `json:"pending"` // late bookings whose time has not come
	}{Refunds: []refundRecord{}}
	s.mu.Lock()
	now := s.now()
	for _, rec := range s.refunds.records {
		if ref != "" && rec.Reference != ref {
			continue
		}
		if !rec.bookedBy(now) {
			out.Pending++
			continue
		}
		out.Refunds = append(out.Refunds, rec)
		if rec.Status == statusSucceeded {
			out.Count++
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}
