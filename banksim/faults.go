package banksim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"
)

const (
	onCharge  = "charge"
	onInquiry = "inquiry"

	actDropResponse = "drop_response"
	actError500     = "error_500"
	actDelay        = "delay"
	actDecline      = "decline"
	actHang         = "hang"
)

// faultRule is one rule as sent to PUT /_sim/faults.
type faultRule struct {
	On          string   `json:"on"`
	Action      string   `json:"action"`
	DelayMS     int      `json:"delay_ms,omitempty"`
	Count       *int     `json:"count,omitempty"`       // nil: applies forever
	Probability *float64 `json:"probability,omitempty"` // nil: 1
}

// faultState is a rule plus how many more requests it will hit (nil: unlimited).
type faultState struct {
	faultRule
	Remaining *int `json:"remaining,omitempty"`
}

func (r faultRule) validate() error {
	switch r.On {
	case onCharge, onInquiry:
	default:
		return fmt.Errorf("unknown on %q (want charge or inquiry)", r.On)
	}
	switch r.Action {
	case actDropResponse, actError500, actDelay, actHang:
	case actDecline:
		if r.On != onCharge {
			return errors.New("decline applies only to charge")
		}
	default:
		return fmt.Errorf("unknown action %q", r.Action)
	}
	if r.DelayMS < 0 || (r.Action == actDelay && r.DelayMS == 0) {
		return errors.New("delay needs delay_ms > 0")
	}
	if r.Count != nil && *r.Count < 1 {
		return errors.New("count must be >= 1 (omit it for no limit)")
	}
	if p := r.Probability; p != nil && (*p < 0 || *p > 1) {
		return errors.New("probability must be within 0..1")
	}
	return nil
}

// pickFault returns the first live rule for a request of kind on whose
// probability roll succeeds, consuming one of its count; nil if none applies.
func (s *Sim) pickFault(on string) *faultRule {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.faults {
		f := &s.faults[i]
		if f.On != on || (f.Remaining != nil && *f.Remaining == 0) {
			continue
		}
		if f.Probability != nil && rand.Float64() >= *f.Probability {
			continue
		}
		if f.Remaining != nil {
			*f.Remaining--
		}
		rule := f.faultRule
		return &rule
	}
	return nil
}

// applyFault runs the part of a fault that happens before the request is
// served. It returns the action the handler still has to honour
// (drop_response, decline) and whether the request is already finished.
func (s *Sim) applyFault(w http.ResponseWriter, r *http.Request, on string) (action string, done bool) {
	f := s.pickFault(on)
	if f == nil {
		return "", false
	}
	s.log.Info("banksim fault", "on", on, "action", f.Action, "path", r.URL.Path)
	switch f.Action {
	case actError500:
		writeError(w, http.StatusInternalServerError, "simulated internal error")
		return "", true
	case actHang:
		select {
		case <-r.Context().Done():
		case <-s.closed:
		}
		// Returning normally would send an empty 200; hang up instead.
		dropConn(w)
		return "", true
	case actDelay:
		t := time.NewTimer(time.Duration(f.DelayMS) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
			return "", false
		case <-r.Context().Done():
			return "", true // client gone: do nothing, like a bank that never saw it
		}
	}
	return f.Action, false
}

// dropConn closes the connection without a response, so the client cannot
// tell whether the request took effect.
func dropConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (e.g. HTTP/2): abort the stream instead.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}
