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
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/tools/banksim"
	"github.com/kasa-pay/kasa/workflows"
)

func manualBody(invoice, amount, account string) string {
	return fmt.Sprintf(`{"invoice_id":%q,"amount":%q,"currency":"TRY","account_id":%q,"capture":"manual"}`, invoice, amount, account)
}

func (s *stack) command(m merchant, paymentID, command, key, body string) response {
	s.t.Helper()
	headers := []string{"Idempotency-Key", key}
	if body != "" {
		headers = append(headers, "Content-Type", "application/json")
	}
	return s.do("POST", "/v1/payments/"+paymentID+"/"+command, m.APIKey, body, headers...)
}

// held is what the simulator did with the authorizations of a payment.
func (s *stack) held(paymentID string) banksim.Held {
	s.t.Helper()
	h, err := banksim.Control{URL: s.sim.URL}.Authorizations(context.Background(), paymentID)
	require.NoError(s.t, err)
	return h
}

// reserved is an account's held amount in minor units.
func reserved(t *testing.T, id string) int64 {
	t.Helper()
	a, err := db.Account(context.Background(), mustUUID(t, id))
	require.NoError(t, err)
	return a.Reserved
}

// authorize creates a manual payment of amount from a payer with deposit and checks it waits
// for its capture with the whole amount held, at the bank and on the payer.
func (s *stack) authorize(m merchant, key, amount, deposit string) (paymentID, payer string, answer response) {
	s.t.Helper()
	payer = s.newAccount(m, "TRY", deposit)
	r := s.pay(m, key, manualBody("inv-"+key, amount, payer))
	require.Equal(s.t, http.StatusCreated, r.Status, "%s", r.Body)
	p := r.json(s.t)
	require.Equal(s.t, "requires_capture", p["status"])
	require.Equal(s.t, "manual", p["capture"])
	require.Equal(s.t, amount, p["capturable"])
	require.Equal(s.t, "0.00", p["amount_captured"])
	require.NotEmpty(s.t, p["capture_before"])
	paymentID = p["id"].(string)
	require.Equal(s.t, 1, s.held(paymentID).Count, "one authorization at the bank")
	require.Zero(s.t, s.simCount(paymentID), "no charge")
	return paymentID, payer, r
}

// authorizeUnknown makes a manual payment of 25.00 from payer whose authorization's answer is
// lost at the bank, and waits until it is unknown; it returns the payment's id.
func (s *stack) authorizeUnknown(m merchant, key, payer string) string {
	s.t.Helper()
	s.setFaults(`{"rules":[{"on":"authorize","action":"drop_response","count":1}]}`)
	r := s.pay(m, key, manualBody("inv-"+key, "25.00", payer))
	require.Equal(s.t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Eventually(s.t, func() bool { return paymentByKey(s.t, m, key).Status == payment.StatusUnknown },
		20*time.Second, 50*time.Millisecond)
	return r.json(s.t)["id"].(string)
}

// requireOnlyMismatch requires an import's report to settle nothing and list one mismatch, of kind.
func requireOnlyMismatch(t *testing.T, answer response, kind string) {
	t.Helper()
	rep, ok := decodeReport(t, answer)
	require.False(t, ok, "%+v", rep)
	require.Empty(t, rep.Resolved, "%+v", rep)
	require.Len(t, rep.Mismatches, 1, "%+v", rep)
	require.Equal(t, kind, rep.Mismatches[0].Kind, "%+v", rep)
}

// A manual payment's authorization answers as a payment's charge does: 402 failed when the bank
// declines it (nothing held), 202 unknown when its answer is lost at a bank that cannot be asked
// (the hold kept); neither takes a capture or a cancel.
func TestManualAuthorizationDeclinedOrUnknown(t *testing.T) {
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()

	payer := s.newAccount(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"authorize","action":"decline","count":1}]}`)
	r := s.pay(m, "auth-declined", manualBody("inv-declined", "40.00", payer))
	require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
	declined := r.json(t)
	require.Equal(t, "failed", declined["status"])
	require.Zero(t, reserved(t, payer), "a declined authorization holds nothing")

	payer2 := s.newAccount(m, "TRY", "100.00")
	lost := s.do("GET", "/v1/payments/"+s.authorizeUnknown(m, "auth-lost", payer2), m.APIKey, "").json(t)
	require.Equal(t, "unknown", lost["status"])
	require.Equal(t, int64(2500), reserved(t, payer2), "an unknown authorization keeps its hold")
	require.Equal(t, 1, s.held(lost["id"].(string)).Count, "authorized once at the bank")

	for _, p := range []map[string]any{declined, lost} {
		id := p["id"].(string)
		c := s.command(m, id, "capture", "cap-"+id, "")
		requireProblem(t, c, http.StatusConflict, "payment_not_capturable")
		x := s.command(m, id, "cancel", "x-"+id, "")
		requireProblem(t, x, http.StatusConflict, "payment_not_cancelable")
	}
	require.Zero(t, s.held(lost["id"].(string)).CapturedMinor)
	require.Equal(t, int64(2500), reserved(t, payer2))
	requireVerified(t)
}

// A settlement file that lists a capture for a payment whose authorization is unknown says the
// bank moved money kasa never asked it to capture: a mismatch, and the payment stays unknown with
// its hold (it is not taken as authorized, which would let the merchant capture again).
func TestManualUnknownAuthorizationListedAsCaptured(t *testing.T) {
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	id := s.authorizeUnknown(m, "auth-listed", payer)

	file := "settlement_date,provider_charge_id,reference,amount,currency,status,type\n" +
		today() + ",cp_listed," + id + ",25.00,TRY,settled,capture\n"
	requireOnlyMismatch(t, s.importSettlements(m, file), reconcile.KindAmountDiffers)
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "auth-listed").Status)
	require.Equal(t, int64(2500), reserved(t, payer), "the hold kept")
	require.Zero(t, s.held(id).CapturedMinor)
	requireVerified(t)
}

// A capture's key while its first request runs is in use: 409 idempotency_key_in_use, nothing
// sent twice; the first request then answers 201.
func TestManualCommandKeyInUse(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	paymentID, _, _ := s.authorize(m, "auth-in-use", "50.00", "100.00")
	s.setFaults(`{"rules":[{"on":"capture","action":"delay","delay_ms":2000,"count":1}]}`)
	first := make(chan response, 1)
	go func() { first <- s.command(m, paymentID, "capture", "in-use-1", `{"amount":"20.00"}`) }()
	require.Eventually(t, func() bool { // the first request holds the key
		_, err := db.Command(context.Background(), mustUUID(t, m.ID), "in-use-1")
		return err == nil
	}, 2*time.Second, 5*time.Millisecond)
	r := s.command(m, paymentID, "capture", "in-use-1", `{"amount":"20.00"}`)
	requireProblem(t, r, http.StatusConflict, "idempotency_key_in_use")
	r = <-first
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, int64(2000), s.held(paymentID).CapturedMinor, "captured once")
}

// A manual payment through the running system: authorized and held, captured in part once (the
// rest released at the bank and on the payer), every key rule on the capture, and refunds
// bounded by what was captured.
func TestManualCaptureEndToEnd(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	paymentID, payer, first := s.authorize(m, "auth-1", "100.00", "500.00")
	require.Equal(t, int64(50000), balance(t, payer))
	require.Equal(t, int64(10000), reserved(t, payer), "the authorization holds its amount")

	again := s.pay(m, "auth-1", manualBody("inv-auth-1", "100.00", payer))
	require.Equal(t, http.StatusCreated, again.Status)
	require.Equal(t, string(first.Body), string(again.Body), "the create replays byte for byte")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, http.StatusUnprocessableEntity, s.pay(m, "auth-1", payBody("inv-auth-1", "100.00", "TRY", payer)).Status,
		"capture is part of the request hash")

	waiting := s.do("GET", "/v1/payments?status=requires_capture", m.APIKey, "").json(t)["data"].([]any)
	require.Len(t, waiting, 1, "the list filters by the new status")
	require.Equal(t, paymentID, waiting[0].(map[string]any)["id"])

	over := s.command(m, paymentID, "capture", "cap-over", `{"amount":"100.01"}`)
	requireProblem(t, over, http.StatusConflict, "capture_exceeds_capturable")
	require.Equal(t, "100.00", over.json(t)["capturable"])

	c := s.command(m, paymentID, "capture", "cap-1", `{"amount":"60.00"}`)
	require.Equal(t, http.StatusCreated, c.Status, "%s", c.Body)
	p := c.json(t)
	require.Equal(t, "succeeded", p["status"])
	require.Equal(t, "60.00", p["amount_captured"])
	require.Equal(t, "0.00", p["capturable"])
	require.Equal(t, int64(6000), s.held(paymentID).CapturedMinor, "the bank captured 60.00 once")
	require.Equal(t, int64(44000), balance(t, payer), "the payer paid what was captured")
	require.Zero(t, reserved(t, payer), "the rest of the hold is released")
	entries, err := db.LedgerEntries(context.Background(), paymentID)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	for _, e := range entries {
		require.Contains(t, []int64{6000, -6000}, e.AmountMinor)
	}

	replay := s.command(m, paymentID, "capture", "cap-1", `{"amount":"60"}`)
	require.Equal(t, http.StatusCreated, replay.Status)
	require.Equal(t, string(c.Body), string(replay.Body))
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	require.Equal(t, http.StatusUnprocessableEntity, s.command(m, paymentID, "capture", "cap-1", `{"amount":"50.00"}`).Status)
	require.Equal(t, http.StatusUnprocessableEntity, s.command(m, paymentID, "cancel", "cap-1", "").Status,
		"one key space for captures and cancels")
	twice := s.command(m, paymentID, "capture", "cap-2", `{}`)
	requireProblem(t, twice, http.StatusConflict, "payment_not_capturable")
	cancel := s.command(m, paymentID, "cancel", "cancel-1", "")
	requireProblem(t, cancel, http.StatusConflict, "payment_not_cancelable")
	require.Equal(t, int64(6000), s.held(paymentID).CapturedMinor, "nothing more was captured")

	r := s.refund(m, paymentID, "ref-over", `{"amount":"60.01"}`)
	require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
	require.Equal(t, "60.00", r.json(t)["refundable"], "refunds give back at most what was captured")
	r = s.refund(m, paymentID, "ref-all", `{}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "60.00", r.json(t)["amount"])
	require.Equal(t, int64(50000), balance(t, payer))

	got := s.do("GET", "/v1/payments?status=succeeded", m.APIKey, "")
	require.Equal(t, http.StatusOK, got.Status)
	requireVerified(t)
}

// A cancel voids at the bank and releases the hold; a capture after it is refused; an
// authorization nobody captures is voided at its capture_before.
func TestManualCancelAndExpiry(t *testing.T) {
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityInquiry, temporal: tc, captureWindow: 3 * time.Second})
	m := s.newMerchant()

	canceled, payer, _ := s.authorize(m, "auth-c", "40.00", "100.00")
	r := s.command(m, canceled, "cancel", "x-1", "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, "canceled", r.json(t)["status"])
	require.Equal(t, "canceled", r.json(t)["failure_code"])
	require.True(t, s.held(canceled).Voided)
	require.Zero(t, s.held(canceled).CapturedMinor)
	require.Zero(t, reserved(t, payer))
	require.Equal(t, int64(10000), balance(t, payer))
	again := s.command(m, canceled, "cancel", "x-1", "{}")
	require.Equal(t, http.StatusOK, again.Status, "an empty body and {} are one request")
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	late := s.command(m, canceled, "capture", "c-late", "")
	requireProblem(t, late, http.StatusConflict, "payment_not_capturable")

	expiring, payer2, _ := s.authorize(m, "auth-e", "25.00", "100.00")
	require.Equal(t, int64(2500), reserved(t, payer2))
	var p map[string]any
	require.Eventually(t, func() bool {
		p = s.do("GET", "/v1/payments/"+expiring, m.APIKey, "").json(t)
		return p["status"] == "canceled"
	}, 60*time.Second, 100*time.Millisecond)
	require.Equal(t, "authorization_expired", p["failure_code"])
	before, err := time.Parse(time.RFC3339Nano, p["capture_before"].(string))
	require.NoError(t, err)
	updated, err := time.Parse(time.RFC3339Nano, p["updated_at"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, before, updated, time.Minute, "released within a minute of capture_before")
	require.True(t, s.held(expiring).Voided)
	require.Zero(t, reserved(t, payer2))
	late = s.command(m, expiring, "capture", "c-expired", "")
	requireProblem(t, late, http.StatusConflict, "payment_not_capturable")
	list := s.do("GET", "/v1/payments?status=canceled", m.APIKey, "").json(t)
	require.Len(t, list["data"], 2)
	requireVerified(t)
}

// The bank's answer to a capture, and to a void, is lost once, under each capability: never a
// second capture; the idempotent bank's retry and the inquiry's answer decide; without either,
// the payment is unknown with its hold kept until a settlement says what the bank did.
func TestManualCaptureAndVoidAnswersLost(t *testing.T) {
	for _, c := range workflows.Capabilities {
		t.Run(string(c), func(t *testing.T) {
			s := newStack(t, c)
			m := s.newMerchant()

			captured, payer, _ := s.authorize(m, "auth-cap", "80.00", "100.00")
			s.setFaults(`{"rules":[{"on":"capture","action":"drop_response","count":1}]}`)
			r := s.command(m, captured, "capture", "cap-1", `{"amount":"30.00"}`)
			require.Equal(t, int64(3000), s.held(captured).CapturedMinor, "the bank captured once")
			if c == workflows.CapabilityNone {
				require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
				require.Equal(t, "unknown", r.json(t)["status"])
				require.Equal(t, int64(8000), reserved(t, payer), "an unknown capture keeps the hold")
				status, err := workflows.Starter{Client: tc}.Settle(context.Background(), workflows.PaymentWorkflowID(mustUUID(t, m.ID), "auth-cap"),
					workflows.Settlement{Outcome: workflows.OutcomeCharged, Note: "test"})
				require.NoError(t, err)
				require.Equal(t, "succeeded", status)
				r = s.command(m, captured, "capture", "cap-1", `{"amount":"30.00"}`)
			}
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			require.Equal(t, "30.00", r.json(t)["amount_captured"])
			require.Equal(t, int64(7000), balance(t, payer))
			require.Zero(t, reserved(t, payer))
			require.Equal(t, int64(3000), s.held(captured).CapturedMinor, "never captured twice")

			voided, payer2, _ := s.authorize(m, "auth-void", "50.00", "100.00")
			s.setFaults(`{"rules":[{"on":"void","action":"drop_response","count":1}]}`)
			r = s.command(m, voided, "cancel", "x-1", "")
			require.True(t, s.held(voided).Voided)
			if c == workflows.CapabilityNone {
				require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
				require.Equal(t, "unknown", r.json(t)["status"])
				require.Equal(t, int64(5000), reserved(t, payer2), "an unknown void keeps the hold")
				status, err := workflows.Starter{Client: tc}.Settle(context.Background(), workflows.PaymentWorkflowID(mustUUID(t, m.ID), "auth-void"),
					workflows.Settlement{Outcome: workflows.OutcomeNotCharged, Note: "test"})
				require.NoError(t, err)
				require.Equal(t, "canceled", status)
				r = s.command(m, voided, "cancel", "x-1", "")
			}
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			require.Equal(t, "canceled", r.json(t)["status"])
			require.Zero(t, reserved(t, payer2))
			require.Equal(t, int64(10000), balance(t, payer2))
			requireVerified(t)
		})
	}
}

// Captures racing each other and a cancel, each under its own key: one command wins, the bank
// captures at most once, and the hold is either posted or released, never both.
func TestManualCommandsRace(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-race", "90.00", "100.00")
	type answer struct {
		command string
		status  int
	}
	answers := make(chan answer, 6)
	for i := range 6 {
		command, body := "capture", fmt.Sprintf(`{"amount":"%d.00"}`, 10+i)
		if i%3 == 2 {
			command, body = "cancel", ""
		}
		go func() {
			r := s.command(m, paymentID, command, fmt.Sprintf("race-%d", i), body)
			answers <- answer{command, r.Status}
		}()
	}
	won := 0
	for range 6 {
		a := <-answers
		switch a.status {
		case http.StatusCreated, http.StatusOK:
			won++
		case http.StatusConflict:
		default:
			t.Fatalf("%s answered %d", a.command, a.status)
		}
	}
	require.Equal(t, 1, won, "exactly one command wins")
	p := s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)
	held := s.held(paymentID)
	require.Zero(t, reserved(t, payer), "the hold is gone either way")
	if p["status"] == "succeeded" {
		require.Equal(t, p["amount_captured"], fmt.Sprintf("%d.00", held.CapturedMinor/100))
		require.False(t, held.Voided)
		require.Equal(t, int64(10000)-held.CapturedMinor, balance(t, payer))
	} else {
		require.Equal(t, "canceled", p["status"])
		require.True(t, held.Voided)
		require.Zero(t, held.CapturedMinor)
		require.Equal(t, int64(10000), balance(t, payer))
	}
	requireVerified(t)
}

// A capture that never reached the payment's workflow is not answered with another key's: once
// a second key captured, the first, retried, did nothing and is refused; so is a cancel's.
func TestManualCommandAnsweredOnlyForItsOwnEffect(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-own", "80.00", "100.00")

	s.commandFaults.add(commandLost, commandLost)
	r := s.command(m, paymentID, "capture", "own-1", `{"amount":"30.00"}`)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	r = s.command(m, paymentID, "cancel", "own-x", "")
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	r = s.command(m, paymentID, "capture", "own-2", `{"amount":"50.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "50.00", r.json(t)["amount_captured"])

	for range 2 { // the refusal is not stored: the key is free, and says the same again
		r = s.command(m, paymentID, "capture", "own-1", `{"amount":"30.00"}`)
		requireProblem(t, r, http.StatusConflict, "payment_not_capturable")
		r = s.command(m, paymentID, "cancel", "own-x", "")
		requireProblem(t, r, http.StatusConflict, "payment_not_cancelable")
	}
	r = s.command(m, paymentID, "capture", "own-2", `{"amount":"50.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
	require.Equal(t, int64(5000), s.held(paymentID).CapturedMinor, "captured once, 50.00")
	require.Equal(t, int64(5000), balance(t, payer))
	require.Zero(t, reserved(t, payer))
	requireVerified(t)
}

// While one key's capture is unknown, another key whose request never reached the workflow is
// refused when retried: it is not that capture, and is not answered 202 as if it were.
func TestManualCommandRetriedBesideAnUnknownCapture(t *testing.T) {
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-beside", "80.00", "100.00")
	s.commandFaults.add(commandLost)
	r := s.command(m, paymentID, "capture", "beside-lost", `{"amount":"10.00"}`)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	s.setFaults(`{"rules":[{"on":"capture","action":"drop_response","count":1}]}`)
	r = s.command(m, paymentID, "capture", "beside-unknown", `{"amount":"30.00"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Equal(t, "unknown", r.json(t)["status"])

	r = s.command(m, paymentID, "capture", "beside-lost", `{"amount":"10.00"}`)
	requireProblem(t, r, http.StatusConflict, "payment_not_capturable")
	r = s.command(m, paymentID, "capture", "beside-unknown", `{"amount":"30.00"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "the unknown capture's own key: still in flight: %s", r.Body)
	require.Equal(t, int64(8000), reserved(t, payer), "the unknown capture keeps the hold")
	require.Equal(t, int64(3000), s.held(paymentID).CapturedMinor, "captured once, by the unknown key")
}

// A capture the workflow took, whose answer was lost, retried while the bank still works on it
// and re-sent to Temporal only once the workflow has ended (which refuses every update): the
// capture was this key's, so its key answers 201, then replays it, never 409.
func TestManualCommandRetriedAfterItsWorkflowEnded(t *testing.T) {
	captureRetriedAsItsWorkflowEnds(t, commandAfterEnd)
}

// A capture the workflow took, whose answer was lost, retried while the payment still read as
// waiting and refused by Temporal once the workflow had ended (it took the capture in an earlier
// run): the capture was this key's, so it answers 201, never 409.
func TestManualCommandForgottenByItsEndedWorkflowIsAnswered(t *testing.T) {
	captureRetriedAsItsWorkflowEnds(t, commandForgotten)
}

// captureRetriedAsItsWorkflowEnds loses the answer to a capture the workflow took (the bank
// slow), then retries it while the payment still waits, the retry reaching Temporal as fault
// says once the workflow has ended: the retry answers 201, then replays it.
func captureRetriedAsItsWorkflowEnds(t *testing.T, fault string) {
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-ended", "80.00", "100.00")
	s.setFaults(`{"rules":[{"on":"capture","action":"delay","delay_ms":2000,"count":1}]}`)

	s.commandFaults.add(commandAnswerLost, fault)
	r := s.command(m, paymentID, "capture", "ended-1", `{"amount":"30.00"}`)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	r = s.command(m, paymentID, "capture", "ended-1", `{"amount":"30.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "30.00", r.json(t)["amount_captured"])
	again := s.command(m, paymentID, "capture", "ended-1", `{"amount":"30.00"}`)
	require.Equal(t, string(r.Body), string(again.Body))
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, int64(3000), s.held(paymentID).CapturedMinor, "captured once")
	require.Equal(t, int64(7000), balance(t, payer))
	requireVerified(t)
}

// An unknown capture is settled by the bank's settlement file when it lists what kasa asked the
// bank to capture: posted once. A listed amount of any other size is a mismatch, and the payment
// stays unknown with its whole hold, for an operator (docs/reconciliation.md).
func TestManualUnknownCaptureSettledByFile(t *testing.T) {
	for _, tc := range []struct {
		name, listed string
		settled      bool
	}{
		{"the amount kasa asked for", "25.00", true},
		{"the whole authorization", "70.00", false},
		{"less", "10.00", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, workflows.CapabilityNone)
			m := s.newMerchant()
			paymentID, payer, _ := s.authorize(m, "auth-file", "70.00", "100.00")
			s.setFaults(`{"rules":[{"on":"capture","action":"drop_response","count":1}]}`)
			r := s.command(m, paymentID, "capture", "cap-file", `{"amount":"25.00"}`)
			require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
			require.Equal(t, "unknown", r.json(t)["status"])
			file, line := s.settlementFile(today()), paymentID+",25.00,TRY,settled,capture"
			require.Contains(t, file, line)
			file = strings.Replace(file, line, paymentID+","+tc.listed+",TRY,settled,capture", 1)
			answer := s.importSettlements(m, file)
			if !tc.settled {
				requireOnlyMismatch(t, answer, reconcile.KindAmountDiffers)
				p := paymentByKey(t, m, "auth-file")
				require.Equal(t, payment.StatusUnknown, p.Status)
				require.Zero(t, p.CapturedMinor)
				require.Equal(t, int64(10000), balance(t, payer), "nothing posted")
				require.Equal(t, int64(7000), reserved(t, payer), "the whole hold kept")
				return
			}
			rep, ok := decodeReport(t, answer)
			require.True(t, ok, "%+v", rep)
			require.Len(t, rep.Resolved, 1, "%+v", rep)
			require.Empty(t, rep.Mismatches)
			require.Eventually(t, func() bool { return paymentByKey(t, m, "auth-file").Status == "succeeded" }, 10*time.Second, 50*time.Millisecond)
			require.Equal(t, int64(2500), paymentByKey(t, m, "auth-file").CapturedMinor)
			require.Equal(t, int64(7500), balance(t, payer))
			require.Zero(t, reserved(t, payer))
			r = s.command(m, paymentID, "capture", "cap-file", `{"amount":"25.00"}`)
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			requireVerified(t)
		})
	}
}

// A bank without idempotency loses the answer to a cancel's void; its settlement file then lists a
// capture of 25.00: the bank's word that the money moved. The import posts that capture (the
// payment succeeds, the rest of the hold is released), once, and the ledger checks out.
func TestReconcileListedCaptureSettlesAnUnknownVoid(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "auth-void-lost", "70.00", "100.00")
	s.setFaults(`{"rules":[{"on":"void","action":"drop_response","count":1}]}`)
	r := s.command(m, id, "cancel", "void-lost", "")
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "auth-void-lost").Status)

	file := "settlement_date,provider_charge_id,reference,amount,currency,status,type\n" +
		today() + ",cp_listed," + id + ",25.00,TRY,settled,capture\n"
	rep, _ := decodeReport(t, s.importSettlements(m, file))
	require.Empty(t, rep.Mismatches)
	require.Equal(t, 1, rep.Counts.ResolvedCharged)
	p := paymentByKey(t, m, "auth-void-lost")
	require.Equal(t, payment.StatusSucceeded, p.Status)
	require.Equal(t, int64(2500), p.CapturedMinor)
	require.Zero(t, reserved(t, payer), "the rest of the hold released")
	again, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok, "%+v", again)
	require.Equal(t, 1, again.Counts.Matched, "imported again: matched, nothing posted twice")
	requireVerified(t)
}

// A cancel's void never reaches a bank that can be asked (three sends, each a 500, each inquiry
// finding the authorization open): the payment is unknown. The reconciliation team's
// not_charged (nothing was captured) sends the void once more before the hold is released, so
// the payer's money is let go at the bank too, not blocked there until the authorization expires.
func TestUnknownVoidSettledNotChargedIsVoidedAtTheBank(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityInquiry, temporal: tc, bookingWindow: 100 * time.Millisecond})
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "auth-void-open", "70.00", "100.00")
	s.setFaults(`{"rules":[{"on":"void","action":"error_500","count":3}]}`)
	r := s.command(m, id, "cancel", "void-open", "")
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "auth-void-open").Status == payment.StatusUnknown },
		30*time.Second, 100*time.Millisecond)
	require.False(t, s.held(id).Voided, "the authorization is still open at the bank")

	status, err := workflows.Starter{Client: tc}.Settle(context.Background(), workflows.PaymentWorkflowID(mustUUID(t, m.ID), "auth-void-open"),
		workflows.Settlement{Outcome: workflows.OutcomeNotCharged, OperationID: mustUUID(t, id), Note: "test: the file lists no capture"})
	require.NoError(t, err)
	require.Equal(t, "canceled", status)
	require.True(t, s.held(id).Voided, "voided at the bank")
	require.Zero(t, reserved(t, payer))
	require.Equal(t, int64(10000), balance(t, payer))
	requireVerified(t)
}

// With inquiry, an authorization whose three sends each got a 500 (none reached the bank) is
// unknown until the bank, asked once the booking window has passed, still holds none: the
// payment then fails and its hold is released, with no person to settle it (no settlement file
// lists authorizations).
func TestUnknownAuthorizationTheBankNeverMadeFails(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityInquiry, temporal: tc, bookingWindow: 100 * time.Millisecond})
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"authorize","action":"error_500","count":3}]}`)
	r := s.pay(m, "auth-never", manualBody("inv-auth-never", "25.00", payer))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	id := r.json(t)["id"].(string)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "auth-never").Status == payment.StatusFailed },
		60*time.Second, 200*time.Millisecond)
	p := paymentByKey(t, m, "auth-never")
	require.Equal(t, payment.FailureDeclined, p.FailureCode)
	require.Zero(t, s.held(id).Count, "the bank holds no authorization")
	require.Zero(t, reserved(t, payer), "the hold released")
	require.Equal(t, int64(10000), balance(t, payer))
	requireVerified(t)
}

// A capture whose request never reached the payment's workflow (503) must not be answered 201
// when the payment later succeeds because the bank captured the authorization a cancel was
// voiding: that capture was never sent to the bank.
func TestLostCaptureIsNotAnsweredForAVoidSettledAsCaptured(t *testing.T) {
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	id, _, _ := s.authorize(m, "auth-lost-lost", "70.00", "100.00")

	s.commandFaults.add(commandLost)
	r := s.command(m, id, "capture", "lost-lost-capture", `{"amount":"10.00"}`)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)

	s.setFaults(`{"rules":[{"on":"void","action":"drop_response","count":1}]}`)
	r = s.command(m, id, "cancel", "lost-cancel", "")
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)

	file := "settlement_date,provider_charge_id,reference,amount,currency,status,type\n" +
		today() + ",cp_listed," + id + ",25.00,TRY,settled,capture\n"
	rep, _ := decodeReport(t, s.importSettlements(m, file))
	require.Empty(t, rep.Mismatches)
	p := paymentByKey(t, m, "auth-lost-lost")
	require.Equal(t, payment.StatusSucceeded, p.Status)
	require.Equal(t, int64(0), s.held(id).CapturedMinor, "kasa never sent a capture to the bank")

	r = s.command(m, id, "capture", "lost-lost-capture", `{"amount":"10.00"}`)
	requireProblem(t, r, http.StatusConflict, "payment_not_capturable")
}

// A cancel the workflow took and sent to the bank as a void names that cancel for good: once
// the bank's file says it captured the authorization instead, the cancel's key is not forgotten
// and cannot name a capture of another payment.
func TestCancelThatReachedTheBankKeepsItsKey(t *testing.T) {
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	id, _, _ := s.authorize(m, "auth-lost-a", "70.00", "100.00")
	other, _, _ := s.authorize(m, "auth-lost-b", "30.00", "100.00")

	s.setFaults(`{"rules":[{"on":"void","action":"drop_response","count":1}]}`)
	r := s.command(m, id, "cancel", "lost-k2", "")
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.True(t, s.held(id).Voided, "the void reached the bank")

	file := "settlement_date,provider_charge_id,reference,amount,currency,status,type\n" +
		today() + ",cp_listed," + id + ",25.00,TRY,settled,capture\n"
	rep, _ := decodeReport(t, s.importSettlements(m, file))
	require.Empty(t, rep.Mismatches)
	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "auth-lost-a").Status)

	r = s.command(m, id, "cancel", "lost-k2", "")
	requireProblem(t, r, http.StatusConflict, "payment_not_cancelable")
	r = s.command(m, other, "capture", "lost-k2", "")
	require.Equal(t, http.StatusUnprocessableEntity, r.Status, "the key named the cancel that was sent to the bank")
}

// The same with the expiry's void: a capture that never reached the workflow is answered 201
// once the bank's file lists a capture of the authorization kasa was voiding at capture_before.
func TestLostCaptureIsNotAnsweredForAnExpiryVoidSettledAsCaptured(t *testing.T) {
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityNone, temporal: tc, captureWindow: 3 * time.Second})
	m := s.newMerchant()
	id, _, _ := s.authorize(m, "auth-lost-exp", "70.00", "100.00")
	s.commandFaults.add(commandLost)
	r := s.command(m, id, "capture", "lost-exp-capture", `{"amount":"10.00"}`)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	s.setFaults(`{"rules":[{"on":"void","action":"drop_response","count":1}]}`)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "auth-lost-exp").Status == payment.StatusUnknown },
		30*time.Second, 100*time.Millisecond)
	file := "settlement_date,provider_charge_id,reference,amount,currency,status,type\n" +
		today() + ",cp_listed," + id + ",25.00,TRY,settled,capture\n"
	rep, _ := decodeReport(t, s.importSettlements(m, file))
	require.Empty(t, rep.Mismatches)
	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "auth-lost-exp").Status)
	r = s.command(m, id, "capture", "lost-exp-capture", `{"amount":"10.00"}`)
	requireProblem(t, r, http.StatusConflict, "payment_not_capturable")
}

// While a capture is under way (sent to the bank, its answer awaited; then parked unknown as the
// bank never answers) the payment reads requires_capture, then unknown, and nothing is
// capturable: GET, the list and the lookup by key all show capturable 0.00, never the authorized
// amount the capture is taking.
func TestCapturableWhileACaptureIsInFlight(t *testing.T) {
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-inflight", "70.00", "100.00")
	views := func() []map[string]any {
		t.Helper()
		one := s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)
		byKey := s.do("GET", "/v1/payments?idempotency_key=auth-inflight", m.APIKey, "").json(t)
		list := s.do("GET", "/v1/payments", m.APIKey, "").json(t)["data"].([]any)
		require.Len(t, list, 1)
		return []map[string]any{one, byKey, list[0].(map[string]any)}
	}

	s.setFaults(`{"rules":[{"on":"capture","action":"hang","count":1}]}`)
	answer := make(chan response, 1)
	go func() { answer <- s.command(m, paymentID, "capture", "cap-inflight", `{"amount":"50.00"}`) }()
	require.Eventually(t, func() bool { // the capture reached the workflow, which sends it
		_, err := db.Command(context.Background(), mustUUID(t, m.ID), "cap-inflight")
		return err == nil
	}, 5*time.Second, 5*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	for _, p := range views() {
		require.Equal(t, "requires_capture", p["status"], "the bank has not answered yet")
		require.Equal(t, "0.00", p["capturable"], "a capture in flight takes the authorization: nothing is left to capture")
	}
	other := s.command(m, paymentID, "capture", "cap-other", `{"amount":"10.00"}`)
	requireProblem(t, other, http.StatusConflict, "payment_not_capturable")

	r := <-answer
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Equal(t, "unknown", r.json(t)["status"])
	require.Equal(t, "0.00", r.json(t)["capturable"])
	for _, p := range views() {
		require.Equal(t, "unknown", p["status"])
		require.Equal(t, "0.00", p["capturable"], "an unknown capture keeps the hold, and nothing is capturable")
	}
	require.Equal(t, int64(7000), reserved(t, payer), "the hold is kept")
	require.Zero(t, s.held(paymentID).CapturedMinor, "the bank never took the capture")
	requireVerified(t)
}

// A capture or cancel Temporal took, but answered only after the sync wait, is in flight (its call
// is at the bank): the API asks Temporal whether it took it and answers 202 with the payment, as
// for any command in flight, never 503; its key answers so again while the bank works, then with
// what the command did, done once at the bank and in the balances.
func TestManualCommandTakenButAnsweredLate(t *testing.T) {
	for _, c := range []struct {
		command, body, bankPath string
		done                    int    // the command's answer once the bank has done it
		status                  string // and the payment's status then
		captured, balance       int64  // at the bank, and the payer's balance
	}{
		{"capture", `{"amount":"30.00"}`, "/capture", http.StatusCreated, "succeeded", 3000, 7000},
		{"cancel", "", "/void", http.StatusOK, "canceled", 0, 10000},
	} {
		t.Run(c.command, func(t *testing.T) {
			gate := newBankGate(c.bankPath)
			s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, bank: gate.wrap, syncWait: time.Second})
			t.Cleanup(gate.release)
			m := s.newMerchant()
			paymentID, payer, _ := s.authorize(m, "auth-late", "80.00", "100.00")

			s.commandFaults.add(commandAcceptedLate)
			for i, what := range []string{"the first answer", "its key's retry"} {
				r := s.command(m, paymentID, c.command, "late-1", c.body)
				require.Equal(t, http.StatusAccepted, r.Status, "%s: %s", what, r.Body)
				require.NotEmpty(t, r.Header.Get("Retry-After"), what)
				require.Equal(t, "/v1/payments/"+paymentID, r.Header.Get("Location"), what)
				require.Empty(t, r.Header.Get("Idempotent-Replayed"), "a 202 is never stored")
				p := r.json(t)
				require.Equal(t, paymentID, p["id"], what)
				require.Equal(t, "requires_capture", p["status"], "%s: the bank has not answered yet", what)
				require.Equal(t, "0.00", p["capturable"], "%s: a command in flight takes the authorization", what)
				require.Equal(t, "0.00", p["amount_captured"], what)
				if i == 0 {
					gate.waitArrived(t)
				}
				cmd, err := db.Command(context.Background(), mustUUID(t, m.ID), "late-1")
				require.NoError(t, err)
				require.False(t, cmd.Answered(), "%s: nothing is stored while the command is in flight", what)
			}
			requireProblem(t, s.command(m, paymentID, "capture", "late-other", ""), http.StatusConflict, "payment_not_capturable")
			require.Equal(t, int64(8000), reserved(t, payer), "the hold is kept while the bank works")

			gate.release()
			var r response
			require.Eventually(t, func() bool {
				r = s.command(m, paymentID, c.command, "late-1", c.body)
				return r.Status != http.StatusAccepted
			}, 30*time.Second, 100*time.Millisecond)
			require.Equal(t, c.done, r.Status, "%s", r.Body)
			require.Equal(t, c.status, r.json(t)["status"])
			again := s.command(m, paymentID, c.command, "late-1", c.body)
			require.Equal(t, c.done, again.Status)
			require.Equal(t, string(r.Body), string(again.Body))
			require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))

			held := s.held(paymentID)
			require.Equal(t, 1, held.Count, "authorized once")
			require.Equal(t, c.captured, held.CapturedMinor, "done once at the bank")
			require.Equal(t, c.command == "cancel", held.Voided)
			require.Equal(t, c.balance, balance(t, payer))
			require.Zero(t, reserved(t, payer), "the hold is posted or released")
			requireVerified(t)
		})
	}
}

// A capture or cancel that did not reach Temporal before the sync wait ended is not in flight:
// 503 unavailable, nothing moved at the bank or on the payer, and a retry with its key then
// does the command once.
func TestManualCommandTemporalNeverTookAnswers503(t *testing.T) {
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, syncWait: time.Second})
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-unsent", "80.00", "100.00")

	for _, command := range []string{"capture", "cancel"} {
		s.commandFaults.add(commandUnsent)
		r := s.command(m, paymentID, command, "unsent-"+command, "")
		requireProblem(t, r, http.StatusServiceUnavailable, "unavailable")
		require.NotEmpty(t, r.Header.Get("Retry-After"))
	}
	p := s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)
	require.Equal(t, "requires_capture", p["status"])
	held := s.held(paymentID)
	require.Zero(t, held.CapturedMinor, "nothing captured")
	require.False(t, held.Voided, "nothing voided")
	require.Equal(t, int64(8000), reserved(t, payer), "the hold is kept")
	require.Equal(t, int64(10000), balance(t, payer))

	r := s.command(m, paymentID, "capture", "unsent-capture", "")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "80.00", r.json(t)["amount_captured"])
	r = s.command(m, paymentID, "cancel", "unsent-cancel", "")
	requireProblem(t, r, http.StatusConflict, "payment_not_cancelable")
	require.Equal(t, int64(8000), s.held(paymentID).CapturedMinor, "captured once")
	require.Equal(t, int64(2000), balance(t, payer))
	require.Zero(t, reserved(t, payer))
	requireVerified(t)
}

// Past capture_before a capture is refused although the payment reads requires_capture until its
// void is done: nothing is capturable from that moment on.
func TestCapturableEndsWithTheCaptureWindow(t *testing.T) {
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityNone, temporal: tc, captureWindow: 3 * time.Second})
	m := s.newMerchant()
	s.setFaults(`{"rules":[{"on":"void","action":"hang","count":1}]}`)
	paymentID, payer, _ := s.authorize(m, "auth-window", "40.00", "100.00")
	var p map[string]any
	require.Eventually(t, func() bool { // the window is over, and the void still awaits its answer
		p = s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)
		return s.held(paymentID).Voided || time.Now().After(mustTime(t, p["capture_before"].(string)).Add(500*time.Millisecond))
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, "requires_capture", p["status"], "the void is still awaited")
	require.Equal(t, "0.00", p["capturable"], "past capture_before nothing is capturable")
	late := s.command(m, paymentID, "capture", "cap-late", "")
	requireProblem(t, late, http.StatusConflict, "payment_not_capturable")
	require.Equal(t, int64(4000), reserved(t, payer), "the hold stays until the void is decided")
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	return at
}
