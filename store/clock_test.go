package store_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// skewedStore is a store on a database of its own whose clock, as every query it runs reads it
// (now()), is skew ahead of this host's: its sessions find a now() shifted by skew before
// pg_catalog's. Column defaults keep the real clock.
func skewedStore(t *testing.T, skew time.Duration) *store.Store {
	t.Helper()
	ctx := context.Background()
	own, dbURL := ownStoreAt(t)
	require.NoError(t, own.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA skewed_clock;
		CREATE FUNCTION skewed_clock.now() RETURNS timestamptz LANGUAGE sql STABLE
		AS $$ SELECT pg_catalog.now() + interval '%d milliseconds' $$`, skew.Milliseconds())))
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", "skewed_clock,public,pg_catalog")
	u.RawQuery = q.Encode()
	s, err := store.Open(ctx, store.Options{URL: u.String(), SecretKey: testkit.SecretKey})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	dbNow, err := s.Now(ctx)
	require.NoError(t, err)
	require.InDelta(t, skew.Seconds(), time.Until(dbNow).Seconds(), 5, "the database's clock as the store reads it")
	return s
}

// An import waits out the longest booking window a worker reported within
// reconcile.WorkerWindowMemory, by the database's clock, which stamped the reports: the clock of
// the host that imports, minutes ahead of it, would forget a worker's longer window early, and
// release an unknown payment the bank may still book.
func TestLongestBookingWindowByTheDatabasesClock(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		skew time.Duration // the database's clock ahead of this host's
		ago  time.Duration // when the worker last reported, by the database's clock
		want time.Duration
	}{
		{"this host five minutes ahead, reported within the memory", -5 * time.Minute, reconcile.WorkerWindowMemory - time.Minute, 77 * time.Hour},
		{"this host five minutes behind, reported before the memory", 5 * time.Minute, reconcile.WorkerWindowMemory + time.Minute, 0},
		{"same clocks, reported within the memory", 0, reconcile.WorkerWindowMemory - time.Minute, 77 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := skewedStore(t, tc.skew)
			require.NoError(t, s.Exec(ctx, `INSERT INTO worker_policies (task_queue, capability, booking_window_ms, charge_budget_ms, charge_timeout_ms, last_seen)
				VALUES ('q', 'none', $1, 60000, 30000, now() - $2 * interval '1 millisecond')`,
				(77*time.Hour).Milliseconds(), tc.ago.Milliseconds()))
			w, err := s.LongestBookingWindow(ctx, reconcile.WorkerWindowMemory)
			require.NoError(t, err)
			require.Equal(t, tc.want, w)
		})
	}
}

// A webhook secret revoked at once ended at the database's now, the clock that times the
// overlaps of the others: the answer's previous_secret_expires_at is that, not this host's time.
func TestRevokedWebhookSecretEndsByTheDatabasesClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := skewedStore(t, -5*time.Minute)
	m := testkit.NewMerchant(t, s, testkit.MerchantOptions{WebhookURL: "https://m.example/hooks"})
	for _, overlap := range []time.Duration{time.Hour, 0} {
		until, err := s.RotateWebhookSecret(ctx, m.ID, "whsec_"+overlap.String(), overlap)
		require.NoError(t, err)
		dbNow, err := s.Now(ctx)
		require.NoError(t, err)
		require.WithinDuration(t, dbNow.Add(overlap), until, 5*time.Second, "overlap %s", overlap)
	}
}
