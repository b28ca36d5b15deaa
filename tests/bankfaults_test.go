package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/workflows"
)

// A bank that behaves like a real one: it books a charge after the connection died, answers 409
// "in progress", 503 or 429, or a body that is not JSON. Only a decline may fail a payment, and
// no answer may make kasa move the money twice.
func TestRealisticBankFaults(t *testing.T) {
	t.Parallel()
	const (
		idem    = workflows.CapabilityIdempotent
		inquiry = workflows.CapabilityInquiry
		none    = workflows.CapabilityNone
	)
	// The late booking lands after the first inquiry (at 2 s) and inside the window (4 s).
	late := `{"on":"charge","action":"late_booking","delay_ms":2500,"count":1}`
	for _, c := range []struct {
		capability workflows.Capability
		rules      string
		status     string // the payment's final status
		moves      int    // times the bank moved the money
	}{
		{idem, late, "succeeded", 1},
		{idem, `{"on":"charge","action":"error_409","count":1}`, "succeeded", 1},
		{idem, `{"on":"charge","action":"error_503","count":1}`, "succeeded", 1},
		{idem, `{"on":"charge","action":"error_429","count":1}`, "succeeded", 1},
		{idem, `{"on":"charge","action":"garbage","count":1}`, "succeeded", 1},
		{inquiry, late, "succeeded", 1},
		{inquiry, `{"on":"charge","action":"error_409","count":1}`, "succeeded", 1},
		{inquiry, `{"on":"charge","action":"error_503","count":1}`, "succeeded", 1},
		// No money moved: the charge is re-sent once the window has passed.
		{inquiry, `{"on":"charge","action":"error_429","count":1}`, "succeeded", 1},
		{inquiry, `{"on":"charge","action":"garbage","count":1}`, "succeeded", 1},
		// Inquiries answered badly are retried, never read as "no charge".
		{inquiry, `{"on":"charge","action":"drop_response","count":1},{"on":"inquiry","action":"error_409","count":2}`, "succeeded", 1},
		{inquiry, `{"on":"charge","action":"drop_response","count":1},{"on":"inquiry","action":"error_503","count":2}`, "succeeded", 1},
		{inquiry, `{"on":"charge","action":"drop_response","count":1},{"on":"inquiry","action":"garbage","count":2}`, "succeeded", 1},
		{inquiry, `{"on":"charge","action":"drop_response","count":1},{"on":"inquiry","action":"error_429","count":2}`, "succeeded", 1},
		{none, late, "unknown", 1},
		{none, `{"on":"charge","action":"error_409","count":1}`, "unknown", 1},
		{none, `{"on":"charge","action":"error_503","count":1}`, "unknown", 1},
		{none, `{"on":"charge","action":"error_429","count":1}`, "unknown", 0},
		{none, `{"on":"charge","action":"garbage","count":1}`, "unknown", 1},
	} {
		t.Run(fmt.Sprintf("%s %s", c.capability, c.rules), func(t *testing.T) {
			t.Parallel()
			s := newStackWith(t, stackOptions{capability: c.capability, temporal: tc, bookingWindow: 4 * time.Second})
			m := s.newMerchant()
			acct := s.newAccount(m, "TRY", "100.00")
			s.setFaults(`{"rules":[` + c.rules + `]}`)

			r := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", acct))
			want := map[string]int{"succeeded": http.StatusCreated, "unknown": http.StatusAccepted}[c.status]
			require.Equal(t, want, r.Status, "%s", r.Body)
			p := r.json(t)
			require.Equal(t, c.status, p["status"])
			id := p["id"].(string)
			// A late booking lands after the answer: wait past it before counting.
			time.Sleep(3 * time.Second)
			require.Equal(t, c.moves, s.simCount(id), "times the bank moved the money")
			a := s.account(m, acct)
			if c.status == "succeeded" {
				require.Equal(t, "60.00", a["balance"])
				require.Equal(t, "0.00", a["reserved"])
			} else {
				require.Equal(t, "100.00", a["balance"])
				require.Equal(t, "40.00", a["reserved"], "an unknown payment keeps its hold")
			}
			requireVerified(t)
		})
	}
}

// rewriteInquiries is a bank whose authorization inquiries answer the simulator's record with
// its state replaced by state (removed when empty): a bank with states kasa does not know.
func rewriteInquiries(state string) func(http.Handler) http.Handler {
	return rewriteAuthorizationInquiries(func(au map[string]any) {
		delete(au, "state")
		if state != "" {
			au["state"] = state
		}
	})
}

// rewriteAuthorizationInquiries puts a bank in front of the simulator whose answers to
// authorization inquiries are changed by edit.
func rewriteAuthorizationInquiries(edit func(au map[string]any)) func(http.Handler) http.Handler {
	return func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || r.URL.Path != "/v1/authorizations" {
				sim.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			sim.ServeHTTP(rec, r)
			var au map[string]any
			if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &au) != nil {
				w.WriteHeader(rec.Code)
				_, _ = w.Write(rec.Body.Bytes())
				return
			}
			edit(au)
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(au)
		})
	}
}

// An inquiry that finds the authorization in a state kasa cannot read (none, or one it does not
// know) says nothing of a capture or a void: the capture whose answer was lost is not failed,
// and its authorization, which the bank captured, never voided and released.
func TestUnreadableAuthorizationStateIsNoDecline(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"", "capture_pending"} {
		t.Run("state "+state, func(t *testing.T) {
			t.Parallel()
			lostCaptureParksUnknown(t, rewriteInquiries(state))
		})
	}
}

// lostCaptureParksUnknown loses the answer to a capture of 30.00 of an 80.00 authorization at a
// bank with inquiries, answered as bank answers them: the payment parks unknown, the capture made
// at the bank, the authorization never voided, the hold kept and nothing posted.
func lostCaptureParksUnknown(t *testing.T, bank func(http.Handler) http.Handler) {
	t.Helper()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityInquiry, temporal: tc, bank: bank})
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "auth-1", "80.00", "100.00")
	s.setFaults(`{"rules":[{"on":"capture","action":"drop_response","count":1}]}`)
	r := s.command(m, id, "capture", "cap-1", `{"amount":"30.00"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Equal(t, "unknown", r.json(t)["status"])
	held := s.held(id)
	require.Equal(t, int64(3000), held.CapturedMinor, "the bank captured what kasa asked")
	require.False(t, held.Voided, "never voided")
	require.Equal(t, int64(8000), reserved(t, payer), "an unknown capture keeps the hold")
	require.Equal(t, int64(10000), balance(t, payer), "nothing posted")
	requireVerified(t)
}

// A capture whose answer was lost, found by the inquiry captured for another amount than the one
// kasa asked, is not posted as the amount asked: the payment parks unknown, its hold kept, until
// a settlement says what moved.
func TestCaptureInquiryNamingOtherMoneyIsAmbiguous(t *testing.T) {
	t.Parallel()
	for name, edit := range map[string]func(au map[string]any){
		"captured amount": func(au map[string]any) {
			if au["state"] == "captured" {
				au["captured_minor"] = 2900
			}
		},
		"authorized amount": func(au map[string]any) {
			if au["state"] == "captured" {
				au["amount_minor"] = 9000
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lostCaptureParksUnknown(t, rewriteAuthorizationInquiries(edit))
		})
	}
}

// A bank whose charge inquiries are redirected elsewhere (a maintenance page that is not there)
// has not said that it has no charge: the lost charge, which it booked, is never sent again.
func TestRedirectedInquiryIsNoNotFound(t *testing.T) {
	t.Parallel()
	redirect := func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && r.URL.Path == "/v1/charges" {
				http.Redirect(w, r, "/maintenance", http.StatusFound)
				return
			}
			sim.ServeHTTP(w, r) // the simulator answers /maintenance 404
		})
	}
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityInquiry, temporal: tc, bookingWindow: 3 * time.Second, bank: redirect})
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	r := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", acct))
	id := r.json(t)["id"].(string)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "key-1").Status != "processing" }, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, 1, s.simCount(id), "charged once")
	require.Equal(t, "unknown", string(paymentByKey(t, m, "key-1").Status))
	a := s.account(m, acct)
	require.Equal(t, "100.00", a["balance"])
	require.Equal(t, "40.00", a["reserved"], "an unknown payment keeps its hold")
	requireVerified(t)
}
