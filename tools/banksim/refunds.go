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
	take := func(status, cur string, amount int64, booked bool) {
		if status == statusSucceeded && cur == currency && booked {
			left += amount
			charged = true
		}
	}
	for _, i := range s.charges.byRef[ref] {
		c := s.charges.records[i]
		take(c.Status, c.Currency, c.AmountMinor, c.bookedBy(now))
	}
	for _, i := range s.captures.byRef[ref] {
		c := s.captures.records[i]
		take(c.Status, c.Currency, c.AmountMinor, c.bookedBy(now))
	}
	for _, i := range s.refunds.byLink[ref] {
		r := s.refunds.records[i]
		if r.Status == statusSucceeded && r.Currency == currency {
			left -= r.AmountMinor
		}
	}
	return left, charged
}

// doRefund decides and records a refund: parallel refunds of one charge never return more
// than it charged.
func (s *Sim) doRefund(key string, req refundRequest, decline bool, late time.Duration) (refundRecord, error) {
	return enter(s, onRefund, &s.refunds.book, s.refunds.index, key, func(prev refundRecord) bool {
		return prev.Reference == req.Reference && prev.ChargeReference == req.ChargeReference &&
			prev.AmountMinor == req.AmountMinor && prev.Currency == req.Currency
	}, func(now time.Time) (refundRecord, error) {
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
		return rec, nil
	})
}

// lookupRefund returns the latest booked refund for ref, preferring a succeeded one.
func (s *Sim) lookupRefund(ref string) (refund, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.refunds.latest(ref, s.now())
	return rec.refund, ok
}

func (s *Sim) postRefund(w http.ResponseWriter, r *http.Request) {
	post(s, w, r, onRefund, func(key string, req refundRequest, decline bool, late time.Duration) (any, error) {
		rec, err := s.doRefund(key, req, decline, late)
		return rec.refund, err
	})
}

// getRefund is the refund inquiry; the `inquiry` fault rules apply to it as to a charge's.
func (s *Sim) getRefund(w http.ResponseWriter, r *http.Request) {
	s.inquire(w, r, func(ref string) (any, bool) { return s.lookupRefund(ref) })
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
