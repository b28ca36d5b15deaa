package workflows_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/kasa-pay/kasa/workflows"
)

// A bank that answers the inquiry with "no inquiry here" (501) has not said the charge did not
// move: the payment must be parked unknown, its hold kept, never failed (docs/reconciliation.md).
func TestInquiryUnsupportedAfterAnAmbiguousChargeParksNotFails(t *testing.T) {
	stepKinds(t, func(t *testing.T, local bool) {
		h := newHarness(t)
		in := paymentInput(workflows.CapabilityInquiry)
		in.LocalSteps = local
		h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
		h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{},
			temporal.NewNonRetryableApplicationError("501", workflows.ErrTypeInquiryNotAllowed, nil))
		h.expectWaitingAt(5 * time.Second)
		h.signalAt(10*time.Second, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_file"})
		res := h.run(in)
		require.Equal(t, workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_file"}, res)
		require.Zero(t, h.calls(workflows.ActivityRelease), "an ambiguous answer never releases the hold")
		require.Equal(t, 1, h.calls(workflows.ActivityMarkUnknown))
	})
}
