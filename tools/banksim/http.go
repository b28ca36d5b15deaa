package banksim

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
)

// Handler serves the provider API (/v1) and the control API (/_sim).
func (s *Sim) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", s.postCharge)
	mux.HandleFunc("GET /v1/charges", inquire(s, &s.charges, record.view))
	mux.HandleFunc("POST /v1/refunds", s.postRefund)
	mux.HandleFunc("GET /v1/refunds", inquire(s, &s.refunds, refundRecord.view))
	mux.HandleFunc("POST /v1/authorizations", s.postAuthorization)
	mux.HandleFunc("GET /v1/authorizations", inquire(s, &s.authorizations, s.viewAuthorization))
	mux.HandleFunc("POST /v1/authorizations/{id}/capture", s.postCapture)
	mux.HandleFunc("POST /v1/authorizations/{id}/void", s.postVoid)
	mux.HandleFunc("GET /v1/settlements/{file}", s.getSettlement)
	mux.HandleFunc("PUT /_sim/faults", s.putFaults)
	mux.HandleFunc("DELETE /_sim/faults", s.deleteFaults)
	mux.HandleFunc("GET /_sim/faults", s.getFaults)
	mux.HandleFunc("GET /_sim/charges", s.simCharges)
	mux.HandleFunc("GET /_sim/refunds", s.simRefunds)
	mux.HandleFunc("GET /_sim/authorizations", s.simAuthorizations)
	mux.HandleFunc("GET /_sim/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	return mux
}

type chargeRequest struct {
	Reference   string `json:"reference"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
	AccountID   string `json:"account_id"`
}

func (c chargeRequest) validate() error {
	switch {
	case c.Reference == "":
		return errors.New("reference is required")
	case c.AmountMinor <= 0:
		return errors.New("amount_minor must be > 0")
	case !isCurrencyCode(c.Currency):
		return errors.New("currency must be an ISO 4217 code such as TRY")
	case c.AccountID == "":
		return errors.New("account_id is required")
	}
	return nil
}

// isCurrencyCode accepts the upper-case codes kasa accepts: the current currencies of
// ISO 4217 List One, without funds and codes that have no minor unit.
func isCurrencyCode(c string) bool {
	up, err := payment.ParseCurrency(c)
	return err == nil && up == c
}

func (s *Sim) postCharge(w http.ResponseWriter, r *http.Request) {
	post(s, w, r, onCharge, &s.charges, func(req chargeRequest, prev record) bool {
		return req == prev.chargeRequest
	}, func(req chargeRequest, a arrival) (record, error) {
		return record{
			charge: charge{
				ID:            "ch_" + uuid.Must(uuid.NewV7()).String(),
				chargeRequest: req,
				Status:        statusOf(a.declined),
				CreatedAt:     a.CreatedAt,
			},
			IdempotencyKey: a.IdempotencyKey,
			ReceivedAt:     a.ReceivedAt,
		}, nil
	}, record.view)
}

// arrival is what decide knows of a new request besides its body: when it arrived, what the
// bank keeps of it (its key, when it books) and whether a decline rule said no.
type arrival struct {
	now time.Time
	booking
	declined bool
}

// post is the one flow of a POST that moves or holds money (a charge, refund, authorization,
// capture or void): the request is checked, the `on` fault rules applied, and the request
// entered into b (see enter, for same and decide); the answer is view of the record. on also
// names the thing in a failure's answer.
func post[Q any, R entry](s *Sim, w http.ResponseWriter, r *http.Request, on string,
	b *book[R], same func(Q, R) bool, decide func(Q, arrival) (R, error), view func(R, time.Time) any) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		writeError(w, http.StatusBadRequest, "Idempotency-Key header is required")
		return
	}
	var req Q
	err := decodeStrict(w, r, &req)
	if v, ok := any(req).(interface{ validate() error }); ok && err == nil {
		err = v.validate()
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	fault, done := s.applyFault(w, r, on)
	if done {
		return
	}
	rec, err := enter(s, on, b, key, func(prev R) bool { return same(req, prev) }, func(now time.Time) (R, error) {
		a := arrival{now: now, booking: booking{CreatedAt: now, IdempotencyKey: key}, declined: fault.Action == actDecline}
		if fault.Action == actLateBooking {
			a.CreatedAt, a.ReceivedAt = now.Add(fault.lateBy()), &now
		}
		return decide(req, a)
	})
	switch {
	case errors.Is(err, errInProgress):
		writeError(w, http.StatusConflict, err.Error())
		return
	case errors.Is(err, errNoAuthorization):
		writeError(w, http.StatusNotFound, err.Error())
		return
	case err != nil:
		s.log.Error("banksim: recording "+on, "err", err)
		writeError(w, http.StatusInternalServerError, "could not record "+on)
		return
	}
	s.mu.Lock()
	body := view(rec, s.now())
	s.mu.Unlock()
	// The record is on disk (or will book at its time); only the answer is at fault.
	if !answerFault(w, fault.Action, body) {
		writeJSON(w, http.StatusCreated, body)
	}
}

// inquire serves the lookup by reference of a charge, refund or authorization: the latest
// booked, preferring a succeeded one, as view shows it. The `inquiry` fault rules apply to all.
func inquire[R entry](s *Sim, b *book[R], view func(R, time.Time) any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
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
		status, body := http.StatusNotFound, any(map[string]string{"error": "not found"})
		s.mu.Lock()
		now := s.now()
		if rec, ok := b.latest(ref, now); ok {
			status, body = http.StatusOK, view(rec, now)
		}
		s.mu.Unlock()
		if !answerFault(w, fault.Action, body) {
			writeJSON(w, status, body)
		}
	}
}

func (s *Sim) getSettlement(w http.ResponseWriter, r *http.Request) {
	date, ok := strings.CutSuffix(r.PathValue("file"), ".csv")
	if _, err := time.Parse(time.DateOnly, date); !ok || err != nil {
		writeError(w, http.StatusBadRequest, "want /v1/settlements/YYYY-MM-DD.csv")
		return
	}
	// The file speaks for every merchant's charges and refunds: its scope row says so, so an
	// import needs no scope of its own to release what the day does not list. It lists captures
	// too, but does not declare them: the reconciler refuses a scope type it does not know.
	rows := [][]string{{"settlement_date", "provider_charge_id", "reference", "amount", "currency", "status", "type"},
		{"scope", "all", "charge refund", "", "", "", ""}}
	s.mu.Lock()
	now := s.now()
	settled := func(typ, id, ref string, minor int64, currency string, m meta) {
		if m.succeeded() && m.bookedBy(now) && m.at.UTC().Format(time.DateOnly) == date {
			rows = append(rows, []string{date, id, ref, payment.FormatAmount(minor, currency), currency, "settled", typ})
		}
	}
	for _, c := range s.charges.records {
		settled("charge", c.ID, c.Reference, c.AmountMinor, c.Currency, c.meta())
	}
	// A refund's line: its own id and reference, and the amount paid back.
	for _, r := range s.refunds.records {
		settled("refund", r.ID, r.Reference, r.AmountMinor, r.Currency, r.meta())
	}
	// A capture's line: its own id, its authorization's reference, and the amount taken. An
	// authorization or a void moves no money and has none.
	for _, c := range s.captures.records {
		settled("capture", c.ID, c.Reference, c.AmountMinor, c.Currency, c.meta())
	}
	s.mu.Unlock()
	// The trailer proves the file complete for the day up to now:
	// reconciliation releases an unlisted payment only from a file that has it
	// (docs/reconciliation.md, "Daily reconciliation").
	rows = append(rows, []string{"trailer", date, strconv.Itoa(len(rows) - 2), now.UTC().Format(time.RFC3339Nano), "", "", ""})
	w.Header().Set("Content-Type", "text/csv")
	_ = csv.NewWriter(w).WriteAll(rows)
}

func (s *Sim) putFaults(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Rules []Rule `json:"rules"`
	}
	if err := decodeStrict(w, r, &body); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	faults := make([]faultState, len(body.Rules))
	for i, rule := range body.Rules {
		if err := rule.validate(); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("rules[%d]: %v", i, err))
			return
		}
		faults[i].Rule = rule
		if rule.Count != nil {
			faults[i].Remaining = new(*rule.Count)
		}
	}
	s.mu.Lock()
	s.faults = faults
	s.mu.Unlock()
	s.getFaults(w, r)
}

func (s *Sim) deleteFaults(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	s.faults = nil
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Sim) getFaults(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock() // encoded under the lock: requests count Remaining down
	writeJSON(w, http.StatusOK, map[string]any{"rules": append([]faultState{}, s.faults...)})
}

func (s *Sim) simCharges(w http.ResponseWriter, r *http.Request) {
	var out struct {
		Count   int      `json:"count"`
		Charges []record `json:"charges"`
		Pending int      `json:"pending"` // late bookings whose time has not come
	}
	s.mu.Lock()
	out.Charges, out.Count, out.Pending = s.charges.tally(r.URL.Query().Get("reference"), s.now())
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// decodeStrict decodes exactly one JSON value with no unknown fields.
func decodeStrict(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("invalid JSON body: trailing data")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
