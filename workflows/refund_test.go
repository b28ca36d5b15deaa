package workflows_test

import (
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

var (
	refundID  = uuid.MustParse("0b6f3c1e-6a55-7a43-9a39-3f1f4f8d2a0f")
	paymentID = opID // the refunded payment
)

// refundFallbacks mocks the refund's database steps as succeeding and its provider calls as
// unexpected, behind whatever a case mocked.
func (h *harness) refundFallbacks() {
	h.on(workflows.ActivityHoldRefundForRun).Return(nil)
	h.on(workflows.ActivityPostRefund).Return(nil)
	h.on(workflows.ActivityReleaseRefund).Return(nil)
	h.on(workflows.ActivityMarkRefundUnknown).Return(nil)
	h.on(workflows.ActivityFlagRefundStuck).Return(nil)
	h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, errUnexpected(workflows.ActivitySendRefund))
	h.on(workflows.ActivityInquireRefund).Return(workflows.RefundSendResult{}, errUnexpected(workflows.ActivityInquireRefund))
}

func (h *harness) runRefund(in workflows.RefundInput) workflows.RefundWorkflowResult {
	h.t.Helper()
	h.refundFallbacks()
	return complete[workflows.RefundWorkflowResult](h, workflows.WorkflowRefund, in)
}

// refundInput is a refund as the API starts it now.
func refundInput(c workflows.Capability) workflows.RefundInput {
	return workflows.RefundInputFor(payment.Refund{
		ID: refundID, PaymentID: paymentID, MerchantID: merchantID, AccountID: accountID,
		IdempotencyKey: "rf-1", AmountMinor: 4_000, Currency: "EUR", Status: payment.StatusProcessing,
	}).WithPolicy(workflows.ChargePolicy{Capability: c, BookingWindow: 30 * time.Second})
}

func refunded(ref string) workflows.RefundSendResult {
	return workflows.RefundSendResult{ProviderReference: ref, Succeeded: true}
}

func wantSend(c workflows.Capability, send int) workflows.SendRefundInput {
	return workflows.SendRefundInput{
		OperationID: refundID, PaymentID: paymentID, AmountMinor: 4_000, Currency: "EUR", Capability: c, Send: send,
	}
}

// resent matches send number send (> 1): the refund's, saying when the earlier send ended and
// the window waited since.
func resent(c workflows.Capability, send int) any {
	return mock.MatchedBy(func(in workflows.SendRefundInput) bool {
		re := in.Resend
		in.Resend = workflows.Resend{}
		return in == wantSend(c, send) && re.Waited == 30*time.Second && !re.PreviousEnded.IsZero()
	})
}

var refundKind = opKind[workflows.RefundInput, workflows.RefundWorkflowResult]{
	run:      (*harness).runRefund,
	setLocal: func(in *workflows.RefundInput, local bool) { in.LocalSteps = local },
	inputs: func(in workflows.RefundInput) map[string]any {
		return map[string]any{
			workflows.ActivityHoldRefundForRun: refundID, workflows.ActivitySendRefund: wantSend(in.Capability, 1),
			workflows.ActivityInquireRefund: refundID, workflows.ActivityMarkRefundUnknown: refundID,
		}
	},
	outcome: func(r workflows.RefundWorkflowResult) (string, string, string) {
		return r.Status, r.ProviderReference, r.FailureCode
	},
	succeeded: func(ref string) (string, any) {
		return workflows.ActivityPostRefund, workflows.PostRefundInput{OperationID: refundID, ProviderReference: ref}
	},
	failed: func(code string) (string, any) {
		return workflows.ActivityReleaseRefund, workflows.ReleaseRefundInput{OperationID: refundID, FailureCode: code}
	},
}

func runRefundCases(t *testing.T, cases []refundCase) { t.Helper(); runCases(t, refundKind, cases) }

// The definite outcomes, for every capability: only a decline (or too little on the merchant's
// settlement account) fails a refund.
func TestRefundWorkflowDefiniteOutcomes(t *testing.T) {
	var cases []refundCase
	for _, c := range workflows.Capabilities {
		cases = append(cases,
			refundCase{
				name: "succeeded " + string(c),
				in:   refundInput(c),
				setup: func(h *harness) {
					h.on(workflows.ActivitySendRefund).Return(refunded("rf_ok"), nil)
				},
				want:     workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_ok"},
				calls:    map[string]int{workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 1, workflows.ActivityPostRefund: 1},
				statuses: []string{statusSucceeded},
			},
			refundCase{
				name: "declined " + string(c),
				in:   refundInput(c),
				setup: func(h *harness) {
					h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, declined())
				},
				want:     workflows.RefundWorkflowResult{Status: statusFailed, FailureCode: "declined"},
				calls:    map[string]int{workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 1, workflows.ActivityReleaseRefund: 1},
				statuses: []string{statusFailed},
			},
			refundCase{
				name: "a declined answer without an error " + string(c),
				in:   refundInput(c),
				setup: func(h *harness) {
					h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{ProviderReference: "rf_d"}, nil)
				},
				want:     workflows.RefundWorkflowResult{Status: statusFailed, FailureCode: "declined"},
				calls:    map[string]int{workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 1, workflows.ActivityReleaseRefund: 1},
				statuses: []string{statusFailed},
			},
			refundCase{
				name: "insufficient settlement funds " + string(c),
				in:   refundInput(c),
				setup: func(h *harness) {
					h.on(workflows.ActivityHoldRefundForRun).Return(insufficientFunds())
				},
				want:     workflows.RefundWorkflowResult{Status: statusFailed, FailureCode: "insufficient_funds"},
				calls:    map[string]int{workflows.ActivityHoldRefundForRun: 1, workflows.ActivityReleaseRefund: 1},
				statuses: []string{statusFailed},
			},
			refundCase{
				name: "a database outage during the hold is waited out " + string(c),
				in:   refundInput(c),
				setup: func(h *harness) {
					h.on(workflows.ActivityHoldRefundForRun).Return(temporal.NewApplicationError("connection refused", "")).Times(3)
					h.on(workflows.ActivitySendRefund).Return(refunded("rf_ok"), nil)
				},
				want:     workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_ok"},
				calls:    map[string]int{workflows.ActivityHoldRefundForRun: 4, workflows.ActivitySendRefund: 1, workflows.ActivityPostRefund: 1},
				statuses: []string{statusSucceeded},
			},
		)
	}
	runRefundCases(t, cases)
}

// An ambiguous send, by capability: idempotent re-sends within the budget, inquiry asks before
// any re-send, none never re-sends and parks the refund as unknown.
func TestRefundWorkflowAmbiguousSend(t *testing.T) {
	s := time.Second
	budget := func(d time.Duration) workflows.RefundInput {
		in := refundInput(workflows.CapabilityIdempotent)
		in.ChargeBudget = d
		return in
	}
	runRefundCases(t, []refundCase{
		{
			name: "idempotent: re-sent with the same key until it answers",
			in:   refundInput(workflows.CapabilityIdempotent),
			setup: func(h *harness) {
				h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, ambiguous()).Twice()
				h.on(workflows.ActivitySendRefund).Return(refunded("rf_3"), nil)
			},
			want:     workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_3"},
			calls:    map[string]int{workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 3, workflows.ActivityPostRefund: 1},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				// Retries of one send: the same input, the same idempotency key.
				h.env.AssertNumberOfCalls(t, workflows.ActivitySendRefund, 3)
				h.env.AssertNotCalled(t, workflows.ActivitySendRefund, mock.Anything,
					mock.MatchedBy(func(in workflows.SendRefundInput) bool { return in.Send == 2 }))
			},
		},
		{
			name: "idempotent: the budget ends, the refund is unknown",
			in:   budget(5 * s),
			setup: func(h *harness) {
				h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, ambiguous())
				h.signalAt(2*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "rf_file"})
			},
			want: workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_file"},
			calls: map[string]int{
				workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 5, workflows.ActivityMarkRefundUnknown: 1,
				workflows.ActivityPostRefund: 1,
			},
			statuses: []string{statusUnknown, statusSucceeded},
			check: func(t *testing.T, h *harness) {
				sends := h.offsets(workflows.ActivitySendRefund)
				require.Less(t, sends[len(sends)-1], 5*s, "a refund was sent after the budget")
			},
		},
		{
			name: "inquiry: the inquiry finds the refund, nothing is re-sent",
			in:   refundInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, ambiguous())
				h.on(workflows.ActivityInquireRefund).Return(workflows.RefundSendResult{}, notFound()).Twice()
				h.on(workflows.ActivityInquireRefund).Return(refunded("rf_late"), nil)
			},
			want: workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_late"},
			calls: map[string]int{
				workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 1, workflows.ActivityInquireRefund: 3,
				workflows.ActivityPostRefund: 1,
			},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{2 * s, 6 * s, 14 * s}, h.offsets(workflows.ActivityInquireRefund))
			},
		},
		{
			name: "inquiry: none found after the booking window, re-sent as send 2",
			in:   refundInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, ambiguous()).Once()
				h.on(workflows.ActivitySendRefund).Return(refunded("rf_2"), nil)
				h.on(workflows.ActivityInquireRefund).Return(workflows.RefundSendResult{}, notFound())
			},
			want: workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_2"},
			calls: map[string]int{
				workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 2, workflows.ActivityInquireRefund: 4,
				workflows.ActivityPostRefund: 1,
			},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{0, 30 * s}, h.offsets(workflows.ActivitySendRefund))
				h.env.AssertActivityCalled(t, workflows.ActivitySendRefund, mock.Anything, resent(workflows.CapabilityInquiry, 2))
			},
		},
		{
			name: "inquiry: at most three sends, then unknown",
			in:   refundInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, ambiguous())
				h.on(workflows.ActivityInquireRefund).Return(workflows.RefundSendResult{}, notFound()).Times(12 + 2)
				h.on(workflows.ActivityInquireRefund).Return(refunded("rf_found"), nil)
				h.expectWaitingAt(95 * s)
			},
			want: workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_found"},
			calls: map[string]int{
				workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 3, workflows.ActivityInquireRefund: 15,
				workflows.ActivityMarkRefundUnknown: 1, workflows.ActivityPostRefund: 1,
			},
			statuses: []string{statusUnknown, statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{0, 30 * s, 60 * s}, h.offsets(workflows.ActivitySendRefund))
				h.env.AssertActivityCalled(t, workflows.ActivitySendRefund, mock.Anything, resent(workflows.CapabilityInquiry, 3))
				// Parked when the third send's window ends; then inquired on a growing timer.
				require.Equal(t, []time.Duration{90 * s}, h.offsets(workflows.ActivityMarkRefundUnknown))
				require.Equal(t, []time.Duration{92 * s, 96 * s, 104 * s}, h.offsets(workflows.ActivityInquireRefund)[12:])
			},
		},
		{
			name: "none: one send, the refund is unknown, settled as refunded",
			in:   refundInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, ambiguous())
				h.expectWaitingAt(time.Hour)
				h.signalAt(2*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "rf_file"})
			},
			want: workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_file"},
			calls: map[string]int{
				workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 1, workflows.ActivityMarkRefundUnknown: 1,
				workflows.ActivityPostRefund: 1,
			},
			statuses: []string{statusUnknown, statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{2 * time.Hour}, h.offsets(workflows.ActivityPostRefund))
			},
		},
		{
			name: "none: one send, the refund is unknown, settled as not refunded",
			in:   refundInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, ambiguous())
				h.expectWaitingAt(time.Hour)
				h.signalAt(2*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged, Note: "absent from the file"})
			},
			want: workflows.RefundWorkflowResult{Status: statusFailed, FailureCode: "declined"},
			calls: map[string]int{
				workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 1, workflows.ActivityMarkRefundUnknown: 1,
				workflows.ActivityReleaseRefund: 1,
			},
			statuses: []string{statusUnknown, statusFailed},
		},
		{
			name: "none: a send the provider refused to answer is never retried",
			in:   refundInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{},
					temporal.NewApplicationError("503 from the bank", workflows.ErrTypeAmbiguous))
				h.signalAt(time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
			},
			want: workflows.RefundWorkflowResult{Status: statusFailed, FailureCode: "declined"},
			calls: map[string]int{
				workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 1, workflows.ActivityMarkRefundUnknown: 1,
				workflows.ActivityReleaseRefund: 1,
			},
			statuses: []string{statusUnknown, statusFailed},
		},
	})
}

// The checked `settle` update refuses early, malformed and repeated settlements of a refund; the
// accepted one answers with the refund's final status.
func TestRefundWorkflowSettleUpdate(t *testing.T) {
	for _, tc := range []struct {
		outcome string
		want    workflows.RefundWorkflowResult
		post    int
	}{
		{workflows.OutcomeCharged, workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_file"}, 1},
		{workflows.OutcomeNotCharged, workflows.RefundWorkflowResult{Status: statusFailed, FailureCode: "declined"}, 0},
	} {
		t.Run(tc.outcome, func(t *testing.T) {
			h := newHarness(t)
			h.on(workflows.ActivitySendRefund).After(time.Minute).Return(workflows.RefundSendResult{}, ambiguous())
			// The accepted settlement takes a minute to apply: the repeated one arrives meanwhile.
			h.on(workflows.ActivityPostRefund).After(time.Minute).Return(nil)
			h.on(workflows.ActivityReleaseRefund).After(time.Minute).Return(nil)
			answers := map[string]string{}
			h.updateAt(30*time.Second, "early", workflows.Settlement{Outcome: workflows.OutcomeCharged}, answers)
			h.updateAt(time.Hour, "malformed", workflows.Settlement{Outcome: "refunded"}, answers)
			h.updateAt(2*time.Hour, "accepted", workflows.Settlement{Outcome: tc.outcome, ProviderReference: "rf_file"}, answers)
			h.updateAt(2*time.Hour+time.Second, "again", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
			h.signalAt(30*time.Second, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "rf_early"})
			h.expectWaitingAt(90 * time.Minute)

			res := h.runRefund(refundInput(workflows.CapabilityNone))
			require.Equal(t, tc.want, res)
			require.Contains(t, answers["early"], "rejected: refund is processing, not unknown")
			require.Contains(t, answers["malformed"], "rejected: outcome must be")
			require.Equal(t, tc.want.Status, answers["accepted"])
			require.Contains(t, answers["again"], "rejected: refund is already being settled as "+tc.outcome)
			require.Equal(t, 1, h.calls(workflows.ActivitySendRefund), "never two sends with capability none")
			require.Equal(t, tc.post, h.calls(workflows.ActivityPostRefund))
			require.Equal(t, 1-tc.post, h.calls(workflows.ActivityReleaseRefund))
		})
	}
}

// A step the data contradicts flags the refund stuck until an operator's retry signal.
func TestRefundWorkflowStuckUntilRetry(t *testing.T) {
	runRefundCases(t, []refundCase{
		{
			name: "post contradicted, retried by the operator",
			in:   refundInput(workflows.CapabilityIdempotent),
			setup: func(h *harness) {
				h.on(workflows.ActivitySendRefund).Return(refunded("rf_1"), nil)
				h.on(workflows.ActivityPostRefund).Return(inconsistent()).Once()
				h.retryAt(time.Hour)
			},
			want: workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_1"},
			calls: map[string]int{
				workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 1, workflows.ActivityPostRefund: 2,
				workflows.ActivityFlagRefundStuck: 2,
			},
			statuses: []string{workflows.StatusStuck, statusProcessing, statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, time.Hour, h.offsets(workflows.ActivityPostRefund)[1])
				h.env.AssertActivityCalled(t, workflows.ActivityFlagRefundStuck, mock.Anything, mock.MatchedBy(func(in workflows.FlagInput) bool {
					return in.OperationID == refundID && in.Reason != ""
				}))
				h.env.AssertActivityCalled(t, workflows.ActivityFlagRefundStuck, mock.Anything, workflows.FlagInput{OperationID: refundID})
			},
		},
	})
}

// An unknown refund that keeps inquiring continues as a new refund run, which goes straight back
// to waiting.
func TestRefundWorkflowParkedContinuesAsNew(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivitySendRefund).Return(workflows.RefundSendResult{}, ambiguous())
	h.on(workflows.ActivityInquireRefund).Return(workflows.RefundSendResult{}, notFound())
	h.refundFallbacks()
	in := refundInput(workflows.CapabilityInquiry)
	next := continuedAsNew(h, workflows.WorkflowRefund, in)
	want := in
	want.Parked, want.InquiryWait = true, time.Hour
	require.Equal(t, want, next)
	require.Equal(t, 3, h.calls(workflows.ActivitySendRefund))
	require.Equal(t, 4*3+100, h.calls(workflows.ActivityInquireRefund))
	require.Zero(t, h.calls(workflows.ActivityCharge)+h.calls(workflows.ActivityInquire))
}

func TestRefundWorkflowParkedRunResumes(t *testing.T) {
	parked := func(c workflows.Capability) workflows.RefundInput {
		in := refundInput(c)
		in.Parked, in.InquiryWait = true, time.Hour
		return in
	}
	runRefundCases(t, []refundCase{
		{
			name: "the next inquiry finds the refund",
			in:   parked(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.expectWaitingAt(30 * time.Minute)
				h.on(workflows.ActivityInquireRefund).Return(refunded("rf_late"), nil)
			},
			want:     workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_late"},
			calls:    map[string]int{workflows.ActivityInquireRefund: 1, workflows.ActivityPostRefund: 1},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{time.Hour}, h.offsets(workflows.ActivityInquireRefund))
			},
		},
		{
			name: "a settlement signal settles it",
			in:   parked(workflows.CapabilityNone),
			setup: func(h *harness) {
				h.signalAt(time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
			},
			want:     workflows.RefundWorkflowResult{Status: statusFailed, FailureCode: "declined"},
			calls:    map[string]int{workflows.ActivityReleaseRefund: 1},
			statuses: []string{statusFailed},
		},
	})
}

func TestRefundInputFor(t *testing.T) {
	policy := workflows.ChargePolicy{
		Capability: workflows.CapabilityInquiry, Budget: time.Minute, Timeout: 20 * time.Second, BookingWindow: 10 * time.Second,
	}
	r := payment.Refund{
		ID: refundID, PaymentID: paymentID, MerchantID: merchantID, AccountID: accountID, IdempotencyKey: "rf-1",
		AmountMinor: 4_000, Currency: "EUR", Reason: "damaged", Status: payment.StatusProcessing,
	}
	require.Equal(t, workflows.RefundInput{
		OperationID: refundID, PaymentID: paymentID, MerchantID: merchantID, AmountMinor: 4_000, Currency: "EUR",
		Capability: workflows.CapabilityInquiry, ChargeBudget: time.Minute, ChargeTimeout: 20 * time.Second,
		BookingWindow: 10 * time.Second, LocalSteps: true, Revision: workflows.CurrentRevision,
	}, workflows.RefundInputFor(r).WithPolicy(policy))
	require.Empty(t, workflows.RefundInputFor(r).Capability, "the worker's policy governs, not the starter's")
	require.Equal(t, fmt.Sprintf("refund/%s/rf-1", merchantID), workflows.RefundWorkflowID(merchantID, "rf-1"))
}
