package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/banksim"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// A capture whose body is invalid (an amount of 0, below 0, with more fraction digits than the
// currency has, not a number, or beside an unknown field), and a cancel with an amount, are 400
// invalid_request naming the field: nothing is captured or released, and the key is kept by
// nothing, so the same key then names a valid capture.
func TestManualCommandBodyRefusedKeepsNothing(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-body", "50.00", "100.00")

	for _, c := range []struct{ command, body, field string }{
		{"capture", `{"amount":"0"}`, "amount"},
		{"capture", `{"amount":0}`, "amount"},
		{"capture", `{"amount":"0.00"}`, "amount"},
		{"capture", `{"amount":"-5.00"}`, "amount"},
		{"capture", `{"amount":"10.001"}`, "amount"},
		{"capture", `{"amount":10.001}`, "amount"},
		{"capture", `{"amount":"10.000"}`, "amount"},
		{"capture", `{"amount":"ten"}`, "amount"},
		{"capture", `{"amount":"10.00","note":"x"}`, "note"},
		{"cancel", `{"amount":"10.00"}`, "amount"},
	} {
		r := s.command(m, paymentID, c.command, "body-key", c.body)
		requireProblem(t, r, http.StatusBadRequest, "invalid_request")
		errs, ok := r.json(t)["errors"].([]any)
		require.True(t, ok, "%s: %s", c.body, r.Body)
		require.NotEmpty(t, errs, "%s", c.body)
		require.Equal(t, c.field, errs[0].(map[string]any)["field"], "%s: %s", c.body, r.Body)
	}
	p := s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)
	require.Equal(t, "requires_capture", p["status"])
	require.Equal(t, "50.00", p["capturable"])
	require.Equal(t, int64(5000), reserved(t, payer), "nothing released")
	require.Zero(t, s.held(paymentID).CapturedMinor, "nothing captured")
	require.False(t, s.held(paymentID).Voided)

	r := s.command(m, paymentID, "capture", "body-key", `{"amount":"10.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "the refused requests kept no key: %s", r.Body)
	require.Equal(t, "10.00", r.json(t)["amount_captured"])
	require.Equal(t, int64(1000), s.held(paymentID).CapturedMinor)
	require.Equal(t, int64(9000), balance(t, payer))
	require.Zero(t, reserved(t, payer))
	requireVerified(t)
}

// A manual payment in a currency without minor units: its amounts read in whole units, a capture
// with a fraction is 400, a capture of more than is capturable is 409 with capturable in the
// currency's form, and a capture of all of it takes the whole hold at the bank and on the payer.
func TestManualCaptureInAZeroDecimalCurrency(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	payer := s.newAccount(m, "JPY", "5000")
	r := s.pay(m, "auth-jpy", `{"invoice_id":"inv-jpy","amount":"1200","currency":"jpy","account_id":"`+payer+`","capture":"manual"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	p := r.json(t)
	require.Equal(t, "requires_capture", p["status"])
	require.Equal(t, "JPY", p["currency"])
	require.Equal(t, "1200", p["capturable"])
	require.Equal(t, "0", p["amount_captured"])
	id := p["id"].(string)
	require.Equal(t, int64(1200), reserved(t, payer))

	requireProblem(t, s.command(m, id, "capture", "jpy-frac", `{"amount":"100.5"}`), http.StatusBadRequest, "invalid_request")
	over := s.command(m, id, "capture", "jpy-over", `{"amount":"1201"}`)
	requireProblem(t, over, http.StatusConflict, "capture_exceeds_capturable")
	require.Equal(t, "1200", over.json(t)["capturable"])

	c := s.command(m, id, "capture", "jpy-all", "")
	require.Equal(t, http.StatusCreated, c.Status, "%s", c.Body)
	require.Equal(t, "1200", c.json(t)["amount_captured"])
	require.Equal(t, "0", c.json(t)["capturable"])
	require.Equal(t, int64(1200), s.held(id).CapturedMinor)
	require.Equal(t, int64(3800), balance(t, payer))
	require.Zero(t, reserved(t, payer))
	requireVerified(t)
}

// Captures and cancels of payments that cannot take them are refused and change nothing: an
// automatic payment's (409), another merchant's and no payment's (404); and a manual payment
// takes no refund until it is captured, nor once it is canceled.
func TestManualCommandsOnOtherPayments(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m, other := s.newMerchant(), s.newMerchant()

	auto, _ := s.paidFor(m, "auto-1", "20.00", "100.00")
	requireProblem(t, s.command(m, auto, "capture", "auto-cap", ""), http.StatusConflict, "payment_not_capturable")
	requireProblem(t, s.command(m, auto, "cancel", "auto-x", ""), http.StatusConflict, "payment_not_cancelable")
	require.Zero(t, s.held(auto).Count, "no authorization at the bank for an automatic payment")
	require.Equal(t, 1, s.simCount(auto))

	theirs, payer, _ := s.authorize(other, "auth-theirs", "30.00", "100.00")
	requireProblem(t, s.command(m, theirs, "capture", "theirs-cap", ""), http.StatusNotFound, "not_found")
	requireProblem(t, s.command(m, theirs, "cancel", "theirs-x", ""), http.StatusNotFound, "not_found")
	requireProblem(t, s.command(m, "0190a5b2-7c1e-7d3a-9f00-3b1c2d4e5f60", "capture", "none-cap", ""), http.StatusNotFound, "not_found")
	requireProblem(t, s.command(m, "not-an-id", "cancel", "bad-x", ""), http.StatusNotFound, "not_found")
	require.Zero(t, s.held(theirs).CapturedMinor)
	require.False(t, s.held(theirs).Voided)
	require.Equal(t, int64(3000), reserved(t, payer))

	waiting, payer2, _ := s.authorize(m, "auth-norefund", "40.00", "100.00")
	requireProblem(t, s.refund(m, waiting, "ref-waiting", `{"amount":"1.00"}`), http.StatusConflict, "payment_not_refundable")
	require.Equal(t, http.StatusOK, s.command(m, waiting, "cancel", "norefund-x", "").Status)
	requireProblem(t, s.refund(m, waiting, "ref-canceled", `{}`), http.StatusConflict, "payment_not_refundable")
	require.Zero(t, s.simRefunds(waiting))
	require.Equal(t, int64(10000), balance(t, payer2))
	require.Zero(t, reserved(t, payer2))

	// The refused keys were kept by nothing: the other merchant's capture under its own key works.
	r := s.command(other, theirs, "capture", "theirs-cap", `{"amount":"5.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, int64(500), s.held(theirs).CapturedMinor)
	requireVerified(t)
}

// A manual payment holds its invoice while it waits for its capture (409 duplicate_payment under
// another key, naming it), and frees it once canceled, as a failed payment does.
func TestManualPaymentHoldsItsInvoiceUntilCanceled(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "auth-inv", "20.00", "100.00")

	for _, body := range []string{payBody("inv-auth-inv", "20.00", "TRY", payer), manualBody("inv-auth-inv", "5.00", payer)} {
		r := s.pay(m, "auth-inv-again-"+fmt.Sprint(len(body)), body)
		requireProblem(t, r, http.StatusConflict, "duplicate_payment")
		require.Equal(t, id, r.json(t)["payment_id"])
	}
	require.Equal(t, http.StatusOK, s.command(m, id, "cancel", "inv-x", "").Status)
	r := s.pay(m, "auth-inv-after", payBody("inv-auth-inv", "20.00", "TRY", payer))
	require.Equal(t, http.StatusCreated, r.Status, "a canceled payment frees its invoice: %s", r.Body)
	require.Equal(t, int64(8000), balance(t, payer))
	requireVerified(t)
}

// The bank's settlement file lists a manual payment's capture (type capture, the amount
// captured), and neither an authorization nobody captured nor a voided one; imported for the
// merchant, it matches the captured payment and changes nothing.
func TestSettlementFileListsCaptures(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	captured, payer, _ := s.authorize(m, "auth-file-cap", "100.00", "200.00")
	require.Equal(t, http.StatusCreated, s.command(m, captured, "capture", "file-cap", `{"amount":"60.00"}`).Status)
	voided, _, _ := s.authorize(m, "auth-file-void", "30.00", "100.00")
	require.Equal(t, http.StatusOK, s.command(m, voided, "cancel", "file-void", "").Status)
	waiting, _, _ := s.authorize(m, "auth-file-wait", "10.00", "100.00")

	file := s.settlementFile(today())
	require.Contains(t, file, ","+captured+",60.00,TRY,settled,capture\n", "%s", file)
	require.Equal(t, 1, strings.Count(file, captured), "%s", file)
	require.NotContains(t, file, voided, "%s", file)
	require.NotContains(t, file, waiting, "%s", file)

	rep, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok, "%+v", rep)
	require.Empty(t, rep.Mismatches, "%+v", rep)
	require.Empty(t, rep.Resolved, "%+v", rep)
	p := paymentByKey(t, m, "auth-file-cap")
	require.Equal(t, int64(6000), p.CapturedMinor)
	require.Equal(t, int64(14000), balance(t, payer))
	require.Equal(t, "requires_capture", string(paymentByKey(t, m, "auth-file-wait").Status), "a waiting authorization is left alone")
	requireVerified(t)
}

// The realistic bank faults of charges, on an authorization, a capture and a void, under each
// capability: only a decline fails an authorization or refuses a capture; every other answer is
// ambiguous (the capability's strategy decides, and without one the payment is unknown with its
// hold), and the bank never holds, captures or voids twice.
func TestRealisticBankFaultsOnManualPayments(t *testing.T) {
	t.Parallel()
	type outcome struct {
		status string // the payment's status once the call's answer is in
		moved  bool   // the bank did what was asked (held, captured or voided)
	}
	for _, capability := range workflows.Capabilities {
		for _, on := range []string{"authorize", "capture", "void"} {
			for _, action := range []string{"late_booking", "error_409", "error_503", "error_429", "garbage", "decline"} {
				if on == "void" && action == "decline" {
					continue // a void the bank refuses is its own case (docs/api.md)
				}
				t.Run(fmt.Sprintf("%s %s %s", capability, on, action), func(t *testing.T) {
					t.Parallel()
					want := outcome{map[string]string{"authorize": "requires_capture", "capture": "succeeded", "void": "canceled"}[on], true}
					switch {
					case action == "decline" && on == "authorize":
						want = outcome{"failed", false}
					case action == "decline": // the capture refused: the authorization is let go
						want = outcome{"canceled", false}
					case capability == workflows.CapabilityNone:
						want = outcome{"unknown", action != "error_429"}
					}
					s := newStackWith(t, stackOptions{capability: capability, temporal: tc, bookingWindow: 4 * time.Second})
					m := s.newMerchant()
					payer := s.newAccount(m, "TRY", "100.00")
					rule := fmt.Sprintf(`{"rules":[{"on":%q,"action":%q,"delay_ms":2500,"count":1}]}`, on, action)
					key := "k-" + on
					var id string
					if on == "authorize" {
						s.setFaults(rule)
						r := s.pay(m, key, manualBody("inv-"+key, "80.00", payer))
						require.Contains(t, []int{http.StatusCreated, http.StatusAccepted, http.StatusPaymentRequired}, r.Status, "%s", r.Body)
						id = r.json(t)["id"].(string)
					} else {
						r := s.pay(m, key, manualBody("inv-"+key, "80.00", payer))
						require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
						id = r.json(t)["id"].(string)
						s.setFaults(rule)
						command, body := "capture", `{"amount":"30.00"}`
						if on == "void" {
							command, body = "cancel", ""
						}
						r = s.command(m, id, command, "cmd-"+key, body)
						require.Contains(t, []int{http.StatusCreated, http.StatusOK, http.StatusAccepted, http.StatusPaymentRequired}, r.Status, "%s", r.Body)
					}
					var p map[string]any
					require.Eventually(t, func() bool {
						p = s.do("GET", "/v1/payments/"+id, m.APIKey, "").json(t)
						return p["status"] == want.status
					}, 30*time.Second, 100*time.Millisecond, "want %s", want.status)
					if want.moved { // a late booking lands after the answer: wait for the bank to show it
						require.Eventually(t, func() bool {
							h := s.held(id)
							return map[string]bool{"authorize": h.Count == 1, "capture": h.CapturedMinor == 3000, "void": h.Voided}[on]
						}, 30*time.Second, 100*time.Millisecond, "the bank did what was asked")
					} else {
						time.Sleep(3 * time.Second) // and nothing lands later
					}
					p = s.do("GET", "/v1/payments/"+id, m.APIKey, "").json(t)
					require.Equal(t, want.status, p["status"], "%v", p)
					held := s.held(id)
					var held1, captured, voided, wantReserved, wantBalance int64 = int64(held.Count), held.CapturedMinor, 0, 0, 10000
					if held.Voided {
						voided = 1
					}
					switch on {
					case "authorize":
						require.Equal(t, map[bool]int64{true: 1, false: 0}[want.moved], held1, "authorizations made: %+v", held)
						require.Zero(t, captured)
						if want.status != "failed" {
							wantReserved = 8000
						}
					case "capture":
						require.Equal(t, int64(1), held1, "%+v", held)
						require.Equal(t, map[bool]int64{true: 3000, false: 0}[want.moved], captured, "captured at the bank: %+v", held)
						switch want.status {
						case "succeeded":
							wantBalance = 7000
						case "unknown":
							wantReserved = 8000
						case "canceled":
							require.Equal(t, int64(1), voided, "a refused capture lets the authorization go: %+v", held)
							require.Equal(t, "declined", p["failure_code"])
						}
					case "void":
						require.Equal(t, int64(1), held1, "%+v", held)
						require.Zero(t, captured)
						require.Equal(t, map[bool]int64{true: 1, false: 0}[want.moved], voided, "voided at the bank: %+v", held)
						if want.status == "unknown" {
							wantReserved = 8000
						}
					}
					require.Equal(t, wantBalance, balance(t, payer))
					require.Equal(t, wantReserved, reserved(t, payer))
					requireVerified(t)
				})
			}
		}
	}
}

// With the shortest capture window (10s): a capture just before capture_before is taken; once
// it has passed, a capture is refused and kasa voids the authorization within a minute. The
// merchant hears payment.requires_capture, then payment.captured or payment.canceled
// (authorization_expired), each with the payment as it was then.
func TestCaptureWindowBoundaryAndItsEvents(t *testing.T) {
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, captureWindow: 10 * time.Second})
	hook := newSink(t)
	startEventPipeline(t)
	m := s.newHookedMerchant(hook.URL)

	captured, payer, first := s.authorize(m, "edge-cap", "40.00", "100.00")
	expired, payer2, _ := s.authorize(m, "edge-exp", "25.00", "100.00")
	before := mustTime(t, first.json(t)["capture_before"].(string))
	created := mustTime(t, first.json(t)["created_at"].(string))
	require.Equal(t, 10*time.Second, before.Sub(created), "capture_before is the window after creation")

	// Seconds before: the capture must reach the workflow before its timer, which a loaded
	// machine may take a second or two to do.
	time.Sleep(time.Until(before.Add(-3 * time.Second)))
	r := s.command(m, captured, "capture", "edge-cap-1", "")
	require.Equal(t, http.StatusCreated, r.Status, "just before capture_before: %s", r.Body)
	require.Equal(t, "40.00", r.json(t)["amount_captured"])

	time.Sleep(time.Until(mustTime(t, s.do("GET", "/v1/payments/"+expired, m.APIKey, "").json(t)["capture_before"].(string)).Add(100 * time.Millisecond)))
	late := s.command(m, expired, "capture", "edge-exp-1", "")
	requireProblem(t, late, http.StatusConflict, "payment_not_capturable")
	var p map[string]any
	require.Eventually(t, func() bool {
		p = s.do("GET", "/v1/payments/"+expired, m.APIKey, "").json(t)
		return p["status"] == "canceled"
	}, time.Minute, 100*time.Millisecond)
	require.Equal(t, "authorization_expired", p["failure_code"])
	require.Equal(t, "0.00", p["capturable"])
	require.Equal(t, "0.00", p["amount_captured"])
	require.True(t, s.held(expired).Voided)
	require.Equal(t, int64(4000), s.held(captured).CapturedMinor)
	require.Equal(t, int64(6000), balance(t, payer))
	require.Zero(t, reserved(t, payer))
	require.Equal(t, int64(10000), balance(t, payer2))
	require.Zero(t, reserved(t, payer2))

	require.Eventually(t, func() bool { return len(hook.Requests()) == 4 }, 30*time.Second, 20*time.Millisecond)
	type seen struct{ typ, status, capturable, captured, failure string }
	events := map[string][]seen{}
	for _, got := range hook.Requests() {
		w := testkit.DecodeWebhook(t, got.Body)
		failure := ""
		if w.Data.FailureCode != nil {
			failure = *w.Data.FailureCode
		}
		events[w.Data.ID] = append(events[w.Data.ID], seen{w.Type, string(w.Data.Status), w.Data.Capturable, w.Data.AmountCaptured, failure})
		require.Equal(t, "manual", w.Data.Capture)
		require.NotEmpty(t, w.Data.CaptureBefore)
	}
	require.Equal(t, []seen{{"payment.requires_capture", "requires_capture", "40.00", "0.00", ""}, {"payment.captured", "succeeded", "0.00", "40.00", ""}}, events[captured])
	require.Equal(t, []seen{{"payment.requires_capture", "requires_capture", "25.00", "0.00", ""}, {"payment.canceled", "canceled", "0.00", "0.00", "authorization_expired"}}, events[expired])
	require.Len(t, s.do("GET", "/v1/payments?status=canceled", m.APIKey, "").json(t)["data"], 1)
	require.Len(t, s.do("GET", "/v1/payments?status=succeeded", m.APIKey, "").json(t)["data"], 1)
	require.Empty(t, s.do("GET", "/v1/payments?status=failed", m.APIKey, "").json(t)["data"], "canceled is not failed")
	require.Empty(t, s.do("GET", "/v1/payments?status=requires_capture", m.APIKey, "").json(t)["data"])
	requireVerified(t)
}

// While a capture is at the bank the payment reads capturable 0.00: a capture of more than the
// authorized amount is refused with the capturable the payment shows, never the authorized
// amount, which a capture sent next would not get either.
func TestCaptureExceedsWhileACaptureIsInFlightNamesNothingCapturable(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-exceeds", "70.00", "100.00")
	s.setFaults(`{"rules":[{"on":"capture","action":"delay","delay_ms":3000,"count":1}]}`)
	first := make(chan response, 1)
	go func() { first <- s.command(m, paymentID, "capture", "cap-first", `{"amount":"50.00"}`) }()
	require.Eventually(t, func() bool {
		return s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)["capturable"] == "0.00"
	}, 30*time.Second, 5*time.Millisecond)

	over := s.command(m, paymentID, "capture", "cap-over", `{"amount":"70.01"}`)
	require.Equal(t, http.StatusConflict, over.Status, "%s", over.Body)
	if over.json(t)["code"] == "capture_exceeds_capturable" {
		require.Equal(t, "0.00", over.json(t)["capturable"], "the payment shows nothing capturable: %s", over.Body)
	} else {
		require.Equal(t, "payment_not_capturable", over.json(t)["code"], "%s", over.Body)
	}
	r := <-first
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, int64(5000), s.held(paymentID).CapturedMinor)
	require.Equal(t, int64(5000), balance(t, payer))
	require.Zero(t, reserved(t, payer))
	requireVerified(t)
}

// A capture the bank never took (429, no money moved) is unknown at a bank without idempotency.
// The bank's complete file for the day, past the booking window, does not list it: the import
// settles it not_charged, and kasa lets the authorization go (voided at the bank, the hold
// released, nothing posted), once; importing the file again changes nothing.
func TestUnknownCaptureUnlistedOnACompleteDayIsReleased(t *testing.T) {
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "auth-unlisted", "70.00", "100.00")
	s.setFaults(`{"rules":[{"on":"capture","action":"error_429","count":1}]}`)
	r := s.command(m, id, "capture", "cap-unlisted", `{"amount":"25.00"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Equal(t, "unknown", r.json(t)["status"])
	require.Zero(t, s.held(id).CapturedMinor, "the bank took nothing")

	time.Sleep(bookingWindow + 500*time.Millisecond)
	file := complete(t, s.settlementFile(today()), today(), time.Now().UTC())
	require.NotContains(t, file, id)
	rep, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok, "%+v", rep)
	require.Len(t, rep.Resolved, 1, "%+v", rep)
	require.Equal(t, workflows.OutcomeNotCharged, rep.Resolved[0].Outcome)
	require.Equal(t, id, rep.Resolved[0].PaymentID)

	var p map[string]any
	require.Eventually(t, func() bool {
		p = s.do("GET", "/v1/payments/"+id, m.APIKey, "").json(t)
		return p["status"] != "unknown"
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, "canceled", p["status"], "%v", p)
	require.Equal(t, "0.00", p["amount_captured"])
	require.True(t, s.held(id).Voided, "the authorization let go at the bank")
	require.Zero(t, s.held(id).CapturedMinor)
	require.Zero(t, reserved(t, payer))
	require.Equal(t, int64(10000), balance(t, payer))

	again, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok, "%+v", again)
	require.Empty(t, again.Resolved, "%+v", again)
	r = s.command(m, id, "capture", "cap-unlisted", `{"amount":"25.00"}`)
	require.NotEqual(t, http.StatusCreated, r.Status, "the capture never happened: %s", r.Body)
	requireVerified(t)
}

// The worker is SIGKILLed after the bank captured and before the worker heard its answer, for
// every capability: the capture is never sent again to a bank without idempotency (the payment
// is unknown, its hold kept), and otherwise the new worker learns the capture (re-sent under its
// key, or found by the inquiry) and posts it once. Never is the bank's capture taken for a
// refusal that releases the hold.
func TestCrashWorkerKilledDuringCapture(t *testing.T) {
	t.Parallel()
	for _, capability := range []string{"idempotent", "inquiry", "none"} {
		t.Run(capability, func(t *testing.T) {
			t.Parallel()
			s := newCrashStack(t, crashConfig{capability: capability, providerTimeout: "8s", syncWait: "3s"})
			s.startBanksim()
			proxy := newChargeProxy(t, s.simURL())
			proxy.path = "*/capture"
			s.providerURL = proxy.srv.URL
			s.startWorker()
			s.startAPI()
			m := s.merchant()
			acct := s.account(m, "TRY", "100.00")
			r, err := s.pay(m, "auth-crash", manualBody("inv-auth-crash", "80.00", acct))
			require.NoError(t, err)
			id := r.json(t)["id"].(string)
			deadline := time.Now().Add(30 * time.Second)
			for s.payment(m, id)["status"] != "requires_capture" && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			require.Equal(t, "requires_capture", s.payment(m, id)["status"])

			proxy.swallow.Store(1)
			// A loaded machine may not see the capture taken within the 3 s sync wait: 503, which
			// the merchant answers by sending it again under its key (the same command).
			capture := func() response {
				return s.mustCall("POST", s.apiURL()+"/v1/payments/"+id+"/capture", m.APIKey, `{"amount":"30.00"}`,
					"Idempotency-Key", "cap-crash", "Content-Type", "application/json")
			}
			c := capture()
			for retry := 0; c.Status == http.StatusServiceUnavailable && retry < 10; retry++ {
				c = capture()
			}
			require.Equal(t, http.StatusAccepted, c.Status, "%s", c.Body)
			select {
			case <-proxy.charged:
			case <-time.After(15 * time.Second):
				t.Fatalf("the capture never reached the bank\n%s", testkit.Tail(s.worker.log, 30))
			}
			s.worker.kill()
			held, err := banksim.Control{URL: s.simURL()}.Authorizations(context.Background(), id)
			require.NoError(t, err)
			require.Equal(t, int64(3000), held.CapturedMinor, "the bank captured")
			s.startWorker()

			want := map[string]string{"idempotent": "succeeded", "inquiry": "succeeded", "none": "unknown"}[capability]
			var p map[string]any
			deadline = time.Now().Add(100 * time.Second)
			for {
				p = s.payment(m, id)
				if p["status"] != "requires_capture" || time.Now().After(deadline) {
					break
				}
				time.Sleep(250 * time.Millisecond)
			}
			require.Equal(t, want, p["status"], "%v", p)
			held, err = banksim.Control{URL: s.simURL()}.Authorizations(context.Background(), id)
			require.NoError(t, err)
			require.Equal(t, int64(3000), held.CapturedMinor, "%+v", held)
			require.False(t, held.Voided, "%+v", held)
			balance, reserved := s.balances(m, acct)
			if want == "unknown" {
				require.Equal(t, []string{"100.00", "80.00"}, []string{balance, reserved}, "an unknown capture keeps the hold")
			} else {
				require.Equal(t, "30.00", p["amount_captured"])
				require.Equal(t, []string{"70.00", "0.00"}, []string{balance, reserved})
			}
			s.verify()
		})
	}
}

// The list filters by every status a manual payment takes, unknown ones included whichever step
// lost its answer (the authorization, whose record is still open; a capture or a void, whose
// record completed when it was authorized): each payment listed once, on its status's page
// only, the keyset pages walking them all.
func TestListFiltersManualPaymentsByStatus(t *testing.T) {
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "1000.00")
	ids := map[string][]string{}
	add := func(status, id string) { ids[status] = append([]string{id}, ids[status]...) } // newest first

	add("succeeded", s.paidForFrom(m, payer, "auto-paid"))
	add("unknown", s.authorizeUnknown(m, "auth-unknown", payer))
	p := s.pay(m, "auth-cap-unknown", manualBody("inv-auth-cap-unknown", "30.00", payer)).json(t)["id"].(string)
	s.setFaults(`{"rules":[{"on":"capture","action":"drop_response","count":1}]}`)
	require.Equal(t, http.StatusAccepted, s.command(m, p, "capture", "cu", `{"amount":"10.00"}`).Status)
	add("unknown", p)
	p = s.pay(m, "auth-void-unknown", manualBody("inv-auth-void-unknown", "20.00", payer)).json(t)["id"].(string)
	s.setFaults(`{"rules":[{"on":"void","action":"drop_response","count":1}]}`)
	require.Equal(t, http.StatusAccepted, s.command(m, p, "cancel", "vu", "").Status)
	add("unknown", p)
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	p = s.pay(m, "auto-unknown", payBody("inv-auto-unknown", "15.00", "TRY", payer)).json(t)["id"].(string)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "auto-unknown").Status == "unknown" }, 20*time.Second, 50*time.Millisecond)
	add("unknown", p)
	p = s.pay(m, "auth-waiting", manualBody("inv-auth-waiting", "12.00", payer)).json(t)["id"].(string)
	add("requires_capture", p)
	p = s.pay(m, "auth-canceled", manualBody("inv-auth-canceled", "11.00", payer)).json(t)["id"].(string)
	require.Equal(t, http.StatusOK, s.command(m, p, "cancel", "cx", "").Status)
	add("canceled", p)
	p = s.pay(m, "auth-captured", manualBody("inv-auth-captured", "9.00", payer)).json(t)["id"].(string)
	require.Equal(t, http.StatusCreated, s.command(m, p, "capture", "cc", "").Status)
	add("succeeded", p)

	for _, status := range []string{"unknown", "requires_capture", "canceled", "succeeded", "failed", "processing"} {
		for _, limit := range []int{100, 1} {
			var got []string
			after := ""
			for {
				q := fmt.Sprintf("/v1/payments?status=%s&limit=%d", status, limit)
				if after != "" {
					q += "&starting_after=" + after
				}
				r := s.do("GET", q, m.APIKey, "")
				require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
				page := r.json(t)
				for _, d := range page["data"].([]any) {
					got = append(got, d.(map[string]any)["id"].(string))
					require.Equal(t, status, d.(map[string]any)["status"])
					after = d.(map[string]any)["id"].(string)
				}
				if page["has_more"] != true {
					break
				}
			}
			want := ids[status]
			if want == nil {
				want = []string{}
			}
			if got == nil {
				got = []string{}
			}
			require.Equal(t, want, got, "status=%s limit=%d", status, limit)
		}
	}
}

// paidForFrom pays 5.00 from payer under key and returns the payment's id.
func (s *stack) paidForFrom(m merchant, payer, key string) string {
	s.t.Helper()
	r := s.pay(m, key, payBody("inv-"+key, "5.00", "TRY", payer))
	require.Equal(s.t, http.StatusCreated, r.Status, "%s", r.Body)
	return r.json(s.t)["id"].(string)
}

// The key and request rules of a payment's create hold for a capture and a cancel: a missing or
// malformed key, a body that is not JSON or too large, and a bad API key are refused before
// anything is written, and a key of 255 characters names a command.
func TestManualCommandKeyAndRequestRules(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "auth-rules", "50.00", "100.00")
	for _, command := range []string{"capture", "cancel"} {
		path := "/v1/payments/" + id + "/" + command
		requireProblem(t, s.do("POST", path, m.APIKey, ""), http.StatusBadRequest, "idempotency_key_missing")
		for _, key := range []string{"has space", strings.Repeat("k", 256), "tab\tkey", "é"} {
			requireProblem(t, s.do("POST", path, m.APIKey, "", "Idempotency-Key", key), http.StatusBadRequest, "idempotency_key_invalid")
		}
		requireProblem(t, s.do("POST", path, m.APIKey, `{}`, "Idempotency-Key", "k-"+command, "Content-Type", "text/plain"),
			http.StatusUnsupportedMediaType, "unsupported_media_type")
		big := `{"amount":"1` + strings.Repeat("0", 70000) + `"}`
		requireProblem(t, s.do("POST", path, m.APIKey, big, "Idempotency-Key", "k-"+command, "Content-Type", "application/json"),
			http.StatusRequestEntityTooLarge, "body_too_large")
		requireProblem(t, s.do("POST", path, "sk_wrong", "", "Idempotency-Key", "k-"+command), http.StatusUnauthorized, "unauthorized")
	}
	require.Equal(t, int64(5000), reserved(t, payer))
	require.Zero(t, s.held(id).CapturedMinor)
	require.False(t, s.held(id).Voided)
	r := s.command(m, id, "capture", strings.Repeat("k", 255), `{"amount":"5.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, int64(500), s.held(id).CapturedMinor)
}

// Past capture_before, while kasa's void of the authorization is still at the bank (the payment
// reads requires_capture), a cancel is refused as a capture is: 409 payment_not_cancelable,
// keeping no key; the void then cancels the payment (authorization_expired) and releases the hold.
func TestCancelPastCaptureBeforeIsRefused(t *testing.T) {
	gate := newBankGate("/void") // kasa's void waits at the bank until released
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, captureWindow: 3 * time.Second, bank: gate.wrap})
	t.Cleanup(gate.release)
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "auth-late-cancel", "40.00", "100.00")
	gate.waitArrived(t)
	p := s.do("GET", "/v1/payments/"+id, m.APIKey, "").json(t)
	require.Equal(t, "requires_capture", p["status"], "the void is at the bank")
	require.Equal(t, "0.00", p["capturable"])
	requireProblem(t, s.command(m, id, "cancel", "late-x", ""), http.StatusConflict, "payment_not_cancelable")
	gate.release()
	require.Eventually(t, func() bool {
		p = s.do("GET", "/v1/payments/"+id, m.APIKey, "").json(t)
		return p["status"] == "canceled"
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, "authorization_expired", p["failure_code"])
	require.True(t, s.held(id).Voided)
	require.Zero(t, reserved(t, payer))
	require.Equal(t, int64(10000), balance(t, payer))
	requireProblem(t, s.command(m, id, "cancel", "late-x", ""), http.StatusConflict, "payment_not_cancelable")
	requireVerified(t)
}

// A manual payment still being authorized (processing) takes neither a capture nor a cancel,
// and neither keeps its key: once authorized, the same keys capture and then cancel nothing.
func TestManualCommandsWhileAuthorizing(t *testing.T) {
	gate := newBankGate("/v1/authorizations") // the authorization waits at the bank until released
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, bank: gate.wrap})
	t.Cleanup(gate.release)
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	created := make(chan response, 1)
	go func() { created <- s.pay(m, "auth-slow", manualBody("inv-auth-slow", "30.00", payer)) }()
	gate.waitArrived(t)
	r := s.do("GET", "/v1/payments?idempotency_key=auth-slow", m.APIKey, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	id := r.json(t)["id"].(string)
	require.Equal(t, "processing", s.do("GET", "/v1/payments/"+id, m.APIKey, "").json(t)["status"])
	requireProblem(t, s.command(m, id, "capture", "slow-cap", `{"amount":"10.00"}`), http.StatusConflict, "payment_not_capturable")
	requireProblem(t, s.command(m, id, "cancel", "slow-x", ""), http.StatusConflict, "payment_not_cancelable")
	gate.release()
	r = <-created
	// Held at the bank, the authorization may outlast the create's sync wait on a loaded machine.
	require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, r.Status, "%s", r.Body)
	if r.Status == http.StatusCreated {
		require.Equal(t, "requires_capture", r.json(t)["status"])
	}
	require.Eventually(t, func() bool { return paymentByKey(t, m, "auth-slow").Status == payment.StatusRequiresCapture },
		30*time.Second, 50*time.Millisecond)
	c := s.command(m, id, "capture", "slow-cap", `{"amount":"10.00"}`)
	require.Equal(t, http.StatusCreated, c.Status, "the refused capture kept no key: %s", c.Body)
	require.Equal(t, int64(1000), s.held(id).CapturedMinor)
	requireProblem(t, s.command(m, id, "cancel", "slow-x", ""), http.StatusConflict, "payment_not_cancelable")
	require.Equal(t, int64(9000), balance(t, payer))
	require.Zero(t, reserved(t, payer))
	requireVerified(t)
}
