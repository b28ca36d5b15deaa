package workflows_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/kasa-pay/kasa/workflows"
)

// current is a payment started now: with the booking window and the rules of CurrentRevision.
func current(c workflows.Capability) workflows.PaymentInput {
	in := paymentInput(c)
	in.Revision = workflows.CurrentRevision
	in.BookingWindow = 30 * time.Second
	return in
}

func inconsistent() error {
	return temporal.NewNonRetryableApplicationError("payment is failed, cannot become succeeded", workflows.ErrTypeInconsistent, nil)
}

// With inquiry, a charge the bank has not booked yet is inquired again until the booking window
// has passed since the send ended; only then is it re-sent (with the next send number).
func TestPaymentWorkflowBookingWindow(t *testing.T) {
	s := time.Second
	runPaymentCases(t, []paymentCase{
		{
			name: "a late booking is found within the window, never re-sent",
			in:   current(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
				h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound()).Times(3)
				h.on(workflows.ActivityInquire).Return(charged("ch_late"), nil)
			},
			want: workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_late"},
			calls: map[string]int{
				workflows.ActivityReserve: 1, workflows.ActivityCharge: 1, workflows.ActivityInquire: 4,
				workflows.ActivityFinalize: 1,
			},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				// 2 s, then doubling, the last one when the window has passed.
				require.Equal(t, []time.Duration{2 * s, 6 * s, 14 * s, 30 * s}, h.offsets(workflows.ActivityInquire))
			},
		},
		{
			name: "still not found after the window: re-sent as send 2",
			in:   current(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous()).Once()
				h.on(workflows.ActivityCharge).Return(charged("ch_2"), nil)
				h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound())
			},
			want: workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_2"},
			calls: map[string]int{
				workflows.ActivityReserve: 1, workflows.ActivityCharge: 2, workflows.ActivityInquire: 4,
				workflows.ActivityFinalize: 1,
			},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{0, 30 * s}, h.offsets(workflows.ActivityCharge))
				// It says when send 1 ended and the window waited since, so that a worker whose own
				// window is longer holds it back.
				h.env.AssertActivityCalled(t, workflows.ActivityCharge, mock.Anything, mock.MatchedBy(func(in workflows.ChargeInput) bool {
					return in.Send == 2 && in.Resend.Waited == 30*s && !in.Resend.PreviousEnded.IsZero()
				}))
				h.env.AssertActivityCalled(t, workflows.ActivityCharge, mock.Anything, mock.MatchedBy(func(in workflows.ChargeInput) bool {
					return in.Send == 1 && in.Resend == (workflows.Resend{})
				}))
			},
		},
		{
			name: "a short window re-sends sooner",
			in: func() workflows.PaymentInput {
				in := current(workflows.CapabilityInquiry)
				in.BookingWindow = 5 * time.Second
				return in
			}(),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous()).Once()
				h.on(workflows.ActivityCharge).Return(charged("ch_2"), nil)
				h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound())
			},
			want: workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_2"},
			calls: map[string]int{
				workflows.ActivityReserve: 1, workflows.ActivityCharge: 2, workflows.ActivityInquire: 2,
				workflows.ActivityFinalize: 1,
			},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{2 * s, 5 * s}, h.offsets(workflows.ActivityInquire))
			},
		},
	})
}

// A step the data contradicts leaves the payment flagged stuck, visible to operators, until an
// operator's retry signal runs the step again.
func TestPaymentWorkflowStuckUntilRetry(t *testing.T) {
	runPaymentCases(t, []paymentCase{
		{
			name: "finalize contradicted, retried by the operator",
			in:   current(workflows.CapabilityIdempotent),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(charged("ch_1"), nil)
				h.on(workflows.ActivityFinalize).Return(inconsistent()).Once()
				h.retryAt(time.Hour)
			},
			want: workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_1"},
			calls: map[string]int{
				workflows.ActivityReserve: 1, workflows.ActivityCharge: 1, workflows.ActivityFinalize: 2,
				workflows.ActivityFlagStuck: 2,
			},
			statuses: []string{workflows.StatusStuck, statusProcessing, statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, time.Hour, h.offsets(workflows.ActivityFinalize)[1])
				h.env.AssertActivityCalled(t, workflows.ActivityFlagStuck, mock.Anything, mock.MatchedBy(func(in workflows.FlagInput) bool {
					return in.OperationID == opID && in.Reason != ""
				}))
				h.env.AssertActivityCalled(t, workflows.ActivityFlagStuck, mock.Anything, workflows.FlagInput{OperationID: opID})
			},
		},
	})
}

// Payments started before Revision 1 replay as they ran: a contradicted step fails the workflow.
func TestPaymentWorkflowRevision0StepFails(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivityCharge).Return(charged("ch_1"), nil)
	h.on(workflows.ActivityFinalize).Return(inconsistent())
	h.fallbacks()
	h.env.ExecuteWorkflow(workflows.WorkflowPayment, paymentInput(workflows.CapabilityIdempotent))
	require.True(t, h.env.IsWorkflowCompleted())
	require.ErrorContains(t, h.env.GetWorkflowError(), "cannot become succeeded")
	require.Zero(t, h.calls(workflows.ActivityFlagStuck))
}

// An unknown payment that keeps inquiring continues as a new run after parkedRoundsPerRun
// inquiries, so its history stays bounded; the new run goes straight back to waiting.
func TestPaymentWorkflowParkedContinuesAsNew(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
	h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound())
	h.fallbacks()
	in := current(workflows.CapabilityInquiry)
	in.LocalSteps = true
	next := continuedAsNew(h, workflows.WorkflowPayment, in)
	want := in
	want.Parked, want.InquiryWait = true, time.Hour
	require.Equal(t, want, next)
	// 3 sends with their inquiries, then 100 rounds while unknown.
	require.Equal(t, 1, h.calls(workflows.ActivityMarkUnknown))
	require.Equal(t, 3, h.calls(workflows.ActivityCharge))
	require.Equal(t, 4*3+100, h.calls(workflows.ActivityInquire))
}

// A continued run starts unknown: no reserve, no charge, the next inquiry after InquiryWait.
func TestPaymentWorkflowParkedRunResumes(t *testing.T) {
	runPaymentCases(t, []paymentCase{
		{
			name: "the next inquiry finds the charge",
			in: func() workflows.PaymentInput {
				in := current(workflows.CapabilityInquiry)
				in.Parked, in.InquiryWait = true, time.Hour
				return in
			}(),
			setup: func(h *harness) {
				h.expectWaitingAt(30 * time.Minute)
				h.on(workflows.ActivityInquire).Return(charged("ch_late"), nil)
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_late"},
			calls:    map[string]int{workflows.ActivityInquire: 1, workflows.ActivityFinalize: 1},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{time.Hour}, h.offsets(workflows.ActivityInquire))
			},
		},
		{
			name: "a settlement signal settles it",
			in: func() workflows.PaymentInput {
				in := current(workflows.CapabilityNone)
				in.Parked = true
				return in
			}(),
			setup: func(h *harness) {
				h.signalAt(time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
			},
			want: workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			// From Revision 10 it reads the payment's status while it waits (still unknown here).
			calls:    map[string]int{workflows.ActivityRelease: 1, workflows.ActivityReadPaymentStatus: 10},
			statuses: []string{statusFailed},
		},
	})
}

// An operator's retry that reaches the workflow while the stuck flag is being written (it was
// sent once the operator saw the flag) counts: from Revision 3 only the retries sent before the
// step failed are dropped.
func TestPaymentWorkflowRetryWhileFlagging(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivityCharge).Return(charged("ch_1"), nil)
	h.on(workflows.ActivityFinalize).Return(inconsistent()).Once()
	flagged := false
	h.on(workflows.ActivityFlagStuck).Run(func(args mock.Arguments) {
		if args.Get(1).(workflows.FlagInput).Reason != "" && !flagged {
			flagged = true
			h.env.SignalWorkflow(workflows.SignalRetry, nil)
		}
	}).Return(nil)
	in := current(workflows.CapabilityIdempotent)
	in.LocalSteps = false
	res := h.run(in)
	require.Equal(t, workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_1"}, res)
	require.Equal(t, 2, h.calls(workflows.ActivityFinalize), "run again on the operator's retry")
}
