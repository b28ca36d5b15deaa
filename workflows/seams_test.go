package workflows_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	sdkpb "go.temporal.io/api/sdk/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/workflows"
)

// newInput is a payment as the API starts it now: no charge policy of its own.
func newInput() workflows.PaymentInput {
	return workflows.InputFor(payment.Payment{ID: opID, MerchantID: merchantID, AccountID: accountID, AmountMinor: 12_345, Currency: "EUR"})
}

// The worker, which talks to the bank, decides how to send: a payment started with no policy
// runs its worker's. With none, an ambiguous charge is never sent again; with idempotent it is.
func TestPaymentWorkflowRunsItsWorkersPolicy(t *testing.T) {
	cases := []struct {
		capability workflows.Capability
		charges    int
		want       workflows.PaymentResult
	}{
		{workflows.CapabilityNone, 1, workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_file"}},
		{workflows.CapabilityIdempotent, 2, workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_2"}},
	}
	for _, tc := range cases {
		t.Run(string(tc.capability), func(t *testing.T) {
			h := newHarness(t)
			h.on(workflows.ActivityChargePolicy).Return(workflows.ChargePolicy{Capability: tc.capability}, nil)
			h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous()).Once()
			h.on(workflows.ActivityCharge).Return(charged("ch_2"), nil)
			h.signalAt(time.Minute, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_file"})
			res := h.run(newInput())
			require.Equal(t, tc.want, res)
			require.Equal(t, 1, h.calls(workflows.ActivityChargePolicy))
			require.Equal(t, tc.charges, h.calls(workflows.ActivityCharge))
			h.env.AssertActivityCalled(t, workflows.ActivityCharge, mock.Anything, workflows.ChargeInput{
				OperationID: opID, AccountID: accountID, AmountMinor: 12_345, Currency: "EUR", Capability: tc.capability, Send: 1,
			})
		})
	}
}

// A refund started with no policy runs its worker's too.
func TestRefundWorkflowRunsItsWorkersPolicy(t *testing.T) {
	h := newHarness(t)
	h.fallbacks()
	h.on(workflows.ActivityChargePolicy).Return(workflows.ChargePolicy{Capability: workflows.CapabilityNone}, nil)
	h.on(workflows.ActivityHoldRefundForRun).Return(nil)
	h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, ambiguous())
	h.on(workflows.ActivityMarkRefundUnknown).Return(nil)
	h.on(workflows.ActivityPostRefund).Return(nil)
	h.signalAt(time.Minute, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "re_file"})
	in := workflows.RefundInputFor(payment.Refund{ID: refundID, PaymentID: paymentID, MerchantID: merchantID, AmountMinor: 4_000, Currency: "EUR"})
	res := complete[workflows.RefundWorkflowResult](h, workflows.WorkflowRefund, in)
	require.Equal(t, workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "re_file"}, res)
	require.Equal(t, 1, h.calls(workflows.ActivitySendRefund), "none: never sent again")
	h.env.AssertActivityCalled(t, workflows.ActivitySendRefund, mock.Anything, workflows.SendRefundInput{
		OperationID: refundID, PaymentID: paymentID, AmountMinor: 4_000, Currency: "EUR", Capability: workflows.CapabilityNone, Send: 1,
	})
}

// chargeFoundAgainstAFile: the charge's answer is lost, three inquiries find nothing (parked at
// 6 s), and the fourth, at 8 s, finds the charge while the bank's file says not charged; every
// inquiry after it finds the charge too.
func (h *harness) chargeFoundAgainstAFile() {
	h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
	h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound()).Times(3)
	h.on(workflows.ActivityInquire).Run(func(mock.Arguments) {
		h.env.SignalWorkflow(workflows.SignalSettlement, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
	}).Return(charged("ch_1"), nil).Once()
	h.on(workflows.ActivityInquire).Return(charged("ch_1"), nil)
}

// A not_charged settlement that arrives while an inquiry finds the charge never releases the
// hold: the payment stays unknown, flagged for an operator with both answers, refuses further
// not_charged settlements, and resumes on the operator's retry (an inquiry at once books it).
func TestPaymentWorkflowSettlementConflictKeepsTheHold(t *testing.T) {
	h := newHarness(t)
	in := paymentInput(workflows.CapabilityInquiry)
	in.LocalSteps, in.Revision = true, workflows.CurrentRevision
	in.BookingWindow = time.Millisecond // one inquiry before each re-send
	h.chargeFoundAgainstAFile()
	var reasons []string
	h.on(workflows.ActivityFlagStuck).Run(func(args mock.Arguments) {
		reasons = append(reasons, args.Get(1).(workflows.FlagInput).Reason)
	}).Return(nil)
	h.signalAt(30*time.Second, workflows.Settlement{Outcome: workflows.OutcomeNotCharged}) // refused
	h.expectWaitingAt(time.Hour)
	h.retryAt(2 * time.Hour)

	res := h.run(in)
	require.Equal(t, workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_1"}, res)
	require.Zero(t, h.calls(workflows.ActivityRelease), "the hold is never released")
	require.Len(t, reasons, 2, "flagged, then cleared by the retry")
	require.Contains(t, reasons[0], "contradicts the bank")
	require.Contains(t, reasons[0], "ch_1")
	require.Empty(t, reasons[1])
	require.Equal(t, 2*time.Hour, h.offsets(workflows.ActivityFinalize)[0], "booked at the operator's retry, which asks the bank at once")
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, []string{statusUnknown, workflows.StatusStuck, statusUnknown, statusSucceeded}, h.statuses)
}

// Before Revision 4 the retry of a conflict waits for the next inquiry, as it did: the rule that
// asks the bank at once is not applied to the runs started earlier.
func TestPaymentWorkflowRevision3RetryOfAConflictWaitsForTheNextInquiry(t *testing.T) {
	h := newHarness(t)
	in := paymentInput(workflows.CapabilityInquiry)
	in.LocalSteps, in.Revision = true, 3
	in.BookingWindow = time.Millisecond
	h.chargeFoundAgainstAFile()
	h.on(workflows.ActivityFlagStuck).Return(nil)
	h.retryAt(2 * time.Hour)
	res := h.run(in)
	require.Equal(t, statusSucceeded, res.Status)
	require.Greater(t, h.offsets(workflows.ActivityFinalize)[0], 2*time.Hour, "booked at the inquiry after the retry")
}

// A refund meets the same rule: a not_charged settlement that arrives while an inquiry finds the
// refund at the bank never releases its hold; the refund stays unknown, flagged for an operator.
func TestRefundWorkflowSettlementConflictKeepsTheHold(t *testing.T) {
	h := newHarness(t)
	in := refundInput(workflows.CapabilityInquiry)
	in.LocalSteps = true
	in.BookingWindow = time.Millisecond // one inquiry before each re-send
	h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, ambiguous())
	h.on(workflows.ActivityInquireRefund).Return(workflows.RefundSendResult{}, notFound()).Times(3)
	h.on(workflows.ActivityInquireRefund).Run(func(mock.Arguments) {
		h.env.SignalWorkflow(workflows.SignalSettlement, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
	}).Return(refunded("re_1"), nil).Once()
	h.on(workflows.ActivityInquireRefund).Return(refunded("re_1"), nil)
	var reasons []string
	h.on(workflows.ActivityFlagRefundStuck).Run(func(args mock.Arguments) {
		reasons = append(reasons, args.Get(1).(workflows.FlagInput).Reason)
	}).Return(nil)
	h.signalAt(30*time.Second, workflows.Settlement{Outcome: workflows.OutcomeNotCharged}) // refused
	h.retryAt(2 * time.Hour)

	res := h.runRefund(in)
	require.Equal(t, workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "re_1"}, res)
	require.Zero(t, h.calls(workflows.ActivityReleaseRefund), "the refund's hold is never released")
	require.Len(t, reasons, 2, "flagged, then cleared by the retry")
	require.Contains(t, reasons[0], "contradicts the bank")
	require.Equal(t, 2*time.Hour, h.offsets(workflows.ActivityPostRefund)[0], "posted at the operator's retry, which asks the bank at once")
}

// The settle update meets the same rule: its not_charged is set aside with the reason, and the
// payment is not released.
func TestPaymentWorkflowSettleUpdateConflict(t *testing.T) {
	h := newHarness(t)
	in := paymentInput(workflows.CapabilityInquiry)
	in.LocalSteps, in.Revision = true, workflows.CurrentRevision
	in.BookingWindow = time.Millisecond // one inquiry before each re-send
	h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
	h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound()).Times(3)
	var updateErr error
	h.on(workflows.ActivityInquire).Run(func(mock.Arguments) {
		h.env.UpdateWorkflow(workflows.UpdateSettle, "u1", &testsuite.TestUpdateCallback{
			OnAccept: func() {}, OnReject: func(err error) { updateErr = err },
			OnComplete: func(_ any, err error) { updateErr = err },
		}, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
	}).Return(charged("ch_1"), nil).Once()
	h.signalAt(time.Hour, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_1"})

	res := h.run(in)
	require.Equal(t, workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_1"}, res)
	require.Error(t, updateErr)
	require.True(t, strings.Contains(updateErr.Error(), "contradicts the bank"), updateErr.Error())
	require.Zero(t, h.calls(workflows.ActivityRelease))
}

// A run whose payment another run already decided ends at its first step with the payment's
// status: nothing is charged, nothing flagged.
func TestPaymentWorkflowSecondRunOfADecidedPayment(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivityChargePolicy).Return(workflows.ChargePolicy{Capability: workflows.CapabilityIdempotent}, nil)
	h.on(workflows.ActivityReserve).Return(temporal.NewNonRetryableApplicationError("already succeeded", workflows.ErrTypeAlreadyDecided, nil, statusSucceeded))
	res := h.run(newInput())
	require.Equal(t, workflows.PaymentResult{Status: statusSucceeded}, res)
	for _, name := range []string{workflows.ActivityCharge, workflows.ActivityFinalize, workflows.ActivityRelease, workflows.ActivityFlagStuck} {
		require.Zero(t, h.calls(name), name)
	}
}

// A parked run continued as new has no static summary or details (they are set at the start
// only), so its current details say what is at stake: the Web UI's view of a long-unknown payment.
func TestContinuedRunDetailsSayWhatIsAtStake(t *testing.T) {
	h := newHarness(t)
	in := paymentInput(workflows.CapabilityNone)
	in.LocalSteps, in.Revision = true, workflows.CurrentRevision
	in.Parked, in.InquiryWait = true, time.Hour
	var details string
	h.env.RegisterDelayedCallback(func() {
		v, err := h.env.QueryWorkflow("__temporal_workflow_metadata")
		require.NoError(t, err)
		var md sdkpb.WorkflowMetadata
		require.NoError(t, v.Get(&md))
		details = md.GetCurrentDetails()
	}, time.Minute)
	h.signalAt(time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
	h.run(in)
	require.Contains(t, details, "**Payment** `"+in.OperationID.String()+"`")
	require.Contains(t, details, "unknown: the bank's answer is not known")
}

// Once an inquiry's answer decided an unknown payment, its release (or post) runs: a settlement
// arriving then would never be applied, so it is refused, not accepted and answered with the
// other outcome.
func TestPaymentWorkflowSettlementWhileTheInquirysAnswerIsApplied(t *testing.T) {
	h := newHarness(t)
	in := current(workflows.CapabilityInquiry)
	in.LocalSteps, in.Parked, in.InquiryWait = true, true, 2*time.Second
	answers := map[string]string{}
	h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, declined()).Once()
	h.env.OnActivity(workflows.ActivityRelease, mock.Anything, workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureDeclined}).
		Run(func(mock.Arguments) {
			h.update("during release", workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_file"}, answers)
		}).Return(nil).Once()

	res := h.run(in)
	require.Equal(t, statusFailed, res.Status)
	require.Contains(t, answers["during release"], "rejected: the bank answered kasa's inquiry")
	require.Zero(t, h.calls(workflows.ActivityFinalize))
}

// The mirror of the not_charged conflict: a charged settlement that reaches an unknown payment
// while its inquiry finds the charge declined does not overrule the bank either. The hold is kept
// for an operator; the retry asks the bank again at once, and its decline fails the payment.
func TestPaymentWorkflowChargedSettlementRacingADecline(t *testing.T) {
	h := newHarness(t)
	in := current(workflows.CapabilityInquiry)
	in.LocalSteps, in.Parked, in.InquiryWait = true, true, 2*time.Second
	answers := map[string]string{}
	h.on(workflows.ActivityInquire).Run(func(mock.Arguments) {
		h.update("file", workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_file"}, answers)
	}).Return(workflows.ChargeResult{}, declined()).Once()
	h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, declined()).Once()
	h.retryAt(time.Hour)

	res := h.run(in)
	require.Equal(t, workflows.PaymentResult{Status: statusFailed, FailureCode: payment.FailureDeclined}, res)
	require.Contains(t, answers["file"], workflows.ErrTypeBankConflict)
	require.Contains(t, answers["file"], "the payment was declined")
	require.Zero(t, h.calls(workflows.ActivityFinalize), "nothing is posted against the bank's decline")
	require.Equal(t, []time.Duration{time.Hour}, h.offsets(workflows.ActivityRelease), "released at the retry, which asked at once")
}

// currentDetailsAt records the run's current details at d on the test clock: what the Web UI
// shows the operator there.
func (h *harness) currentDetailsAt(d time.Duration, details *string) {
	h.env.RegisterDelayedCallback(func() {
		v, err := h.env.QueryWorkflow("__temporal_workflow_metadata")
		require.NoError(h.t, err)
		var md sdkpb.WorkflowMetadata
		require.NoError(h.t, v.Get(&md))
		*details = md.GetCurrentDetails()
	}, d)
}

// Once an operator's retry let a payment held for a bank conflict go on, its current details no
// longer tell the operator to settle it the other way or to signal retry: they say it waits for a
// settlement again.
func TestConflictDetailsEndWithTheRetry(t *testing.T) {
	h := newHarness(t)
	in := current(workflows.CapabilityInquiry)
	in.LocalSteps, in.Parked, in.InquiryWait = true, true, 2*time.Second
	answers := map[string]string{}
	h.on(workflows.ActivityInquire).Run(func(mock.Arguments) {
		h.update("file", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
	}).Return(charged("ch_bank"), nil).Once()
	h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, ambiguous())
	var held, after string
	h.currentDetailsAt(time.Minute, &held)
	h.retryAt(time.Hour)
	h.currentDetailsAt(2*time.Hour, &after)
	h.signalAt(3*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_bank"})

	res := h.run(in)
	require.Equal(t, statusSucceeded, res.Status)
	require.Contains(t, answers["file"], workflows.ErrTypeBankConflict)
	require.Contains(t, held, "contradicts the bank")
	require.NotContains(t, after, "contradicts the bank", "the conflict was retried an hour ago")
	require.Contains(t, after, "unknown: the bank's answer is not known")
}

// A settlement that arrives between two inquiries is checked against the bank before it is
// applied (Revision 11), as one that meets an inquiry is: a not_charged one whose inquiry finds
// the charge keeps the hold for an operator, never releasing money the bank took. A run of
// Revision 10 applied it at once; Revision 12, whose inquiry gives up sooner at a bank that does
// not answer, keeps the rule at one that does.
func TestSettlementBetweenInquiriesAsksTheBankFirstFromRevision11(t *testing.T) {
	for _, tc := range []struct {
		revision int
		want     string
		releases int
	}{
		{12, statusSucceeded, 0},
		{11, statusSucceeded, 0},
		{10, statusFailed, 1},
	} {
		t.Run(fmt.Sprintf("revision %d", tc.revision), func(t *testing.T) {
			h := newHarness(t)
			in := paymentInput(workflows.CapabilityInquiry)
			in.LocalSteps, in.Revision = true, tc.revision
			in.BookingWindow = time.Millisecond // one inquiry before each re-send
			h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
			var filed atomic.Bool // the bank books the charge late; the file, cut before, says not charged
			h.on(workflows.ActivityInquire).Return(func(context.Context, uuid.UUID) (workflows.ChargeResult, error) {
				if filed.Load() {
					return charged("ch_1"), nil
				}
				return workflows.ChargeResult{}, notFound()
			})
			var reasons []string
			h.on(workflows.ActivityFlagStuck).Run(func(args mock.Arguments) {
				reasons = append(reasons, args.Get(1).(workflows.FlagInput).Reason)
			}).Return(nil)
			h.env.RegisterDelayedCallback(func() {
				filed.Store(true)
				h.env.SignalWorkflow(workflows.SignalSettlement, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
			}, 10*time.Minute)
			if tc.revision >= 11 {
				h.expectWaitingAt(time.Hour)
				h.retryAt(2 * time.Hour)
			}

			res := h.run(in)
			require.Equal(t, tc.want, res.Status)
			require.Equal(t, tc.releases, h.calls(workflows.ActivityRelease))
			if tc.revision >= 11 {
				require.Equal(t, 10*time.Minute, h.offsets(workflows.ActivityInquire)[len(h.offsets(workflows.ActivityInquire))-2],
					"the bank asked as the settlement arrived")
				require.NotEmpty(t, reasons)
				require.Contains(t, reasons[0], "contradicts the bank")
			}
		})
	}
}

// A settlement reaching an unknown operation whose bank answers no inquiry (it times out, or
// fails) waits for an inquiry that gives up: asked at once when the settlement arrives between
// two inquiries, or the one already under way. Until Revision 12 that inquiry was retried for the
// whole charge budget (2 min), longer than an import waits for a settlement (1 min), so the import
// reported it settling and only the next one found it settled. From Revision 12 it gives up within
// one attempt's timeout (30 s), and the settlement is applied as the same import waits. Refunds
// share the rule.
func TestSettlementWaitsForAnUnansweredInquiryWithinTheImportsWait(t *testing.T) {
	type arrival struct {
		name        string
		inquiryWait time.Duration // the parked run's first inquiry
		at          time.Duration // when the settlement arrives
	}
	between := arrival{"between two inquiries", time.Hour, 10 * time.Minute}
	during := arrival{"during an inquiry", 2 * time.Second, 12 * time.Second}
	for _, tc := range []struct {
		revision int
		refund   bool
		arrival  arrival
		late     bool // applied only after the import stopped waiting
	}{
		{11, false, between, true},
		{11, false, during, true},
		{11, true, between, true},
		{12, false, between, false},
		{12, false, during, false},
		{12, true, between, false},
		{12, true, during, false},
	} {
		noun := "payment"
		if tc.refund {
			noun = "refund"
		}
		t.Run(fmt.Sprintf("revision %d %s %s", tc.revision, noun, tc.arrival.name), func(t *testing.T) {
			h := newHarness(t)
			answers := map[string]string{}
			h.updateAt(tc.arrival.at, "file", workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_file"}, answers)
			inquire, post := workflows.ActivityInquire, workflows.ActivityFinalize
			if tc.refund {
				inquire, post = workflows.ActivityInquireRefund, workflows.ActivityPostRefund
				h.on(inquire).Return(workflows.RefundSendResult{}, ambiguous())
				in := refundInput(workflows.CapabilityInquiry)
				in.Revision, in.Parked, in.InquiryWait = tc.revision, true, tc.arrival.inquiryWait
				require.Equal(t, workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "ch_file"}, h.runRefund(in))
				require.Zero(t, h.calls(workflows.ActivityReleaseRefund))
			} else {
				h.on(inquire).Return(workflows.ChargeResult{}, ambiguous())
				in := paymentInput(workflows.CapabilityInquiry)
				in.LocalSteps, in.Revision, in.Parked, in.InquiryWait = true, tc.revision, true, tc.arrival.inquiryWait
				require.Equal(t, workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_file"}, h.run(in))
				require.Zero(t, h.calls(workflows.ActivityRelease))
			}
			require.Equal(t, statusSucceeded, answers["file"])
			require.Equal(t, 1, h.calls(post))
			inquiries := h.offsets(inquire)
			if tc.arrival == between {
				require.Equal(t, tc.arrival.at, inquiries[0], "the bank asked as the settlement arrived")
			}
			waited := h.offsets(post)[0] - tc.arrival.at
			if tc.late {
				require.Greater(t, waited, reconcile.DefaultSettleTimeout, "applied after the charge budget's inquiry")
			} else {
				require.LessOrEqual(t, waited, workflows.DefaultChargeTimeout, "applied once one attempt's time has passed")
				require.Less(t, waited, reconcile.DefaultSettleTimeout)
			}
		})
	}
}
