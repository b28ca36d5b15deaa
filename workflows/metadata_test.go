package workflows

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/temporal"

	"github.com/kasa-pay/kasa/payment"
)

// The list's PaymentSummary holds the summary whole when it fits a Keyword column (255
// characters), and cut on a character boundary, marked, when it does not.
func TestListedSummaryFitsItsColumn(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		whole    bool
	}{
		{"short", "payment 12.34 TRY · invoice 1 · merchant m", true},
		{"255 characters", strings.Repeat("ş", 255), true},
		{"256 characters", strings.Repeat("ş", 256), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := listed(tc.in)
			require.True(t, utf8.ValidString(got))
			require.LessOrEqual(t, utf8.RuneCountInString(got), 255)
			if tc.whole {
				require.Equal(t, tc.in, got)
			} else {
				require.True(t, strings.HasSuffix(got, "…"))
				require.True(t, strings.HasPrefix(tc.in, strings.TrimSuffix(got, "…")))
			}
		})
	}
}

// A command the workflow refused says why in the workflow's words only: neither the SDK's
// rendering of the error nor Temporal's own text reaches the merchant's problem detail.
func TestCommandRefusalSaysOnlyWhy(t *testing.T) {
	for _, tc := range []struct {
		err    error
		update string
		want   error
		detail string
	}{
		{temporal.NewApplicationError("the payment is canceled", ErrTypeNotCapturable), UpdateCapture, payment.ErrNotCapturable,
			"the payment is not waiting for a capture: the payment is canceled"},
		{serviceerror.NewNotFound("workflow execution already completed"), UpdateCapture, payment.ErrNotCapturable,
			"the payment is not waiting for a capture"},
		{serviceerror.NewNotFound("workflow execution already completed"), UpdateCancel, payment.ErrNotCancelable,
			payment.ErrNotCancelable.Error()},
	} {
		got := commandRefusal(tc.err, tc.update)
		require.ErrorIs(t, got, tc.want)
		require.Equal(t, tc.detail, got.Error())
	}
}
