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
	declineNoCharge   = "no_such_charge"  // nothing charged or captured for charge_reference in the currency
	declineOverRefund = "exceeds_charged" // more than is left of what was charged
)

// refund is the provider API's view of a refund: the request and what the bank made of it.
type refund struct {
	ID string `json:"id"`
	refundRequest
	Status        string    `json:"status"`
	DeclineReason string    `json:"decline_reason,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
}

// refundRecord is one line of the durable refund log, as record is for charges.
type refundRecord struct {
	refund
	IdempotencyKey string     `json:"idempotency_key"`
	ReceivedAt     *time.Time `json:"received_at,omitempty"` // set for a late booking only
}

func (r refundRecord) view(time.Time) any { return r.refund }

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

// refundable is what is left to refund of the money taken for ref in currency: what its charges
// and its authorizations' captures took (booked by now) less every succeeded refund, a pending
// late one included (its money will move). charged is false when nothing was taken in the
// currency. Callers hold mu.
func (s *Sim) refundable(ref, currency string, now time.Time) (left int64, charged bool) {
	take := func(m meta, cur string, amount int64) {
		if m.succeeded() && cur == currency && m.bookedBy(now) {
			left += amount
			charged = true
		}
	}
	for _, i := range s.charges.byRef[ref] {
		c := s.charges.records[i]
		take(c.meta(), c.Currency, c.AmountMinor)
	}
	for _, i := range s.captures.byRef[ref] {
		c := s.captures.records[i]
		take(c.meta(), c.Currency, c.AmountMinor)
	}
	for _, i := range s.refunds.byLink[ref] {
		if r := s.refunds.records[i]; r.Status == statusSucceeded && r.Currency == currency {
			left -= r.AmountMinor
		}
	}
	return left, charged
}

// postRefund decides and records a refund: parallel refunds of one charge never return more
// than it charged.
func (s *Sim) postRefund(w http.ResponseWriter, r *http.Request) {
	post(s, w, r, onRefund, &s.refunds, func(req refundRequest, prev refundRecord) bool {
		return req == prev.refundRequest
	}, func(req refundRequest, a arrival) (refundRecord, error) {
		status, reason := statusSucceeded, ""
		left, charged := s.refundable(req.ChargeReference, req.Currency, a.now)
		switch {
		case a.declined:
			status, reason = statusDeclined, declineFault
		case !charged:
			status, reason = statusDeclined, declineNoCharge
		case req.AmountMinor > left:
			status, reason = statusDeclined, declineOverRefund
		}
		return refundRecord{
			refund: refund{
				ID:            "rf_" + uuid.Must(uuid.NewV7()).String(),
				refundRequest: req,
				Status:        status,
				DeclineReason: reason,
				CreatedAt:     a.CreatedAt,
			},
			IdempotencyKey: a.IdempotencyKey,
			ReceivedAt:     a.ReceivedAt,
		}, nil
	}, refundRecord.view)
}

func (s *Sim) simRefunds(w http.ResponseWriter, r *http.Request) {
	var out struct {
		Count   int            `json:"count"` // times money moved back for this reference
		Refunds []refundRecord `json:"refunds"`
		Pending int            `json:"pending"` // late bookings whose time has not come
	}
	s.mu.Lock()
	out.Refunds, out.Count, out.Pending = s.refunds.tally(r.URL.Query().Get("reference"), s.now())
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}
