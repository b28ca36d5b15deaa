package payment

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A capture's amount is checked against the payment's currency as a refund's is: zeros count.
func TestCommandRequestAmountMinor(t *testing.T) {
	t.Parallel()
	pay := NewID()
	tests := []struct {
		body, currency string
		minor          int64
		err            error
	}{
		{`{"amount":"30.00"}`, "TRY", 3000, nil},
		{`{"amount":30}`, "TRY", 3000, nil},
		{`{"amount":"30.000"}`, "TRY", 0, ErrTooManyDecimals},
		{`{"amount":"5.0"}`, "JPY", 0, ErrTooManyDecimals},
		{`{"amount":"5.000"}`, "KWD", 5000, nil},
		{`{}`, "TRY", 0, nil},
	}
	for _, tt := range tests {
		r, err := ParseCommandRequest(CommandCapture, []byte(tt.body))
		require.NoError(t, err, tt.body)
		minor, err := r.AmountMinor(tt.currency)
		require.ErrorIs(t, err, tt.err, "%s in %s", tt.body, tt.currency)
		require.Equal(t, tt.minor, minor, tt.body)
	}
	a, err := ParseCommandRequest(CommandCapture, []byte(`{"amount":"30"}`))
	require.NoError(t, err)
	b, err := ParseCommandRequest(CommandCapture, []byte(`{"amount":"030.0"}`))
	require.NoError(t, err)
	require.Equal(t, a.Hash(pay), b.Hash(pay), "equivalent amounts hash equal")
}
