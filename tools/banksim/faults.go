package banksim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"
)

const (
	onCharge    = "charge"
	onInquiry   = "inquiry"
	onRefund    = "refund"
	onAuthorize = "authorize"
	onCapture   = "capture"
	onVoid      = "void"

	actDropResponse = "drop_response"
	actError500     = "error_500"
	actDelay        = "delay"
	actDecline      = "decline"
	actHang         = "hang"
	actLateBooking  = "late_booking"
	actError409     = "error_409"
	actError503     = "error_503"
	actError429     = "error_429"
	actGarbage      = "garbage"

	// defaultDelay is a delay's, and how late a late_booking books, without delay_ms.
	defaultDelay = 2 * time.Second
	// maxDelay bounds delay_ms: a longer one is a mistake, and past ~292 years it would overflow.
	maxDelay = 24 * time.Hour
)

var (
	ons     = []string{onCharge, onInquiry, onRefund, onAuthorize, onCapture, onVoid}
	actions = []string{actDropResponse, actError500, actDelay, actDecline, actHang,
		actLateBooking, actError409, actError503, actError429, actGarbage}
)

// faultState is a rule plus how many more requests it will hit (nil: unlimited).
type faultState struct {
	Rule
	Remaining *int `json:"remaining,omitempty"`
}

func (r Rule) validate() error {
	switch {
	case !slices.Contains(ons, r.On):
		return fmt.Errorf("unknown on %q (want charge, inquiry, refund, authorize, capture or void)", r.On)
	case !slices.Contains(actions, r.Action):
		return fmt.Errorf("unknown action %q (want one of %s)", r.Action, strings.Join(actions, ", "))
	case r.Action == actDecline && r.On == onInquiry:
		return errors.New("decline does not apply to inquiry")
	case r.DelayMS < 0:
		return errors.New("delay_ms must be >= 0")
	case int64(r.DelayMS) > maxDelay.Milliseconds():
		return fmt.Errorf("delay_ms must be at most %d (a day)", maxDelay.Milliseconds())
	case r.Count != nil && *r.Count < 1:
		return errors.New("count must be >= 1 (omit it for no limit)")
	case r.Probability != nil && (*r.Probability < 0 || *r.Probability > 1):
		return errors.New("probability must be within 0..1")
	}
	return nil
}

// pickFault returns the first live rule for a request of kind on whose probability roll
// succeeds, consuming one of its count; the zero Rule if none applies.
func (s *Sim) pickFault(on string) Rule {
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
		return f.Rule
	}
	return Rule{}
}

// lateBy is how long a delay waits, and how much later a late_booking books.
func (r Rule) lateBy() time.Duration {
	if r.DelayMS == 0 {
		return defaultDelay
	}
	return time.Duration(r.DelayMS) * time.Millisecond
}

// applyFault runs the part of a fault that happens before the request is served. It returns
// the rule, whose action the handler still has to honour (those answerFault handles, and
// decline), and whether the request is already finished.
func (s *Sim) applyFault(w http.ResponseWriter, r *http.Request, on string) (f Rule, done bool) {
	f = s.pickFault(on)
	if f.Action == "" {
		return f, false
	}
	s.log.Info("banksim fault", "on", on, "action", f.Action, "path", r.URL.Path)
	switch f.Action {
	case actError500:
		writeError(w, http.StatusInternalServerError, "simulated internal error")
		return f, true
	case actError429:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "too many requests")
		return f, true
	case actHang:
		select {
		case <-r.Context().Done():
		case <-s.closed:
		}
		// Returning normally would send an empty 200; hang up instead.
		dropConn(w)
		return f, true
	case actDelay:
		t := time.NewTimer(f.lateBy())
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return f, true // client gone: do nothing, like a bank that never saw it
		case <-s.closed: // going down before serving it
			dropConn(w)
			return f, true
		}
	}
	return f, false
}

// answerFault answers the request as the fault's action says, after the handler did its work;
// body is the JSON the answer would have carried. It reports false when the action does not
// change the answer.
func answerFault(w http.ResponseWriter, action string, body any) bool {
	switch action {
	case actDropResponse, actLateBooking:
		dropConn(w)
	case actError409:
		writeError(w, http.StatusConflict, errInProgress.Error())
	case actError503:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "service unavailable")
	case actGarbage:
		// The real answer cut in half, as a proxy that lost the rest would pass it on.
		b, _ := json.Marshal(body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b[:len(b)/2])
	default:
		return false
	}
	return true
}

// dropConn closes the connection without a response, so the client cannot tell whether the
// request took effect.
func dropConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (e.g. HTTP/2): abort the stream instead.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}
