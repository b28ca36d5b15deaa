package activities_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/workflows"
)

// attempts counts BeginChargeAttempt and BeginChargeSend like the payments.charge_attempts
// column does.
type attempts struct {
	activities.Store
	n int
}

func (a *attempts) BeginChargeAttempt(context.Context, uuid.UUID) (int, error) {
	a.n++
	return a.n, nil
}

func (a *attempts) BeginChargeSend(_ context.Context, _ uuid.UUID, send int) (bool, error) {
	if a.n >= send {
		return false, nil
	}
	a.n = send
	return true, nil
}

// bank records what reached it.
type bank struct {
	sends, inquiries int
	existing         *provider.Charge // what an inquiry finds
}

func (b *bank) Charge(_ context.Context, key string, _ provider.ChargeRequest) (provider.Charge, error) {
	b.sends++
	return provider.Charge{ID: "ch_" + key[:8], Status: "succeeded"}, nil
}

func (b *bank) Inquire(context.Context, string) (provider.Charge, error) {
	b.inquiries++
	if b.existing == nil {
		return provider.Charge{}, provider.ErrNotFound
	}
	return *b.existing, nil
}

// A charge run again after its worker died (attempt > 1) does only what the capability allows.
func TestChargeRepeatedAttempts(t *testing.T) {
	earlier := &provider.Charge{ID: "ch_earlier", Status: "succeeded"}
	for _, tc := range []struct {
		name           string
		capability     workflows.Capability
		send           int // the workflow's send number (0: histories before numbered sends)
		before         int // attempts already recorded
		existing       *provider.Charge
		sends, inquire int
		recorded       int // attempts recorded afterwards
		wantRef        string
		wantErrType    string
	}{
		{"none, first attempt sends", workflows.CapabilityNone, 0, 0, nil, 1, 0, 1, "ch_", ""},
		{"none, repeat never re-sends", workflows.CapabilityNone, 0, 1, nil, 0, 0, 2, "", workflows.ErrTypeAmbiguous},
		{"inquiry, first attempt sends without asking", workflows.CapabilityInquiry, 0, 0, nil, 1, 0, 1, "ch_", ""},
		{"inquiry, repeat finds the earlier charge", workflows.CapabilityInquiry, 0, 1, earlier, 0, 1, 2, "ch_earlier", ""},
		{"inquiry, repeat re-sends when the bank has none (before numbered sends)", workflows.CapabilityInquiry, 0, 1, nil, 1, 1, 2, "ch_", ""},
		{"idempotent re-sends with the same key, nothing recorded", workflows.CapabilityIdempotent, 0, 0, nil, 1, 0, 0, "ch_", ""},
		{"history from before local steps: sends, nothing recorded", "", 0, 0, nil, 1, 0, 0, "ch_", ""},
		{"none, send 1 goes out", workflows.CapabilityNone, 1, 0, nil, 1, 0, 1, "ch_", ""},
		{"none, send 1 repeated never re-sends", workflows.CapabilityNone, 1, 1, nil, 0, 0, 1, "", workflows.ErrTypeAmbiguous},
		{"inquiry, send 2 goes out after send 1", workflows.CapabilityInquiry, 2, 1, nil, 1, 0, 2, "ch_", ""},
		{"inquiry, send 2 repeated finds the earlier charge", workflows.CapabilityInquiry, 2, 2, earlier, 0, 1, 2, "ch_earlier", ""},
		// The earlier attempt may be booked late: only the workflow re-sends, after the window.
		{"inquiry, send 2 repeated does not re-send when the bank has none yet", workflows.CapabilityInquiry, 2, 2, nil, 0, 1, 2, "", workflows.ErrTypeAmbiguous},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, b := &attempts{n: tc.before}, &bank{existing: tc.existing}
			a := &activities.Activities{Store: st, Provider: b}
			res, err := a.Charge(context.Background(), workflows.ChargeInput{
				OperationID: payment.NewID(), AccountID: payment.NewID(), AmountMinor: 100, Currency: "TRY", Capability: tc.capability, Send: tc.send,
			})
			require.Equal(t, tc.sends, b.sends, "charges sent")
			require.Equal(t, tc.inquire, b.inquiries, "inquiries")
			require.Equal(t, tc.recorded, st.n, "attempts recorded")
			if tc.wantErrType != "" {
				var appErr *temporal.ApplicationError
				require.True(t, errors.As(err, &appErr), "%v", err)
				require.Equal(t, tc.wantErrType, appErr.Type())
				require.True(t, appErr.NonRetryable())
				return
			}
			require.NoError(t, err)
			require.True(t, res.Succeeded)
			require.Contains(t, res.ProviderReference, tc.wantRef)
		})
	}
}
