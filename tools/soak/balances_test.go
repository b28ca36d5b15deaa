package soak

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The watch reads accounts while the run goes on: a reading with nothing available is a
// violation even if a later one is fine, and a failed reading is skipped.
func TestBalanceWatchFlagsANegativeReading(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 1:
			_, _ = w.Write([]byte(`{"balance":"10.00","reserved":"2.00","currency":"TRY"}`))
		case 2:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 3:
			_, _ = w.Write([]byte(`{"balance":"1.00","reserved":"2.00","currency":"TRY"}`))
		default:
			_, _ = w.Write([]byte(`{"balance":"5.00","reserved":"0.00","currency":"TRY"}`))
		}
	}))
	t.Cleanup(srv.Close)
	a := &api{base: srv.URL, http: srv.Client()}
	ctx, stop := context.WithCancel(context.Background())
	w := watchBalances(ctx, a, []*merchant{{APIKey: "sk", Accounts: []account{{ID: "acct-1"}}}}, 10*time.Millisecond)
	require.Eventually(t, func() bool { return n.Load() >= 5 }, 5*time.Second, 5*time.Millisecond)
	stop()
	c := w.result()
	require.False(t, c.OK)
	require.Equal(t, 1, c.Violations, "%v", c.Examples)
	require.Contains(t, c.Examples[0], "balance 1.00, reserved 2.00")
	require.GreaterOrEqual(t, c.Checked, 3, "the failed reading is not counted")
}

func TestSignedAmount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{{"12.34", 1234, false}, {"0.00", 0, false}, {"-0.50", -50, false}, {"1.2.3", 0, true}, {"", 0, true}} {
		got, err := signedAmount(tc.in, "TRY")
		require.Equal(t, tc.bad, err != nil, tc.in)
		if !tc.bad {
			require.Equal(t, tc.want, got, tc.in)
		}
	}
}
