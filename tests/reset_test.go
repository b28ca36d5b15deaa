package tests

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// lastWorkflowTask is the id of the workflow's last WorkflowTaskCompleted event (0: none yet).
func lastWorkflowTask(t *testing.T, wfID string) int64 {
	t.Helper()
	return lastWorkflowTaskBefore(t, wfID, enums.EVENT_TYPE_UNSPECIFIED) // no event has that type
}

// lastWorkflowTaskBefore is the id of the workflow's last WorkflowTaskCompleted event before its
// first event of type before (0: none).
func lastWorkflowTaskBefore(t *testing.T, wfID string, before enums.EventType) int64 {
	t.Helper()
	var last int64
	it := tc.GetWorkflowHistory(context.Background(), wfID, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		require.NoError(t, err)
		if e.GetEventType() == before {
			break
		}
		if e.GetEventType() == enums.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			last = e.GetEventId()
		}
	}
	return last
}

// resetTo resets the workflow to the end of the workflow task completed as event id.
func resetTo(t *testing.T, wfID string, id int64, reason string) {
	t.Helper()
	require.NotZero(t, id, "no workflow task completed")
	_, err := tc.WorkflowService().ResetWorkflowExecution(context.Background(), &workflowservice.ResetWorkflowExecutionRequest{
		Namespace: "default", WorkflowExecution: &commonpb.WorkflowExecution{WorkflowId: wfID},
		Reason: reason, WorkflowTaskFinishEventId: id, RequestId: uuid.NewString(),
	})
	require.NoError(t, err)
}

// terminateByMistake terminates the workflow once its first workflow task is in its history (an
// answer may come before: the steps run in that task), as an operator's slip would.
func terminateByMistake(t *testing.T, wfID string) {
	t.Helper()
	require.Eventually(t, func() bool { return lastWorkflowTask(t, wfID) != 0 }, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, tc.TerminateWorkflow(context.Background(), wfID, "", "by mistake"))
}

// resetToLastWorkflowTask does what docs/operations.md tells an operator to do with a payment
// whose workflow was closed by mistake: `temporal workflow reset --type LastWorkflowTask`.
func resetToLastWorkflowTask(t *testing.T, wfID string) {
	t.Helper()
	resetTo(t, wfID, lastWorkflowTask(t, wfID), "terminated by mistake")
}

// An unknown payment whose workflow an operator terminated by mistake: the documented reset runs
// it again, and it waits for its settlement as before, hold kept; the settlement then books it
// once, and the bank was charged once.
func TestResetOfATerminatedUnknownPaymentWaitsForItsSettlement(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	p := s.payUnknown(m, "reset-unknown", payBody("inv-reset-unknown", "40.00", "TRY", acct), "drop_response")
	ctx := context.Background()
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "reset-unknown")
	terminateByMistake(t, wfID)

	resetToLastWorkflowTask(t, wfID)
	require.Never(t, func() bool { return !waitingForSettlement(t, m, "reset-unknown") }, 3*time.Second, 100*time.Millisecond,
		"the reset run ended instead of waiting for the settlement")
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "reset-unknown").Status)
	require.Equal(t, int64(4000), reserved(t, acct), "the hold is kept")

	require.NoError(t, tc.SignalWorkflow(ctx, wfID, "", workflows.SignalSettlement,
		workflows.Settlement{Outcome: workflows.OutcomeCharged, OperationID: p.ID}))
	var res workflows.PaymentResult
	require.NoError(t, tc.GetWorkflow(ctx, wfID, "").Get(ctx, &res))
	require.Equal(t, "succeeded", res.Status)
	a := s.account(m, acct)
	require.Equal(t, []any{"60.00", "0.00"}, []any{a["balance"], a["reserved"]})
	require.Equal(t, 1, s.simCount(p.ID.String()), "the bank charged once")
	requireVerified(t)
}

// A refund whose answer was lost, its workflow terminated by mistake: after the documented reset
// it waits for its settlement with its holds kept, and the settlement books it once.
func TestResetOfATerminatedUnknownRefundWaitsForItsSettlement(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	paid, _ := s.paidFor(m, "reset-refunded", "100.00", "300.00")
	s.setFaults(`{"rules":[{"on":"refund","action":"drop_response","count":1}]}`)
	r := s.refund(m, paid, "reset-refund", `{"amount":"40.00"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	refundID := r.json(t)["id"].(string)
	ctx := context.Background()
	wfID := workflows.RefundWorkflowID(mustUUID(t, m.ID), "reset-refund")
	terminateByMistake(t, wfID)

	resetToLastWorkflowTask(t, wfID)
	require.Never(t, func() bool {
		d, err := tc.DescribeWorkflow(ctx, wfID, "")
		return err != nil || d.Status != enums.WORKFLOW_EXECUTION_STATUS_RUNNING
	}, 3*time.Second, 100*time.Millisecond, "the reset run ended instead of waiting for the settlement")
	held := readRefundState(t, env.DatabaseURL, paid)
	require.Equal(t, int64(4000), held.Held, "the refund's hold is kept")

	require.NoError(t, tc.SignalWorkflow(ctx, wfID, "", workflows.SignalSettlement,
		workflows.Settlement{Outcome: workflows.OutcomeCharged, OperationID: mustUUID(t, refundID)}))
	var res workflows.PaymentResult
	require.NoError(t, tc.GetWorkflow(ctx, wfID, "").Get(ctx, &res))
	require.Equal(t, "succeeded", res.Status)
	require.Equal(t, 1, s.simRefunds(refundID), "the bank paid back once")
	require.Equal(t, "40.00", s.do("GET", "/v1/payments/"+paid, m.APIKey, "").json(t)["amount_refunded"])
	requireVerified(t)
}

// A manual payment is not taken on again by a reset from its start: run again, it would
// authorize again whatever phase it was in, and reopen a capture whose answer was lost as
// waiting for one. Its reset run ends at once; the payment stays unknown with its hold, one
// authorization at the bank, for its settlement (docs/operations.md, "Stuck payments").
func TestResetOfAManualPaymentFromItsStartRunsNothingAgain(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "reset-manual", "30.00", "100.00")
	s.setFaults(`{"rules":[{"on":"capture","action":"drop_response","count":1}]}`)
	r := s.command(m, id, "capture", "reset-capture", `{"amount":"20.00"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "reset-manual").Status == payment.StatusUnknown },
		20*time.Second, 50*time.Millisecond)
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "reset-manual")
	terminateByMistake(t, wfID)

	ctx := context.Background()
	var first int64
	it := tc.GetWorkflowHistory(ctx, wfID, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() && first == 0 {
		e, err := it.Next()
		require.NoError(t, err)
		if e.GetEventType() == enums.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			first = e.GetEventId()
		}
	}
	_, err := tc.WorkflowService().ResetWorkflowExecution(ctx, &workflowservice.ResetWorkflowExecutionRequest{
		Namespace: "default", WorkflowExecution: &commonpb.WorkflowExecution{WorkflowId: wfID},
		Reason: "from the start", WorkflowTaskFinishEventId: first, RequestId: uuid.NewString(),
	})
	require.NoError(t, err)
	var res workflows.PaymentResult
	ended, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, tc.GetWorkflow(ended, wfID, "").Get(ended, &res), "the reset run took the payment on again")
	require.Equal(t, "unknown", res.Status, "the reset run ends with the payment as it is")
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "reset-manual").Status, "not reopened for a capture")
	require.Equal(t, int64(3000), reserved(t, payer), "the hold is kept")
	require.Equal(t, 1, s.held(id).Count, "one authorization at the bank")
}

// resetBefore resets the workflow to its last workflow task completed before the first event of
// type before, as docs/operations.md tells an operator to do after a cancellation request.
func resetBefore(t *testing.T, wfID string, before enums.EventType) {
	t.Helper()
	resetTo(t, wfID, lastWorkflowTaskBefore(t, wfID, before), "canceled by mistake")
}

// A cancellation request (the Web UI's "Request Cancellation", `temporal workflow cancel`) ends
// the workflow of an unknown payment started before Revision 7 as a terminate does, its hold
// kept. A reset to its last workflow task keeps the request and ends the same way; the reset to
// the task before the request, as docs/operations.md says, brings the wait for the settlement
// back, and the bank was charged once.
func TestResetOfACanceledUnknownPaymentGoesBackBeforeTheRequest(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	p := s.payUnknownAtRevision(m, "cancel-unknown", "40.00", acct, 6) // Revision 7 on, the request is ignored
	ctx := context.Background()
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "cancel-unknown")
	require.Eventually(t, func() bool { return lastWorkflowTask(t, wfID) != 0 }, 10*time.Second, 20*time.Millisecond)
	closedAs := func(want enums.WorkflowExecutionStatus) func() bool {
		return func() bool {
			d, err := tc.DescribeWorkflow(ctx, wfID, "")
			return err == nil && d.Status == want
		}
	}

	require.NoError(t, tc.CancelWorkflow(ctx, wfID, ""))
	require.Eventually(t, closedAs(enums.WORKFLOW_EXECUTION_STATUS_CANCELED), 10*time.Second, 50*time.Millisecond)
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "cancel-unknown").Status)
	require.Equal(t, int64(4000), reserved(t, acct), "the hold is kept")

	resetToLastWorkflowTask(t, wfID)
	require.Eventually(t, closedAs(enums.WORKFLOW_EXECUTION_STATUS_CANCELED), 10*time.Second, 50*time.Millisecond,
		"a reset to the last workflow task keeps the cancellation request")

	resetBefore(t, wfID, enums.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)
	require.Never(t, func() bool { return !waitingForSettlement(t, m, "cancel-unknown") }, 3*time.Second, 100*time.Millisecond,
		"the reset run ended instead of waiting for the settlement")
	require.NoError(t, tc.SignalWorkflow(ctx, wfID, "", workflows.SignalSettlement,
		workflows.Settlement{Outcome: workflows.OutcomeCharged, OperationID: p.ID}))
	var res workflows.PaymentResult
	require.NoError(t, tc.GetWorkflow(ctx, wfID, "").Get(ctx, &res))
	require.Equal(t, "succeeded", res.Status)
	a := s.account(m, acct)
	require.Equal(t, []any{"60.00", "0.00"}, []any{a["balance"], a["reserved"]})
	require.Equal(t, 1, s.simCount(p.ID.String()), "the bank charged once")
	requireVerified(t)
}

// payUnknownAtRevision makes a payment of amount from payer whose charge's answer is lost at the
// bank (capability none), started under the rules of Revision rev as a worker of that release
// started it, and waits until it is unknown.
func (s *stack) payUnknownAtRevision(m merchant, key, amount, payer string, rev int) payment.Payment {
	s.t.Helper()
	ctx := context.Background()
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	minor, err := payment.ParseAmount(amount, "TRY")
	require.NoError(s.t, err)
	req := payment.Request{InvoiceID: "inv-" + key, AmountMinor: minor, Currency: "TRY", AccountID: mustUUID(s.t, payer), PaymentType: "purchase"}
	_, p, _, err := db.Begin(ctx, store.BeginInput{MerchantID: mustUUID(s.t, m.ID), Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(s.t, err)
	in := workflows.InputFor(p)
	in.Revision = rev
	_, err = workflows.Starter{Client: tc, TaskQueue: s.queue}.StartPayment(ctx, key, in)
	require.NoError(s.t, err)
	require.Eventually(s.t, func() bool { return paymentByKey(s.t, m, key).Status == payment.StatusUnknown }, 20*time.Second, 50*time.Millisecond)
	return paymentByKey(s.t, m, key)
}

// An operator's cancellation request (the Web UI's "Request Cancellation", `temporal workflow
// cancel`) ends no payment's or refund's workflow (Revision 7): an unknown one keeps waiting for
// its settlement, which then books it once; a manual one waiting for its capture takes it; a
// refund's settlement is applied. Nothing is left held with no workflow to finish it.
func TestCancelRequestIsIgnored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	running := func(wfID string) bool {
		d, err := tc.DescribeWorkflow(ctx, wfID, "")
		require.NoError(t, err)
		return d.Status == enums.WORKFLOW_EXECUTION_STATUS_RUNNING
	}
	cancel := func(wfID string) {
		require.Eventually(t, func() bool { return lastWorkflowTask(t, wfID) != 0 }, 10*time.Second, 20*time.Millisecond)
		require.NoError(t, tc.CancelWorkflow(ctx, wfID, ""))
		require.Never(t, func() bool { return !running(wfID) }, 3*time.Second, 100*time.Millisecond, "a cancellation request ended %s", wfID)
	}

	t.Run("unknown payment", func(t *testing.T) {
		acct := s.newAccount(m, "TRY", "100.00")
		p := s.payUnknown(m, "cancel-unknown", payBody("inv-cancel-unknown", "40.00", "TRY", acct), "drop_response")
		wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "cancel-unknown")
		cancel(wfID)
		require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "cancel-unknown").Status)
		status, err := workflows.Starter{Client: tc, TaskQueue: s.queue}.Settle(ctx, wfID,
			workflows.Settlement{Outcome: workflows.OutcomeCharged, OperationID: p.ID})
		require.NoError(t, err)
		require.Equal(t, "succeeded", status)
		var res workflows.PaymentResult
		require.NoError(t, tc.GetWorkflow(ctx, wfID, "").Get(ctx, &res))
		require.Equal(t, "succeeded", res.Status)
		a := s.account(m, acct)
		require.Equal(t, []any{"60.00", "0.00"}, []any{a["balance"], a["reserved"]})
		require.Equal(t, 1, s.simCount(p.ID.String()), "the bank charged once")
	})

	t.Run("manual payment waiting for its capture", func(t *testing.T) {
		id, payer, _ := s.authorize(m, "cancel-manual", "30.00", "100.00")
		cancel(workflows.PaymentWorkflowID(mustUUID(t, m.ID), "cancel-manual"))
		r := s.command(m, id, "capture", "cancel-manual-capture", `{"amount":"20.00"}`)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Equal(t, "succeeded", r.json(t)["status"])
		require.Equal(t, int64(2000), s.held(id).CapturedMinor, "captured once")
		a := s.account(m, payer)
		require.Equal(t, []any{"80.00", "0.00"}, []any{a["balance"], a["reserved"]})
	})

	t.Run("unknown refund", func(t *testing.T) {
		paid, _ := s.paidFor(m, "cancel-refunded", "100.00", "300.00")
		s.setFaults(`{"rules":[{"on":"refund","action":"drop_response","count":1}]}`)
		r := s.refund(m, paid, "cancel-refund", `{"amount":"40.00"}`)
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		refundID := r.json(t)["id"].(string)
		wfID := workflows.RefundWorkflowID(mustUUID(t, m.ID), "cancel-refund")
		cancel(wfID)
		require.NoError(t, tc.SignalWorkflow(ctx, wfID, "", workflows.SignalSettlement,
			workflows.Settlement{Outcome: workflows.OutcomeCharged, OperationID: mustUUID(t, refundID)}))
		var res workflows.PaymentResult
		require.NoError(t, tc.GetWorkflow(ctx, wfID, "").Get(ctx, &res))
		require.Equal(t, "succeeded", res.Status)
		require.Equal(t, 1, s.simRefunds(refundID), "the bank paid back once")
		require.Equal(t, "40.00", s.do("GET", "/v1/payments/"+paid, m.APIKey, "").json(t)["amount_refunded"])
	})
	requireVerified(t)
}

// hasEvent says whether the workflow's history holds an event of type typ.
func hasEvent(t *testing.T, wfID string, typ enums.EventType) bool {
	t.Helper()
	it := tc.GetWorkflowHistory(context.Background(), wfID, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		require.NoError(t, err)
		if e.GetEventType() == typ {
			return true
		}
	}
	return false
}

// A manual payment whose run an operator terminated while its capture was at the bank: the
// documented reset (to its last workflow task, the one that took the capture) goes on from there,
// and the bank captures once. With an idempotent bank the capture is sent again under its key and
// the capture's key answers with the captured payment. With a bank without idempotency the
// payment ends succeeded if the first send's answer was recorded, or parks unknown with its hold,
// for its settlement.
func TestResetOfAManualPaymentTerminatedMidCaptureCapturesOnce(t *testing.T) {
	t.Parallel()
	for _, capability := range []workflows.Capability{workflows.CapabilityIdempotent, workflows.CapabilityNone} {
		t.Run(string(capability), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, capability)
			m := s.newMerchant()
			id, payer, _ := s.authorize(m, "reset-mid", "30.00", "100.00")
			s.setFaults(`{"rules":[{"on":"capture","action":"delay","delay_ms":2000,"count":1}]}`)
			first := make(chan response, 1)
			go func() { first <- s.command(m, id, "capture", "reset-mid-capture", `{"amount":"20.00"}`) }()
			wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "reset-mid")
			require.Eventually(t, func() bool { return hasEvent(t, wfID, enums.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) },
				30*time.Second, 20*time.Millisecond, "the capture's send was scheduled")
			require.NoError(t, tc.TerminateWorkflow(context.Background(), wfID, "", "by mistake"))
			<-first

			resetToLastWorkflowTask(t, wfID)
			require.Eventually(t, func() bool { return s.held(id).CapturedMinor == 2000 }, 30*time.Second, 50*time.Millisecond,
				"the bank captured")
			var status payment.Status
			require.Eventually(t, func() bool {
				status = paymentByKey(t, m, "reset-mid").Status
				return status == payment.StatusSucceeded || status == payment.StatusUnknown && capability == workflows.CapabilityNone
			}, 60*time.Second, 100*time.Millisecond, "the reset run took the capture on")
			held := s.held(id)
			require.Equal(t, 1, held.Count, "one authorization at the bank")
			require.Equal(t, int64(2000), held.CapturedMinor, "captured once")
			if status == payment.StatusUnknown {
				require.Equal(t, int64(3000), reserved(t, payer), "the hold is kept for the settlement")
			} else {
				require.Zero(t, reserved(t, payer), "the rest of the hold released")
				require.Equal(t, int64(8000), balance(t, payer))
				r := s.command(m, id, "capture", "reset-mid-capture", `{"amount":"20.00"}`)
				require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
				require.Equal(t, "20.00", r.json(t)["amount_captured"])
			}
			requireVerified(t)
		})
	}
}

// captureTwentyOfThirty captures 20.00 of a manual payment of 30.00 from payer (100.00 deposited)
// under key and checks its effects: 201, captured once at the bank and never voided, the rest of
// the hold released, the ledger verified.
func (s *stack) captureTwentyOfThirty(m merchant, id, payer, key string) {
	t := s.t
	t.Helper()
	r := s.command(m, id, "capture", key, `{"amount":"20.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "20.00", r.json(t)["amount_captured"])
	held := s.held(id)
	require.Equal(t, 1, held.Count, "one authorization at the bank")
	require.Equal(t, int64(2000), held.CapturedMinor, "captured once")
	require.False(t, held.Voided)
	require.Zero(t, reserved(t, payer), "the rest of the hold released")
	require.Equal(t, int64(8000), balance(t, payer))
	requireVerified(t)
}

// A manual payment waiting for its capture, its workflow terminated by mistake: after the
// documented reset (its last task is its first: it authorized in local steps) the run takes the
// payment on again (Revision 11): a capture is taken once, the rest of the hold released, and
// nothing is authorized twice (docs/operations.md, "Stuck payments").
func TestResetOfAManualPaymentWaitingForCaptureTakesItOn(t *testing.T) {
	t.Parallel()
	for _, capability := range []workflows.Capability{workflows.CapabilityNone, workflows.CapabilityInquiry, workflows.CapabilityIdempotent} {
		t.Run(string(capability), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, capability)
			m := s.newMerchant()
			id, payer, _ := s.authorize(m, "reset-waiting", "30.00", "100.00")
			wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "reset-waiting")
			terminateByMistake(t, wfID)

			resetToLastWorkflowTask(t, wfID)
			s.captureTwentyOfThirty(m, id, payer, "reset-waiting-capture")
		})
	}
}

// A manual payment reset that way and then left alone is voided at its capture_before: its hold
// does not outlive its authorization.
func TestResetOfAManualPaymentWaitingForCaptureVoidsAtCaptureBefore(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityNone, temporal: tc, captureWindow: 6 * time.Second})
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "reset-expire", "30.00", "100.00")
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "reset-expire")
	terminateByMistake(t, wfID)

	resetToLastWorkflowTask(t, wfID)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "reset-expire").Status == payment.StatusCanceled },
		30*time.Second, 100*time.Millisecond, "voided at capture_before")
	require.True(t, s.held(id).Voided, "the authorization voided at the bank")
	require.Zero(t, reserved(t, payer), "the hold released")
	require.Equal(t, int64(10000), balance(t, payer))
	requireVerified(t)
}

// The same reset met again, or late: a reset run terminated by mistake in turn and reset again
// takes the payment on again (a capture is taken once, one authorization at the bank); one reset
// only after capture_before has passed voids the authorization at once, the hold released.
func TestResetOfAManualPaymentWaitingForCaptureTwiceOrLate(t *testing.T) {
	t.Parallel()
	t.Run("reset twice", func(t *testing.T) {
		t.Parallel()
		s := newStack(t, workflows.CapabilityInquiry)
		m := s.newMerchant()
		id, payer, _ := s.authorize(m, "reset-twice", "30.00", "100.00")
		wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "reset-twice")
		for range 2 {
			// The run has taken the payment on (the reset run too) before it is terminated.
			require.Eventually(t, func() bool {
				v, err := tc.QueryWorkflow(context.Background(), wfID, "", workflows.QueryStatus)
				var status string
				return err == nil && v.Get(&status) == nil && status == string(payment.StatusRequiresCapture)
			}, 30*time.Second, 50*time.Millisecond)
			terminateByMistake(t, wfID)
			resetToLastWorkflowTask(t, wfID)
		}
		s.captureTwentyOfThirty(m, id, payer, "reset-twice-capture")
	})
	t.Run("reset past capture_before", func(t *testing.T) {
		t.Parallel()
		s := newStackWith(t, stackOptions{capability: workflows.CapabilityNone, temporal: tc, captureWindow: 3 * time.Second})
		m := s.newMerchant()
		id, payer, answer := s.authorize(m, "reset-late", "30.00", "100.00")
		wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "reset-late")
		terminateByMistake(t, wfID)
		before, err := time.Parse(time.RFC3339Nano, answer.json(t)["capture_before"].(string))
		require.NoError(t, err)
		time.Sleep(time.Until(before) + time.Second)
		require.Equal(t, payment.StatusRequiresCapture, paymentByKey(t, m, "reset-late").Status, "nothing voided it")
		requireProblem(t, s.command(m, id, "capture", "reset-late-capture", ""), http.StatusConflict, "payment_not_capturable")

		resetToLastWorkflowTask(t, wfID)
		var p payment.Payment
		require.Eventually(t, func() bool { p = paymentByKey(t, m, "reset-late"); return p.Status == payment.StatusCanceled },
			30*time.Second, 100*time.Millisecond, "voided at once")
		require.Equal(t, payment.FailureAuthorizationExpired, p.FailureCode)
		held := s.held(id)
		require.True(t, held.Voided, "the authorization voided at the bank")
		require.Zero(t, held.CapturedMinor)
		require.Zero(t, reserved(t, payer), "the hold released")
		require.Equal(t, int64(10000), balance(t, payer))
		requireVerified(t)
	})
}

// A manual payment whose authorization's answer was lost (unknown, no authorization id), its
// workflow terminated by mistake: the documented reset runs it from its start, and the reset run
// waits for its settlement as the first did (Revision 11), the hold kept; the operator's charged
// settlement naming the authorization then makes it wait for its capture, captured once.
func TestResetOfAManualPaymentWithAnUnknownAuthorizationWaitsForItsSettlement(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	id := s.authorizeUnknown(m, "reset-auth-unknown", payer)
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "reset-auth-unknown")
	terminateByMistake(t, wfID)

	resetToLastWorkflowTask(t, wfID)
	require.Never(t, func() bool {
		d, err := tc.DescribeWorkflow(context.Background(), wfID, "")
		return err != nil || d.Status != enums.WORKFLOW_EXECUTION_STATUS_RUNNING
	}, 3*time.Second, 100*time.Millisecond, "the reset run ended instead of waiting for the settlement")
	require.Equal(t, int64(2500), reserved(t, payer), "the hold is kept")

	held := s.held(id)
	require.Equal(t, 1, held.Count, "one authorization at the bank")
	require.Len(t, held.Live, 1)
	status, err := workflows.Starter{Client: tc}.Settle(context.Background(), wfID,
		workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: held.Live[0], Note: "the bank holds it"})
	require.NoError(t, err)
	require.Equal(t, string(payment.StatusRequiresCapture), status)
	r := s.command(m, id, "capture", "reset-auth-unknown-capture", `{"amount":"25.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	held = s.held(id)
	require.Equal(t, 1, held.Count, "never authorized twice")
	require.Equal(t, int64(2500), held.CapturedMinor, "captured once")
	require.Zero(t, reserved(t, payer))
	require.Equal(t, int64(7500), balance(t, payer))
	requireVerified(t)
}
