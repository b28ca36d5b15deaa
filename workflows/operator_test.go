package workflows_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// A settlement repeated while the void the first one led to is still at the bank (an import run
// again after its settle timed out) is refused: kept, it would release the hold as soon as the
// void's own answer is lost, though nobody knows whether the bank voided.
func TestManualPaymentRepeatedSettleWhileItsVoidRuns(t *testing.T) {
	for _, signal := range []bool{false, true} {
		h := newHarness(t)
		h.authorizes()
		h.on(workflows.ActivityCaptureAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
		h.on(workflows.ActivityVoidAuthorization).After(time.Minute).Return(workflows.ChargeResult{}, ambiguous()).Once()
		h.on(workflows.ActivityMarkUnknown).Return(nil)
		h.on(workflows.ActivityCanceled).Return(nil).Once()
		answers := map[string]string{}
		h.commandAt(time.Minute, workflows.UpdateCapture, "c1", workflows.Command{}, answers)
		h.updateAt(2*time.Hour, "first", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
		again := workflows.Settlement{Outcome: workflows.OutcomeNotCharged}
		if signal {
			h.signalAt(2*time.Hour+30*time.Second, again)
		} else {
			h.updateAt(2*time.Hour+30*time.Second, "again", again, answers)
		}
		h.expectWaitingAt(5 * time.Hour)
		h.updateAt(10*time.Hour, "void settled", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
		res := h.run(manualInput(h, workflows.CapabilityNone))
		require.Equal(t, string(payment.StatusCanceled), res.Status)
		require.Equal(t, statusUnknown, answers["first"], "its void's answer was lost too")
		if !signal {
			require.Contains(t, answers["again"], "rejected: ", "a repeated settlement is refused")
		}
		require.Equal(t, "canceled", answers["void settled"])
		require.Greater(t, h.offsets(workflows.ActivityCanceled)[0], 5*time.Hour, "the hold is kept while the void is unknown (signal %t)", signal)
	}
}

// A charged settlement naming another amount than the payment's (or the refund's) is refused, as
// the import refuses it (amount_differs): the bank moved other money than kasa asked it to.
func TestSettleWithAnotherAmountIsRefused(t *testing.T) {
	for _, signal := range []bool{false, true} {
		h := newHarness(t)
		h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous()).Once()
		answers := map[string]string{}
		wrong := workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 500, ProviderReference: "ch_x"}
		if signal {
			h.signalAt(time.Hour, wrong)
		} else {
			h.updateAt(time.Hour, "wrong amount", wrong, answers)
		}
		h.expectWaitingAt(90 * time.Minute)
		h.updateAt(2*time.Hour, "right", workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 12_345, ProviderReference: "ch_x"}, answers)
		in := paymentInput(workflows.CapabilityNone)
		in.LocalSteps, in.Revision = true, workflows.CurrentRevision
		res := h.run(in)
		require.Equal(t, statusSucceeded, res.Status)
		require.Equal(t, statusSucceeded, answers["right"])
		if !signal {
			require.Contains(t, answers["wrong amount"], "rejected: ")
		}
	}
}

// An operator's retry of a payment held for a conflict (a not_charged settlement against an
// inquiry that found the charge) asks the bank again at once: a not_charged settlement arriving
// meanwhile meets that inquiry, and is a conflict again while the bank still finds the charge.
func TestRetryOfAConflictAsksTheBankFirst(t *testing.T) {
	h := newHarness(t)
	in := paymentInput(workflows.CapabilityInquiry)
	in.LocalSteps, in.Revision = true, workflows.CurrentRevision
	in.BookingWindow = time.Millisecond
	h.chargeFoundAgainstAFile()
	answers := map[string]string{}
	h.retryAt(2 * time.Hour)
	h.updateAt(2*time.Hour+time.Second, "released", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
	h.updateAt(3*time.Hour, "charged", workflows.Settlement{Outcome: workflows.OutcomeCharged}, answers)
	res := h.run(in)
	require.Zero(t, h.calls(workflows.ActivityRelease), "never released while the bank's inquiry finds the charge")
	require.Equal(t, statusSucceeded, res.Status)
}

// An unknown authorization settled as charged must name the bank's authorization id
// (provider_reference): captures and voids are sent to it. One that names none is refused.
func TestManualPaymentUnknownAuthorizationSettledNamesItsAuthorization(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivityAuthorize).Return(workflows.ChargeResult{}, ambiguous()).Once()
	h.on(workflows.ActivityMarkUnknown).Return(nil)
	h.env.OnActivity(workflows.ActivityAuthorized, mock.Anything, mock.Anything).Return(h.recorded(0)).Once()
	h.env.OnActivity(workflows.ActivityCaptureAuthorization, mock.Anything,
		workflows.BankCallInput{OperationID: opID, AuthorizationRef: "au_9", AmountMinor: 12_345, Send: 1}).Return(charged("cap_1"), nil).Once()
	h.on(workflows.ActivityCaptured).Return(nil).Once()
	answers := map[string]string{}
	h.updateAt(time.Hour, "no reference", workflows.Settlement{Outcome: workflows.OutcomeCharged}, answers)
	h.updateAt(2*time.Hour, "authorized", workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "au_9"}, answers)
	h.commandAt(3*time.Hour, workflows.UpdateCapture, "c1", workflows.Command{}, answers)
	in := manualInput(h, workflows.CapabilityNone)
	in.CaptureBefore = h.start.Add(24 * time.Hour)
	res := h.run(in)
	require.Equal(t, statusSucceeded, res.Status)
	require.Contains(t, answers["no reference"], "rejected: ")
	require.Equal(t, string(payment.StatusRequiresCapture), answers["authorized"])
	require.Equal(t, statusSucceeded, answers["c1"])
}

// A settlement naming another operation (the key named a new payment once the record of the one
// the import read had expired) is refused; from Revision 5 a signal's is ignored too.
func TestSettlementForAnotherOperationIsRefused(t *testing.T) {
	for _, signal := range []bool{false, true} {
		h := newHarness(t)
		h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous()).Once()
		answers := map[string]string{}
		other := workflows.Settlement{Outcome: workflows.OutcomeNotCharged, OperationID: uuid.Must(uuid.NewV7())}
		if signal {
			h.signalAt(time.Hour, other)
		} else {
			h.updateAt(time.Hour, "other", other, answers)
		}
		h.expectWaitingAt(90 * time.Minute)
		in := paymentInput(workflows.CapabilityNone)
		in.LocalSteps, in.Revision = true, workflows.CurrentRevision
		h.updateAt(2*time.Hour, "own", workflows.Settlement{Outcome: workflows.OutcomeCharged, OperationID: in.OperationID}, answers)
		res := h.run(in)
		require.Equal(t, statusSucceeded, res.Status)
		require.Zero(t, h.calls(workflows.ActivityRelease), "never released for another payment's settlement (signal %t)", signal)
		if !signal {
			require.Contains(t, answers["other"], "rejected: ")
		}
	}
}
