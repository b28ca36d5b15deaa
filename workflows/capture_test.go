package workflows_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

const authRef = "au_1"

// manualInput is a manual payment whose capture window ends an hour after the test clock's start.
func manualInput(h *harness, c workflows.Capability) workflows.PaymentInput {
	in := paymentInput(c)
	in.LocalSteps, in.Revision = true, workflows.CurrentRevision
	in.CaptureManual, in.CaptureBefore = true, h.start.Add(time.Hour)
	return in
}

// commandAt sends a capture or cancel update after d and records the workflow's answer under id.
func (h *harness) commandAt(d time.Duration, update, id string, cmd workflows.Command, answers map[string]string) {
	h.env.RegisterDelayedCallback(func() { h.env.UpdateWorkflow(update, id, h.answerTo(id, answers), cmd) }, d)
}

func (h *harness) authorizes() {
	h.on(workflows.ActivityAuthorize).Return(charged(authRef), nil)
	h.on(workflows.ActivityAuthorized).Return(h.recorded(0))
}

// recorded answers the Authorized step as the database does: its clock, here skew behind the
// test clock (the Temporal Server's).
func (h *harness) recorded(skew time.Duration) func(context.Context, workflows.FinalizeInput) (workflows.AuthorizedResult, error) {
	return func(context.Context, workflows.FinalizeInput) (workflows.AuthorizedResult, error) {
		return workflows.AuthorizedResult{DatabaseNow: h.env.Now().Add(-skew)}, nil
	}
}

func TestManualPaymentCapturesPartOfItsAuthorization(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.env.OnActivity(workflows.ActivityCaptureAuthorization, mock.Anything,
		workflows.BankCallInput{OperationID: opID, AuthorizationRef: authRef, AmountMinor: 5_000, Send: 1}).Return(charged("cap_1"), nil).Once()
	h.env.OnActivity(workflows.ActivityCaptured, mock.Anything,
		workflows.CapturedInput{OperationID: opID, AmountMinor: 5_000, ProviderReference: authRef}).Return(nil).Once()
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCapture, "too-much", workflows.Command{AmountMinor: 12_346}, answers)
	h.commandAt(2*time.Minute, workflows.UpdateCapture, "c1", workflows.Command{AmountMinor: 5_000}, answers)

	res := h.run(manualInput(h, workflows.CapabilityIdempotent))
	require.Equal(t, statusSucceeded, res.Status)
	require.Contains(t, answers["too-much"], "rejected")
	require.Contains(t, answers["too-much"], "exceeds the capturable 12345")
	require.Equal(t, statusSucceeded, answers["c1"])
	require.Equal(t, []string{string(payment.StatusRequiresCapture), statusSucceeded}, h.statuses)
	h.env.AssertNumberOfCalls(t, workflows.ActivityAuthorize, 1)
}

func TestManualPaymentExpiresAtCaptureBefore(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.on(workflows.ActivityVoidAuthorization).Return(charged("void_1"), nil).Once()
	h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
		workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureAuthorizationExpired}).Return(nil).Once()

	res := h.run(manualInput(h, workflows.CapabilityNone))
	require.Equal(t, string(payment.StatusCanceled), res.Status)
	voided := h.calledAt[workflows.ActivityVoidAuthorization]
	require.Len(t, voided, 1)
	require.WithinDuration(t, h.start.Add(time.Hour), voided[0], time.Minute, "voided within a minute of capture_before")
	h.env.AssertNumberOfCalls(t, workflows.ActivityAuthorize, 1)
}

// capture_before is the database's time, and the API refuses a capture by that clock: the run
// waits for it by the database's clock too, whatever the Temporal Server's says. One ahead must
// not void early (refusing a capture the window still allows), one behind must not void late
// (holding the payer's money), nor take a capture the window no longer allows.
func TestManualPaymentWaitsForCaptureBeforeByTheDatabasesClock(t *testing.T) {
	canceled := string(payment.StatusCanceled)
	for _, tc := range []struct {
		name    string
		skew    time.Duration // how far the Temporal Server's clock (the test clock) is ahead of the database's
		capture time.Duration // when a capture reaches the run, from capture_before (0: none comes)
		want    string
	}{
		{"Temporal ahead, a capture inside the window", 10 * time.Minute, -5 * time.Minute, statusSucceeded},
		{"Temporal behind, a capture past the window", -10 * time.Minute, 30 * time.Second, canceled},
		{"Temporal behind, no capture", -10 * time.Minute, 0, canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.on(workflows.ActivityAuthorize).Return(charged(authRef), nil)
			h.on(workflows.ActivityAuthorized).Return(h.recorded(tc.skew))
			h.on(workflows.ActivityCaptureAuthorization).Return(charged("cap_1"), nil).Once()
			h.on(workflows.ActivityCaptured).Return(nil).Once()
			// The void takes a minute (its call is noted once it ends): a late capture reaches the
			// run while it is sent.
			const voidTakes = time.Minute
			h.on(workflows.ActivityVoidAuthorization).After(voidTakes).Return(charged("void_1"), nil).Once()
			h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
				workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureAuthorizationExpired}).Return(nil).Once()
			in := manualInput(h, workflows.CapabilityIdempotent)
			in.CaptureBefore = h.start.Add(-tc.skew).Add(time.Hour) // the database's now, plus the window
			end := h.start.Add(time.Hour)                           // capture_before, read on the test clock
			answers := map[string]string{}
			if tc.capture != 0 {
				h.commandAt(time.Hour+tc.capture, workflows.UpdateCapture, "c1", workflows.Command{}, answers)
			}

			res := h.run(in)
			require.Equal(t, tc.want, res.Status)
			voided := h.calledAt[workflows.ActivityVoidAuthorization]
			if tc.want == statusSucceeded {
				require.Equal(t, statusSucceeded, answers["c1"])
				require.Empty(t, voided, "not voided before capture_before")
				return
			}
			require.Len(t, voided, 1)
			sent := voided[0].Add(-voidTakes)
			require.False(t, sent.Before(end), "voided %s before capture_before", end.Sub(sent))
			require.WithinDuration(t, end, sent, time.Minute, "voided within a minute of capture_before")
			require.Zero(t, h.calls(workflows.ActivityCaptureAuthorization), "nothing captured past capture_before")
			if tc.capture != 0 {
				require.Contains(t, answers["c1"], "rejected")
			}
		})
	}
}

func TestManualPaymentCanceledByTheMerchant(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.on(workflows.ActivityVoidAuthorization).Return(charged("void_1"), nil).Once()
	h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
		workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureCanceled}).Return(nil).Once()
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCancel, "x1", workflows.Command{}, answers)

	res := h.run(manualInput(h, workflows.CapabilityInquiry))
	require.Equal(t, string(payment.StatusCanceled), res.Status)
	require.Equal(t, string(payment.StatusCanceled), answers["x1"])
	h.env.AssertNumberOfCalls(t, workflows.ActivityAuthorize, 1)
}

// A capture whose answer is lost at a bank without idempotency is unknown, its hold kept; a
// charged settlement posts it, without a second capture.
func TestManualPaymentAmbiguousCaptureIsUnknownUntilSettled(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.on(workflows.ActivityCaptureAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
	h.on(workflows.ActivityMarkUnknown).Return(nil).Once()
	h.env.OnActivity(workflows.ActivityCaptured, mock.Anything,
		workflows.CapturedInput{OperationID: opID, AmountMinor: 12_345, ProviderReference: authRef}).Return(nil).Once()
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCapture, "c1", workflows.Command{}, answers)
	h.signalAt(time.Hour*3, workflows.Settlement{Outcome: workflows.OutcomeCharged})

	res := h.run(manualInput(h, workflows.CapabilityNone))
	require.Equal(t, statusSucceeded, res.Status)
	require.Equal(t, statusUnknown, answers["c1"], "the capture's answer: unknown, not failed")
	require.Len(t, h.calledAt[workflows.ActivityCaptureAuthorization], 1, "never captured twice")
	require.Empty(t, h.calledAt[workflows.ActivityVoidAuthorization], "an unknown capture is never voided at capture_before")
	h.env.AssertNumberOfCalls(t, workflows.ActivityAuthorize, 1)
}

// A lost void is unknown too; a not_charged settlement releases the hold, a charged one is refused.
func TestManualPaymentAmbiguousVoid(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
	h.on(workflows.ActivityMarkUnknown).Return(nil).Once()
	h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
		workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureCanceled}).Return(nil).Once()
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCancel, "x1", workflows.Command{}, answers)
	h.updateAt(2*time.Hour, "charged", workflows.Settlement{Outcome: workflows.OutcomeCharged}, answers)
	h.updateAt(3*time.Hour, "released", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)

	res := h.run(manualInput(h, workflows.CapabilityNone))
	require.Equal(t, string(payment.StatusCanceled), res.Status)
	require.Equal(t, statusUnknown, answers["x1"])
	require.Contains(t, answers["charged"], "rejected")
	require.Equal(t, string(payment.StatusCanceled), answers["released"])
	h.env.AssertNumberOfCalls(t, workflows.ActivityAuthorize, 1)
}

// A void whose inquiry finds the authorization captured (the bank took the money) is unknown,
// flagged for an operator: a not_charged settlement cannot overrule the bank's answer, a charged
// one must name what was captured, and the one that does posts that capture. The hold is never
// released as if the void had been done.
func TestManualPaymentVoidFindingACaptureKeepsTheHold(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
	h.on(workflows.ActivityInquireVoid).Return(workflows.ChargeResult{},
		temporal.NewNonRetryableApplicationError("the bank captured the authorization", workflows.ErrTypeCapturedAtBank, nil))
	h.on(workflows.ActivityMarkUnknown).Return(nil).Once()
	h.env.OnActivity(workflows.ActivityCaptured, mock.Anything,
		workflows.CapturedInput{OperationID: opID, AmountMinor: 7_000, ProviderReference: authRef}).Return(nil).Once()
	var reasons []string
	h.on(workflows.ActivityFlagStuck).Run(func(args mock.Arguments) {
		reasons = append(reasons, args.Get(1).(workflows.FlagInput).Reason)
	}).Return(nil)
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCancel, "x1", workflows.Command{}, answers)
	h.expectWaitingAt(2 * time.Hour)
	h.updateAt(3*time.Hour, "released", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
	h.updateAt(4*time.Hour, "no amount", workflows.Settlement{Outcome: workflows.OutcomeCharged}, answers)
	h.updateAt(5*time.Hour, "too much", workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 12_346}, answers)
	h.updateAt(6*time.Hour, "captured", workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 7_000}, answers)

	res := h.run(manualInput(h, workflows.CapabilityInquiry))
	require.Equal(t, statusSucceeded, res.Status)
	require.Equal(t, statusUnknown, answers["x1"])
	require.Contains(t, answers["released"], "rejected")
	require.Contains(t, answers["released"], "captured")
	require.Contains(t, answers["no amount"], "rejected")
	require.Contains(t, answers["too much"], "rejected")
	require.Equal(t, statusSucceeded, answers["captured"])
	require.Zero(t, h.calls(workflows.ActivityCanceled), "the hold is never released")
	h.env.AssertNumberOfCalls(t, workflows.ActivityCaptured, 1)
	require.Len(t, reasons, 2, "flagged, then cleared by the settlement")
	require.Contains(t, reasons[0], authRef)
	require.Empty(t, reasons[1])
	h.env.AssertNumberOfCalls(t, workflows.ActivityVoidAuthorization, 1)
}

// An automatic payment takes no capture.
func TestAutomaticPaymentRefusesCapture(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous()).Once()
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCapture, "c1", workflows.Command{}, answers)
	h.signalAt(time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})

	in := paymentInput(workflows.CapabilityNone)
	in.LocalSteps, in.Revision = true, workflows.CurrentRevision
	res := h.run(in)
	require.Equal(t, statusFailed, res.Status)
	require.Contains(t, answers["c1"], "rejected")
}

// A capture settled not_charged lets the authorization go: the settle update answers once the
// void is done, with canceled, never refused.
func TestManualPaymentCaptureSettledNotCharged(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.on(workflows.ActivityCaptureAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
	h.on(workflows.ActivityMarkUnknown).Return(nil).Once()
	h.on(workflows.ActivityVoidAuthorization).Return(charged("void_1"), nil).Once()
	h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
		workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureDeclined}).Return(nil).Once()
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCapture, "c1", workflows.Command{}, answers)
	h.updateAt(2*time.Hour, "released", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)

	res := h.run(manualInput(h, workflows.CapabilityNone))
	require.Equal(t, string(payment.StatusCanceled), res.Status)
	require.Equal(t, string(payment.StatusCanceled), answers["released"])
}

// A capture that reaches the workflow at capture_before is refused: no capture is sent past the
// capture window. (The test environment fires the expiry's timer first; the validator's own check
// of the time, for a task that brings both, is not reached here.)
func TestManualPaymentRefusesACaptureAtCaptureBefore(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	answers := map[string]string{}
	h.on(workflows.ActivityVoidAuthorization).Return(charged("void_1"), nil).Once()
	h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
		workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureAuthorizationExpired}).Return(nil).Once()
	h.commandAt(time.Hour, workflows.UpdateCapture, "at-the-end", workflows.Command{}, answers)

	res := h.run(manualInput(h, workflows.CapabilityIdempotent))
	require.Equal(t, string(payment.StatusCanceled), res.Status)
	require.Contains(t, answers["at-the-end"], "rejected")
	require.Zero(t, h.calls(workflows.ActivityCaptureAuthorization), "nothing captured")
}

// Once capture_before has passed, the authorization is being let go: a capture or cancel sent
// while its void runs is refused, never taken.
func TestManualPaymentRefusesCommandsOnceExpired(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	answers := map[string]string{}
	h.on(workflows.ActivityVoidAuthorization).After(time.Minute).Return(charged("void_1"), nil).Once()
	h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
		workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureAuthorizationExpired}).Return(nil).Once()
	h.commandAt(time.Hour+30*time.Second, workflows.UpdateCapture, "late", workflows.Command{}, answers)

	res := h.run(manualInput(h, workflows.CapabilityIdempotent))
	require.Equal(t, string(payment.StatusCanceled), res.Status)
	require.Contains(t, answers["late"], "rejected")
	require.Contains(t, answers["late"], "past its capture_before")
}

// A parked run continued as new keeps its step, not the command that led to it: the merchant's
// retry of that capture or cancel (the same command id) is its own, answered with the status
// (unknown), never refused as if another command came. A refusal would make the API forget the
// key while the bank may have done what it asked.
func TestManualPaymentContinuedRunTakesItsOwnCommandAgain(t *testing.T) {
	for _, c := range []struct {
		update string
		phase  string
	}{
		{workflows.UpdateCapture, workflows.PhaseCapture},
		{workflows.UpdateCancel, workflows.PhaseVoid},
	} {
		t.Run(c.update, func(t *testing.T) {
			h := newHarness(t)
			own, other := uuid.New(), uuid.New()
			in := manualInput(h, workflows.CapabilityNone)
			in.Parked = true
			in.Step = workflows.Step{Phase: c.phase, AuthorizationRef: authRef, AmountMinor: 5_000, CommandID: own}
			h.on(workflows.ActivityCaptured).Return(nil)
			h.on(workflows.ActivityCanceled).Return(nil)
			answers := map[string]string{}
			h.commandAt(time.Minute, c.update, "own", workflows.Command{ID: own, AmountMinor: 5_000}, answers)
			h.commandAt(2*time.Minute, c.update, "other", workflows.Command{ID: other, AmountMinor: 5_000}, answers)
			outcome := workflows.OutcomeCharged
			if c.phase == workflows.PhaseVoid {
				outcome = workflows.OutcomeNotCharged
			}
			h.signalAt(time.Hour, workflows.Settlement{Outcome: outcome})

			h.run(in)
			require.Equal(t, statusUnknown, answers["own"], "its own command, in flight")
			require.Contains(t, answers["other"], "rejected", "another command is still refused")
		})
	}
}

// A capture settled not_charged through the settle update is voided; when the void's answer is
// lost too, the update answers unknown then (it does not wait for the void's settlement), and the
// parked run still continues as new after its rounds, its history kept small.
func TestManualPaymentSettleUpdateAnswersWhenTheVoidParks(t *testing.T) {
	h := newHarness(t)
	in := manualInput(h, workflows.CapabilityInquiry)
	in.BookingWindow = time.Millisecond
	in.Parked, in.InquiryWait = true, time.Hour
	in.Step = workflows.Step{Phase: workflows.PhaseCapture, AuthorizationRef: authRef, AmountMinor: 5_000, CommandID: uuid.New()}
	h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{}, ambiguous())
	h.on(workflows.ActivityInquireVoid).Return(workflows.ChargeResult{}, notFound())
	answers := map[string]string{}
	h.updateAt(time.Minute, "released", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
	h.fallbacks()

	next := continuedAsNew(h, workflows.WorkflowPayment, in)
	require.Equal(t, statusUnknown, answers["released"], "applied: the capture let go, its void unknown")
	require.Equal(t, workflows.PhaseVoid, next.Step.Phase)
	require.True(t, next.Parked)
	require.Zero(t, h.calls(workflows.ActivityCanceled), "the hold is kept while the void is unknown")
}

// Payments started under Revision 2 replay as they ran: their void finding a capture kept
// inquiring, and a not_charged settlement released the hold.
func TestManualPaymentRevision2VoidFindingACapture(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
	h.on(workflows.ActivityInquireVoid).Return(workflows.ChargeResult{},
		temporal.NewNonRetryableApplicationError("the bank captured the authorization", workflows.ErrTypeCapturedAtBank, nil))
	h.on(workflows.ActivityMarkUnknown).Return(nil).Once()
	h.on(workflows.ActivityCanceled).Return(nil).Once()
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCancel, "x1", workflows.Command{}, answers)
	h.updateAt(3*time.Hour, "released", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)

	in := manualInput(h, workflows.CapabilityInquiry)
	in.Revision = 2
	res := h.run(in)
	require.Equal(t, string(payment.StatusCanceled), res.Status)
	require.Equal(t, string(payment.StatusCanceled), answers["released"])
	require.Zero(t, h.calls(workflows.ActivityFlagStuck))
}

// A void's not_charged settlement that arrives while an inquiry finds the void done is no
// conflict: both say the bank took nothing, and the hold is released.
func TestManualPaymentVoidSettledWhileAnInquiryFindsItDone(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
	h.on(workflows.ActivityInquireVoid).Return(workflows.ChargeResult{}, notFound()).Times(3)
	h.on(workflows.ActivityInquireVoid).Run(func(mock.Arguments) {
		h.env.SignalWorkflow(workflows.SignalSettlement, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
	}).Return(charged("void_1"), nil).Once()
	h.on(workflows.ActivityMarkUnknown).Return(nil).Once()
	h.on(workflows.ActivityCanceled).Return(nil).Once()
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCancel, "x1", workflows.Command{}, answers)

	in := manualInput(h, workflows.CapabilityInquiry)
	in.BookingWindow = time.Millisecond
	res := h.run(in)
	require.Equal(t, string(payment.StatusCanceled), res.Status)
	require.Zero(t, h.calls(workflows.ActivityFlagStuck), "no conflict for an operator")
}

// A capture settled not_charged through the update was applied: its void went out. When that
// void's inquiry then finds the authorization captured, the update answers with the conflict
// (ErrTypeBankConflict), as a settlement set aside is: the import reports it for an operator,
// neither as settled nor as a refusal to try again.
func TestManualPaymentAppliedSettleAnsweredWhenTheVoidFindsACapture(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.on(workflows.ActivityCaptureAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
	h.on(workflows.ActivityInquireCapture).Return(workflows.ChargeResult{}, notFound())
	h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
	h.on(workflows.ActivityInquireVoid).Return(workflows.ChargeResult{},
		temporal.NewNonRetryableApplicationError("the bank captured the authorization au_1", workflows.ErrTypeCapturedAtBank, nil))
	h.on(workflows.ActivityMarkUnknown).Return(nil)
	h.on(workflows.ActivityCaptured).Return(nil)
	var reasons []string
	h.on(workflows.ActivityFlagStuck).Run(func(args mock.Arguments) {
		reasons = append(reasons, args.Get(1).(workflows.FlagInput).Reason)
	}).Return(nil)
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCapture, "c1", workflows.Command{AmountMinor: 5_000}, answers)
	h.updateAt(3*time.Hour, "capture-not-charged", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
	h.updateAt(5*time.Hour, "captured", workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 5_000}, answers)
	in := manualInput(h, workflows.CapabilityInquiry)
	in.BookingWindow = time.Millisecond
	res := h.run(in)
	require.Equal(t, statusSucceeded, res.Status)
	require.Contains(t, answers["capture-not-charged"], "failed: the bank captured the authorization au_1 that kasa was voiding")
	require.Contains(t, answers["capture-not-charged"], workflows.ErrTypeBankConflict)
	require.Equal(t, statusSucceeded, answers["captured"])
	require.Equal(t, 1, h.calls(workflows.ActivityVoidAuthorization))
	require.NotEmpty(t, reasons)
	require.NotContains(t, reasons[0], "activity error", "the bank's words, not the SDK's wrapper")
}

// A bank that can be asked but not inquired on a schedule (idempotent) refuses the void because
// it captured: the void's own answer holds the payment for an operator, as an inquiry would.
func TestManualPaymentVoidRefusedAsCapturedKeepsTheHold(t *testing.T) {
	h := newHarness(t)
	h.authorizes()
	h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{},
		temporal.NewNonRetryableApplicationError("the bank refused to void the authorization au_1: it captured it", workflows.ErrTypeCapturedAtBank, nil)).Once()
	h.on(workflows.ActivityMarkUnknown).Return(nil).Once()
	h.env.OnActivity(workflows.ActivityCaptured, mock.Anything,
		workflows.CapturedInput{OperationID: opID, AmountMinor: 9_000, ProviderReference: authRef}).Return(nil).Once()
	answers := map[string]string{}
	h.commandAt(time.Minute, workflows.UpdateCancel, "x1", workflows.Command{}, answers)
	h.updateAt(2*time.Hour, "released", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
	h.updateAt(3*time.Hour, "captured", workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 9_000}, answers)

	res := h.run(manualInput(h, workflows.CapabilityIdempotent))
	require.Equal(t, statusSucceeded, res.Status)
	require.Contains(t, answers["released"], "rejected")
	require.Equal(t, statusSucceeded, answers["captured"])
	require.Zero(t, h.calls(workflows.ActivityCanceled))
}

// A settlement file listing a capture of a payment whose void got no answer (a bank that cannot
// be asked) is the bank's record that the money moved: the capture it names is posted. The cancel
// that led to the void is marked as the command taken (from Revision 6: it reached the bank, so
// its key stays its own); before, the capture named no command.
func TestManualPaymentUnknownVoidSettledByAListedCapture(t *testing.T) {
	for _, rev := range []int{5, workflows.CurrentRevision} {
		t.Run(fmt.Sprintf("revision %d", rev), func(t *testing.T) {
			h := newHarness(t)
			h.authorizes()
			cancel := uuid.New()
			taken := cancel
			if rev < 6 {
				taken = uuid.Nil
			}
			h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
			h.on(workflows.ActivityMarkUnknown).Return(nil).Once()
			h.env.OnActivity(workflows.ActivityCaptured, mock.Anything,
				workflows.CapturedInput{OperationID: opID, AmountMinor: 2_500, ProviderReference: authRef, CommandID: taken}).Return(nil).Once()
			answers := map[string]string{}
			h.commandAt(time.Minute, workflows.UpdateCancel, "x1", workflows.Command{ID: cancel}, answers)
			h.updateAt(2*time.Hour, "no amount", workflows.Settlement{Outcome: workflows.OutcomeCharged}, answers)
			h.updateAt(3*time.Hour, "listed", workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 2_500}, answers)

			in := manualInput(h, workflows.CapabilityNone)
			in.Revision = rev
			res := h.run(in)
			require.Equal(t, statusSucceeded, res.Status)
			require.Contains(t, answers["no amount"], "rejected")
			require.Equal(t, statusSucceeded, answers["listed"])
			require.Zero(t, h.calls(workflows.ActivityCanceled), "the hold is never released")
		})
	}
}

// parkedVoid is a manual payment whose void of authRef (the merchant's cancel, cmd) is unknown.
func parkedVoid(h *harness, c workflows.Capability, cmd uuid.UUID) workflows.PaymentInput {
	in := manualInput(h, c)
	in.Parked, in.InquiryWait = true, 2*time.Second
	in.Step = workflows.Step{Phase: workflows.PhaseVoid, AuthorizationRef: authRef, FailureCode: payment.FailureCanceled, CommandID: cmd}
	return in
}

func capturedAtBank() error {
	return temporal.NewNonRetryableApplicationError("the bank captured the authorization au_1", workflows.ErrTypeCapturedAtBank, nil)
}

// A charged settlement naming the amount captured that reaches an unknown void while its inquiry
// finds the capture says what the bank says: the capture is posted, never set aside as a
// conflict for an operator.
func TestManualPaymentChargedSettlementRacingAnInquiryThatFindsTheCapture(t *testing.T) {
	h := newHarness(t)
	cancel := uuid.New()
	answers := map[string]string{}
	h.on(workflows.ActivityInquireVoid).Run(func(mock.Arguments) {
		h.update("racing", workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 7_000}, answers)
	}).Return(workflows.ChargeResult{}, capturedAtBank()).Once()
	h.env.OnActivity(workflows.ActivityCaptured, mock.Anything,
		workflows.CapturedInput{OperationID: opID, AmountMinor: 7_000, ProviderReference: authRef, CommandID: cancel}).Return(nil).Once()

	res := h.run(parkedVoid(h, workflows.CapabilityInquiry, cancel))
	require.Equal(t, statusSucceeded, res.Status)
	require.Equal(t, statusSucceeded, answers["racing"])
	require.Zero(t, h.calls(workflows.ActivityFlagStuck), "no conflict: both say the authorization was captured")
	require.Zero(t, h.calls(workflows.ActivityCanceled))
}

// A not_charged settlement of an unknown void says nothing was captured, not that the bank let
// the authorization go: where the void may be sent twice it is sent once more before the hold is
// released, so the payer's money is not blocked at the bank until the authorization expires.
// The void's answer does not stop the release, unless the bank says it captured.
func TestManualPaymentVoidSettledNotChargedIsVoidedAgain(t *testing.T) {
	for _, tc := range []struct {
		name       string
		capability workflows.Capability
		racing     bool  // the settlement reaches the run while an inquiry says the authorization is open
		void       error // the void's answer
		voids      int
	}{
		{"inquiry says still open", workflows.CapabilityInquiry, true, nil, 1},
		{"idempotent", workflows.CapabilityIdempotent, false, nil, 1},
		{"void unanswered", workflows.CapabilityInquiry, false, ambiguous(), 1},
		{"none: never sent twice", workflows.CapabilityNone, false, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			cmd := uuid.New()
			answers := map[string]string{}
			notCharged := workflows.Settlement{Outcome: workflows.OutcomeNotCharged}
			if tc.racing {
				h.on(workflows.ActivityInquireVoid).Run(func(mock.Arguments) { h.update("file", notCharged, answers) }).
					Return(workflows.ChargeResult{}, notFound()).Once()
			} else {
				h.updateAt(time.Second, "file", notCharged, answers)
			}
			var voids []workflows.BankCallInput
			h.on(workflows.ActivityVoidAuthorization).Run(func(args mock.Arguments) {
				voids = append(voids, args.Get(1).(workflows.BankCallInput))
			}).Return(charged("void_2"), tc.void)
			h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
				workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureCanceled, CommandID: cmd}).Return(nil).Once()

			res := h.run(parkedVoid(h, tc.capability, cmd))
			require.Equal(t, workflows.PaymentResult{Status: string(payment.StatusCanceled), FailureCode: payment.FailureCanceled}, res)
			require.Equal(t, string(payment.StatusCanceled), answers["file"])
			require.Len(t, voids, tc.voids)
			for _, v := range voids {
				require.Equal(t, workflows.BankCallInput{OperationID: opID, AuthorizationRef: authRef, Send: 1}, v)
			}
		})
	}
}

// The void sent again for a not_charged settlement is refused because the bank captured the
// authorization: the file was wrong, the hold is kept for an operator, and the settlement is
// answered as the conflict it is. The operator's retry asks the bank at once. From Revision 11
// the bank is asked before the settlement is applied: the inquiry finds the capture, and no void
// is sent again.
func TestManualPaymentVoidSentAgainFindsACapture(t *testing.T) {
	for _, tc := range []struct {
		revision  int
		voids     int
		inquiries []time.Duration
	}{
		{10, 1, []time.Duration{time.Hour}},
		{11, 0, []time.Duration{time.Second, time.Hour, 2 * time.Hour}}, // each settlement asked about
	} {
		t.Run(fmt.Sprintf("revision %d", tc.revision), func(t *testing.T) {
			h := newHarness(t)
			cancel := uuid.New()
			answers := map[string]string{}
			h.updateAt(time.Second, "file", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
			h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{}, capturedAtBank()).Once()
			h.on(workflows.ActivityInquireVoid).Return(workflows.ChargeResult{}, capturedAtBank())
			h.on(workflows.ActivityFlagStuck).Return(nil)
			h.env.OnActivity(workflows.ActivityCaptured, mock.Anything,
				workflows.CapturedInput{OperationID: opID, AmountMinor: 5_000, ProviderReference: authRef, CommandID: cancel}).Return(nil).Once()
			h.retryAt(time.Hour)
			h.updateAt(2*time.Hour, "captured", workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 5_000}, answers)

			in := parkedVoid(h, workflows.CapabilityInquiry, cancel)
			in.Revision = tc.revision
			res := h.run(in)
			require.Equal(t, statusSucceeded, res.Status)
			require.Contains(t, answers["file"], workflows.ErrTypeBankConflict)
			require.Equal(t, statusSucceeded, answers["captured"])
			require.Zero(t, h.calls(workflows.ActivityCanceled), "the hold is never released")
			require.Equal(t, tc.voids, h.calls(workflows.ActivityVoidAuthorization))
			require.Equal(t, tc.inquiries, h.offsets(workflows.ActivityInquireVoid), "asked at the retry")
		})
	}
}

// The runbook's capture the bank reversed (docs/operations.md, "Overdue authorizations"): the
// operator's retry asks the bank at once, and its answer (the authorization let go) cancels the
// payment with no settlement.
func TestManualPaymentRetryOnceTheBankReversedTheCapture(t *testing.T) {
	h := newHarness(t)
	cmd := uuid.New()
	h.on(workflows.ActivityInquireVoid).Return(workflows.ChargeResult{}, capturedAtBank()).Once()
	h.on(workflows.ActivityInquireVoid).Return(charged("void_1"), nil).Once()
	h.on(workflows.ActivityFlagStuck).Return(nil)
	h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
		workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureCanceled, CommandID: cmd}).Return(nil).Once()
	h.retryAt(time.Hour)

	res := h.run(parkedVoid(h, workflows.CapabilityInquiry, cmd))
	require.Equal(t, string(payment.StatusCanceled), res.Status)
	require.Equal(t, []time.Duration{2 * time.Second, time.Hour}, h.offsets(workflows.ActivityInquireVoid), "asked at the retry")
}

// A capture whose inquiry says the bank declined it is voided: the inquiry's answer closed the
// capture, not the void that follows. When that void's answer is lost too, the payment is unknown
// again and takes a settlement for the void.
func TestManualPaymentVoidAfterADeclinedCaptureTakesASettlement(t *testing.T) {
	h := newHarness(t)
	cmd := uuid.New()
	in := manualInput(h, workflows.CapabilityInquiry)
	in.Parked, in.InquiryWait, in.BookingWindow = true, 2*time.Second, time.Millisecond
	in.Step = workflows.Step{Phase: workflows.PhaseCapture, AuthorizationRef: authRef, AmountMinor: 5_000, CommandID: cmd}
	h.on(workflows.ActivityInquireCapture).Return(workflows.ChargeResult{}, declined()).Once()
	h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Times(3)
	h.on(workflows.ActivityVoidAuthorization).Return(charged("void_1"), nil).Once()
	h.on(workflows.ActivityInquireVoid).Return(workflows.ChargeResult{}, notFound())
	h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
		workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureDeclined, CommandID: cmd}).Return(nil).Once()
	answers := map[string]string{}
	h.expectWaitingAt(time.Hour - time.Second)
	h.updateAt(time.Hour, "file", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)

	res := h.run(in)
	require.Equal(t, string(payment.StatusCanceled), res.Status)
	require.Equal(t, string(payment.StatusCanceled), answers["file"])
	require.Equal(t, 4, h.calls(workflows.ActivityVoidAuthorization), "three sends, then the one the settlement sent")
}

// An authorization whose answer was lost is decided by an inquiry; the merchant's capture or
// cancel then gets no answer either. That phase is unknown, and its settlement (update or
// signal) is taken: the inquiry that decided the authorization did not decide it.
func TestManualPaymentPhaseAfterAnInquiryDecidedAuthorizationTakesItsSettlement(t *testing.T) {
	inquiryLost := temporal.NewNonRetryableApplicationError("provider timed out", workflows.ErrTypeAmbiguous, nil)
	for _, tc := range []struct {
		name           string
		cancel, signal bool
	}{
		{"capture, settle update", false, false},
		{"capture, settlement signal", false, true},
		{"cancel, settle update", true, false},
		{"cancel, settlement signal", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			cmd := uuid.New()
			h.on(workflows.ActivityAuthorize).Return(workflows.ChargeResult{}, ambiguous()).Once()
			h.on(workflows.ActivityInquireAuthorization).Return(workflows.ChargeResult{}, inquiryLost).Once() // parks it unknown
			h.on(workflows.ActivityInquireAuthorization).Return(charged(authRef), nil).Once()                 // the parked run's inquiry decides it
			h.on(workflows.ActivityAuthorized).Return(h.recorded(0)).Once()
			answers := map[string]string{}
			s := workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 5_000, OperationID: opID}
			want := statusSucceeded
			if tc.cancel {
				h.on(workflows.ActivityVoidAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
				h.on(workflows.ActivityInquireVoid).Return(workflows.ChargeResult{}, inquiryLost)
				h.on(workflows.ActivityVoidAuthorization).Return(charged("void_2"), nil).Once() // sent again for the not_charged
				h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
					workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureCanceled, CommandID: cmd}).Return(nil).Once()
				h.commandAt(time.Minute, workflows.UpdateCancel, "cmd", workflows.Command{ID: cmd}, answers)
				s, want = workflows.Settlement{Outcome: workflows.OutcomeNotCharged, OperationID: opID}, string(payment.StatusCanceled)
			} else {
				h.on(workflows.ActivityCaptureAuthorization).Return(workflows.ChargeResult{}, ambiguous()).Once()
				h.on(workflows.ActivityInquireCapture).Return(workflows.ChargeResult{}, inquiryLost)
				h.env.OnActivity(workflows.ActivityCaptured, mock.Anything,
					workflows.CapturedInput{OperationID: opID, AmountMinor: 5_000, ProviderReference: authRef, CommandID: cmd}).Return(nil).Once()
				h.commandAt(time.Minute, workflows.UpdateCapture, "cmd", workflows.Command{ID: cmd, AmountMinor: 5_000}, answers)
			}
			if tc.signal {
				h.signalAt(3*time.Hour, s)
			} else {
				h.updateAt(3*time.Hour, "file", s, answers)
			}

			in := manualInput(h, workflows.CapabilityInquiry)
			in.BookingWindow = time.Millisecond
			res := h.run(in)
			require.Equal(t, want, res.Status)
			require.Equal(t, statusUnknown, answers["cmd"], "the command's answer was lost")
			if !tc.signal {
				require.Equal(t, want, answers["file"])
			}
		})
	}
}

// An unknown void's inquiry finds the authorization let go (the bank's definite answer) while a
// charged settlement naming a capture reaches the run: the settlement does not overrule the
// bank, or which arrived first would decide whether the payer is charged. The hold is kept for
// an operator, whose not_charged cancels the payment.
func TestManualPaymentChargedSettlementRacingAnInquiryThatFindsTheVoidDone(t *testing.T) {
	// From Revision 11 the operator's settlement is checked with the bank too before it applies.
	for _, tc := range []struct {
		revision int
		asked    []time.Duration // the inquiries after the first
	}{{10, nil}, {11, []time.Duration{2 * time.Hour}}} {
		t.Run(fmt.Sprintf("revision %d", tc.revision), func(t *testing.T) {
			h := newHarness(t)
			cmd := uuid.New()
			answers := map[string]string{}
			h.on(workflows.ActivityInquireVoid).Run(func(mock.Arguments) {
				h.update("file", workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 7_000, OperationID: opID}, answers)
			}).Return(charged("void_1"), nil).Once()
			h.on(workflows.ActivityInquireVoid).Return(charged("void_1"), nil) // the bank's answer stays the same
			var reasons []string
			h.on(workflows.ActivityFlagStuck).Run(func(args mock.Arguments) {
				reasons = append(reasons, args.Get(1).(workflows.FlagInput).Reason)
			}).Return(nil)
			h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
				workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureCanceled, CommandID: cmd}).Return(nil).Once()
			h.on(workflows.ActivityVoidAuthorization).Return(charged("void_2"), nil)
			h.updateAt(time.Hour, "charged again", workflows.Settlement{Outcome: workflows.OutcomeCharged, AmountMinor: 7_000}, answers)
			h.updateAt(2*time.Hour, "operator", workflows.Settlement{Outcome: workflows.OutcomeNotCharged, Note: "the bank confirms the void"}, answers)

			in := parkedVoid(h, workflows.CapabilityInquiry, cmd)
			in.Revision = tc.revision
			res := h.run(in)
			require.Equal(t, string(payment.StatusCanceled), res.Status)
			require.Contains(t, answers["file"], workflows.ErrTypeBankConflict)
			require.Contains(t, answers["file"], "let go (void_1)")
			require.Contains(t, answers["charged again"], "rejected", "refused while the conflict is held")
			require.Equal(t, string(payment.StatusCanceled), answers["operator"])
			require.Zero(t, h.calls(workflows.ActivityCaptured), "no capture is posted against the bank's void")
			require.Zero(t, h.calls(workflows.ActivityVoidAuthorization), "the void is done: not sent again")
			require.Len(t, reasons, 2, "flagged, then cleared by the operator's settlement")
			require.Equal(t, tc.asked, h.offsets(workflows.ActivityInquireVoid))
		})
	}
}

// With inquiry, an authorization still not found once its last send's booking window has passed
// is the bank's answer that it holds none: no settlement file lists authorizations, so the
// inquiry ends the payment (failed, its hold released) instead of parking it for a person. An
// inquiry that finds nothing earlier (the send's answer and its first inquiry both lost) waits
// the window out, as the bank may still book it.
func TestManualPaymentAuthorizationTheBankNeverMadeFails(t *testing.T) {
	h := newHarness(t)
	inquiryLost := temporal.NewNonRetryableApplicationError("provider timed out", workflows.ErrTypeAmbiguous, nil)
	h.on(workflows.ActivityAuthorize).Return(workflows.ChargeResult{}, ambiguous()).Once()
	h.on(workflows.ActivityInquireAuthorization).Return(workflows.ChargeResult{}, inquiryLost).Once() // parks it at once
	h.on(workflows.ActivityInquireAuthorization).Return(workflows.ChargeResult{}, notFound())
	h.env.OnActivity(workflows.ActivityRelease, mock.Anything,
		workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureDeclined}).Return(nil).Once()
	in := manualInput(h, workflows.CapabilityInquiry)
	in.BookingWindow = time.Minute

	res := h.run(in)
	require.Equal(t, workflows.PaymentResult{Status: statusFailed, FailureCode: payment.FailureDeclined}, res)
	inquiries := h.offsets(workflows.ActivityInquireAuthorization)
	require.GreaterOrEqual(t, inquiries[len(inquiries)-1], time.Minute, "not before the booking window has passed")
	require.Less(t, inquiries[len(inquiries)-1], 2*time.Minute)
	require.Zero(t, h.calls(workflows.ActivityAuthorized))
}

// A continued run of an unknown authorization (its run before waited out the booking window)
// ends on the first inquiry that still finds none; a charged settlement naming an authorization
// that reaches it while that inquiry runs does not overrule the bank: a conflict for an operator,
// whose not_charged then fails the payment.
func TestManualPaymentContinuedAuthorizationTheBankNeverMade(t *testing.T) {
	for _, racing := range []bool{false, true} {
		t.Run(fmt.Sprintf("charged settlement racing: %v", racing), func(t *testing.T) {
			h := newHarness(t)
			in := manualInput(h, workflows.CapabilityInquiry)
			in.Parked, in.InquiryWait, in.BookingWindow = true, 2*time.Second, time.Hour
			answers := map[string]string{}
			inquiry := h.on(workflows.ActivityInquireAuthorization)
			if racing {
				inquiry.Run(func(mock.Arguments) {
					h.update("file", workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: authRef, OperationID: opID}, answers)
				})
				h.updateAt(time.Hour, "operator", workflows.Settlement{Outcome: workflows.OutcomeNotCharged, OperationID: opID}, answers)
			}
			inquiry.Return(workflows.ChargeResult{}, notFound()).Once()
			h.env.OnActivity(workflows.ActivityRelease, mock.Anything,
				workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureDeclined}).Return(nil).Once()

			res := h.run(in)
			require.Equal(t, workflows.PaymentResult{Status: statusFailed, FailureCode: payment.FailureDeclined}, res)
			require.Zero(t, h.calls(workflows.ActivityAuthorized), "never taken as authorized")
			if racing {
				require.Contains(t, answers["file"], workflows.ErrTypeBankConflict)
				require.Contains(t, answers["file"], "holds no authorization")
				require.Equal(t, statusFailed, answers["operator"])
			} else {
				require.Equal(t, []time.Duration{2 * time.Second}, h.offsets(workflows.ActivityInquireAuthorization), "the first inquiry ends it")
			}
		})
	}
}

// A command that reaches the run while its authorization's record is being written (the payment
// may read requires_capture already) is not refused as if the payment could not take it: it is
// rejected as not yet taken, so the API answers 503 and the merchant sends it again, when it is
// taken.
func TestManualPaymentCommandWhileTheAuthorizationIsRecorded(t *testing.T) {
	h := newHarness(t)
	answers := map[string]string{}
	h.on(workflows.ActivityAuthorize).Return(charged(authRef), nil)
	h.on(workflows.ActivityAuthorized).Run(func(mock.Arguments) {
		h.env.UpdateWorkflow(workflows.UpdateCapture, "early", h.answerTo("early", answers), workflows.Command{AmountMinor: 5_000})
		h.env.UpdateWorkflow(workflows.UpdateCancel, "early-x", h.answerTo("early-x", answers), workflows.Command{})
	}).Return(h.recorded(0))
	h.on(workflows.ActivityCaptureAuthorization).Return(charged("cap_1"), nil).Once()
	h.on(workflows.ActivityCaptured).Return(nil).Once()
	h.commandAt(time.Minute, workflows.UpdateCapture, "c1", workflows.Command{AmountMinor: 5_000}, answers)

	res := h.run(manualInput(h, workflows.CapabilityIdempotent))
	require.Equal(t, statusSucceeded, res.Status)
	for _, id := range []string{"early", "early-x"} {
		require.Contains(t, answers[id], "rejected")
		require.Contains(t, answers[id], "being recorded", "not a refusal: %s", answers[id])
	}
	require.Equal(t, statusSucceeded, answers["c1"])
}

// A manual payment's run parked unknown in its authorization (capability none: its send found
// another's) whose authorization another run then recorded (a run moved off a task queue nobody
// polled, raced by a late worker that ran the first; or this run's own task that failed after its
// step wrote it) reads requires_capture, no final status. Nothing else waits for the capture, so
// from Revision 10 the run takes the payment on, as a run that finds it authorized at its first
// step does: it takes the merchant's capture, or voids the authorization at capture_before,
// rather than keep the hold for ever.
func TestManualPaymentParkedRunTakesAnAuthorizationRecordedElsewhere(t *testing.T) {
	for _, tc := range []struct {
		name    string
		capture bool
		want    string
	}{
		{"captured", true, statusSucceeded},
		{"expired", false, string(payment.StatusCanceled)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.on(workflows.ActivityAuthorize).Return(workflows.ChargeResult{}, ambiguous())
			h.on(workflows.ActivityReadPaymentStatus).Return(workflows.StatusRead{Status: statusUnknown}, nil).Times(2)
			h.on(workflows.ActivityReadPaymentStatus).Return(workflows.StatusRead{Status: string(payment.StatusRequiresCapture), ProviderReference: "au_other"}, nil)
			h.env.OnActivity(workflows.ActivityAuthorized, mock.Anything,
				workflows.FinalizeInput{OperationID: opID, ProviderReference: "au_other"}).Return(h.recorded(0)).Once()
			h.env.OnActivity(workflows.ActivityCaptureAuthorization, mock.Anything,
				workflows.BankCallInput{OperationID: opID, AuthorizationRef: "au_other", AmountMinor: 12_345, Send: 1}).Return(charged("cap_1"), nil).Once()
			h.on(workflows.ActivityCaptured).Return(nil).Once()
			var voided []time.Time
			h.env.OnActivity(workflows.ActivityVoidAuthorization, mock.Anything,
				workflows.BankCallInput{OperationID: opID, AuthorizationRef: "au_other", Send: 1}).Run(func(mock.Arguments) {
				voided = append(voided, h.env.Now())
			}).Return(charged("void_1"), nil).Once()
			h.env.OnActivity(workflows.ActivityCanceled, mock.Anything,
				workflows.ReleaseInput{OperationID: opID, FailureCode: payment.FailureAuthorizationExpired}).Return(nil).Once()
			answers := map[string]string{}
			if tc.capture {
				h.commandAt(30*time.Minute, workflows.UpdateCapture, "c1", workflows.Command{}, answers)
			}

			res := h.run(manualInput(h, workflows.CapabilityNone))
			require.Equal(t, tc.want, res.Status)
			require.Equal(t, 3, h.calls(workflows.ActivityReadPaymentStatus), "read until it finds the authorization")
			require.Equal(t, 1, h.calls(workflows.ActivityAuthorize), "nothing sent to the bank again")
			if tc.capture {
				require.Equal(t, statusSucceeded, answers["c1"])
				require.Empty(t, voided)
				return
			}
			require.Len(t, voided, 1)
			require.WithinDuration(t, h.start.Add(time.Hour), voided[0], time.Minute, "voided within a minute of capture_before")
		})
	}
}

// From Revision 10 a manual payment whose authorization got no answer is marked unknown only if
// it is still processing: one another run authorized meanwhile (the moved run's race) is refused
// with the authorization's reference, and the run takes it on, waiting for its capture, instead
// of reopening it. A run of Revision 9 marks it with MarkUnknown, which reopened it.
func TestMarkingAnAuthorizationRecordedElsewhereTakesItOn(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivityAuthorize).Return(workflows.ChargeResult{}, ambiguous())
	h.on(workflows.ActivityMarkAuthorizationUnknown).Return(temporal.NewNonRetryableApplicationError(
		"payment is requires_capture, cannot become unknown", workflows.ErrTypeInconsistent, nil,
		string(payment.StatusRequiresCapture), "au_other")).Once()
	h.env.OnActivity(workflows.ActivityAuthorized, mock.Anything,
		workflows.FinalizeInput{OperationID: opID, ProviderReference: "au_other"}).Return(h.recorded(0)).Once()
	h.env.OnActivity(workflows.ActivityCaptureAuthorization, mock.Anything,
		workflows.BankCallInput{OperationID: opID, AuthorizationRef: "au_other", AmountMinor: 12_345, Send: 1}).Return(charged("cap_1"), nil).Once()
	h.on(workflows.ActivityCaptured).Return(nil).Once()
	answers := map[string]string{}
	h.commandAt(30*time.Minute, workflows.UpdateCapture, "c1", workflows.Command{}, answers)

	res := h.run(manualInput(h, workflows.CapabilityNone))
	require.Equal(t, statusSucceeded, res.Status)
	require.Equal(t, statusSucceeded, answers["c1"])
	require.Zero(t, h.calls(workflows.ActivityMarkUnknown)+h.calls(workflows.ActivityFlagStuck), "nothing reopened, no operator asked for")
	require.Zero(t, h.calls(workflows.ActivityReadPaymentStatus), "never parked")
	require.Equal(t, 1, h.calls(workflows.ActivityAuthorize), "nothing sent to the bank again")
}
