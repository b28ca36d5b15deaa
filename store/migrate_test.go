package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/schema"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// beforeUnknownAt makes a migrated database of its own look like one of the release before
// migration 34 (payments.unknown_at and what follows it missing), with one payment in it.
func beforeUnknownAt(t *testing.T) (url string, paymentID string) {
	t.Helper()
	ctx := context.Background()
	url = env.OwnDatabase(t)
	own, err := store.Open(ctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true})
	require.NoError(t, err)
	defer own.Close()
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 1000})
	id, err := testkit.Settle(ctx, own, m, false)
	require.NoError(t, err)
	require.NoError(t, own.Exec(ctx, `ALTER TABLE payments DROP COLUMN unknown_at`))
	require.NoError(t, own.Exec(ctx, `ALTER TABLE refunds DROP COLUMN unknown_at`))
	require.NoError(t, own.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id >= 34`))
	return url, id.String()
}

// holdPayments opens a transaction that has read payments (a reporting query, the ledger
// check), holding its ACCESS SHARE lock until the returned function ends it.
func holdPayments(t *testing.T, url string) (end func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM payments`)
	require.NoError(t, err)
	var once sync.Once
	end = func() {
		once.Do(func() {
			_ = tx.Rollback(ctx)
			_ = conn.Close(ctx)
		})
	}
	t.Cleanup(end)
	return end
}

// probe runs sql over and over on a connection of its own until stop is closed, and reports the
// longest any one run took: how long a payment stalled.
func probe(t *testing.T, url, sql string, args []any, stop <-chan struct{}) <-chan time.Duration {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	out := make(chan time.Duration, 1)
	go func() {
		defer conn.Close(ctx)
		var longest time.Duration
		for {
			select {
			case <-stop:
				out <- longest
				return
			default:
			}
			start := time.Now()
			qctx, cancel := context.WithTimeout(ctx, time.Minute)
			_, err := conn.Exec(qctx, sql, args...)
			cancel()
			longest = max(longest, time.Since(start))
			if err != nil {
				t.Errorf("%s: %v", sql, err)
				out <- longest
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return out
}

// kasa migrate runs while the previous release serves payments. A migration that alters payments
// while a long transaction reads it (the worker's ledger check, a report) queues every read and
// write of payments behind the ACCESS EXCLUSIVE lock it waits for: it must give up its place
// quickly and try again later, not hold payments up for its whole wait, and it completes once the
// reader ends.
func TestMigrationBehindALongReaderKeepsPaymentsFlowing(t *testing.T) {
	if testing.Short() {
		t.Skip("holds a reader for longer than a migration's lock wait")
	}
	t.Parallel()
	ctx := context.Background()
	url, id := beforeUnknownAt(t)
	endReader := holdPayments(t, url)

	stop := make(chan struct{})
	selects := probe(t, url, `SELECT status FROM payments WHERE id = $1`, []any{id}, stop)
	inserts := probe(t, url, `INSERT INTO payments (id, merchant_id, idempotency_key, account_id, amount_minor,
		currency, invoice_id, payment_type, status, failure_code)
		SELECT gen_random_uuid(), merchant_id, idempotency_key, account_id, amount_minor, currency,
		       gen_random_uuid()::text, payment_type, 'failed', 'declined'
		FROM payments WHERE id = $1`, []any{id}, stop)

	migrated := make(chan error, 1)
	go func() {
		mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		st, err := store.Open(mctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true, MaxConns: 2})
		if err == nil {
			st.Close()
		}
		migrated <- err
	}()
	// Longer than the 10 s that migrations waited for their lock at most.
	time.Sleep(14 * time.Second)
	var early error
	select {
	case early = <-migrated:
		if early == nil {
			t.Error("the migration completed while the reader held payments")
		}
	default:
	}
	endReader()
	err := early
	if early == nil {
		select {
		case err = <-migrated:
		case <-time.After(90 * time.Second):
			t.Error("the migration did not complete after the reader ended")
		}
	}
	close(stop)
	longestSelect, longestInsert := <-selects, <-inserts
	t.Logf("longest stall: select %s, insert %s", longestSelect, longestInsert)
	// A try waits 1 s for its lock (2 s for a migration of two tables); loaded machines add some.
	const bound = 4 * time.Second
	assert.Less(t, longestSelect, bound, "a SELECT on payments stalled behind the migration")
	assert.Less(t, longestInsert, bound, "an INSERT into payments stalled behind the migration")
	require.NoError(t, early, "the migration gave up while the reader held payments")
	require.NoError(t, err, "the migration completes once the reader ended")

	check, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer check.Close(ctx)
	var version int64
	var column bool
	require.NoError(t, check.QueryRow(ctx, `SELECT max(version_id),
		EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 'payments' AND column_name = 'unknown_at')
		FROM goose_db_version`).Scan(&version, &column))
	require.True(t, column, "migration 34 applied")
	latest, err := schema.Latest()
	require.NoError(t, err)
	require.Equal(t, latest, version, "every migration applied")
}

// A reader that never ends: kasa migrate gives up once its lock wait has passed, with an error
// that says so, and leaves nothing of the migration applied, in a transaction (34) or outside
// one (29, whose constraint is added in one statement); run again after the reader, it completes.
func TestMigrationGivesUpOnAReaderThatStays(t *testing.T) {
	if testing.Short() {
		t.Skip("tries a migration for seconds")
	}
	t.Parallel()
	for _, tc := range []struct {
		name    string
		version int64
		table   string
		undo    []string // back to the release before version
		applied string   // true once version's change is there
	}{
		{
			name: "in a transaction", version: 34, table: "payments",
			undo: []string{`ALTER TABLE payments DROP COLUMN unknown_at`, `ALTER TABLE refunds DROP COLUMN unknown_at`},
			applied: `SELECT EXISTS (SELECT 1 FROM information_schema.columns
				WHERE table_name IN ('payments', 'refunds') AND column_name = 'unknown_at')`,
		},
		{
			name: "outside a transaction", version: 29, table: "accounts",
			undo:    []string{`ALTER TABLE accounts DROP CONSTRAINT accounts_currency_bound`},
			applied: `SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'accounts_currency_bound')`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			own, url := ownStoreAt(t)
			for _, sql := range tc.undo {
				require.NoError(t, own.Exec(ctx, sql))
			}
			require.NoError(t, own.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id >= $1`, tc.version))
			conn, err := pgx.Connect(ctx, url)
			require.NoError(t, err)
			defer conn.Close(ctx)
			reader, err := conn.Begin(ctx)
			require.NoError(t, err)
			_, err = reader.Exec(ctx, `SELECT count(*) FROM `+tc.table)
			require.NoError(t, err)

			const wait = 3 * time.Second
			start := time.Now()
			_, err = store.Open(ctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true, MigrateLockWait: wait})
			took := time.Since(start)
			require.ErrorIs(t, err, schema.ErrLockWait)
			require.ErrorContains(t, err, fmt.Sprintf("migration %05d_", tc.version))
			require.ErrorContains(t, err, "lock timeout")
			require.GreaterOrEqual(t, took, wait-schema.TryLockWait, "tried until its lock wait had nearly passed")
			require.Less(t, took, wait+10*time.Second, "gave up once its lock wait had passed")
			var applied bool
			var version int64
			require.NoError(t, conn.QueryRow(ctx, tc.applied).Scan(&applied))
			require.NoError(t, conn.QueryRow(ctx, `SELECT max(version_id) FROM goose_db_version`).Scan(&version))
			require.False(t, applied, "nothing of the migration applied")
			require.Equal(t, tc.version-1, version, "the migration not recorded as applied")

			require.NoError(t, reader.Rollback(ctx))
			again, err := store.Open(ctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true, MigrateLockWait: wait})
			require.NoError(t, err, "run again, it completes")
			again.Close()
			require.NoError(t, conn.QueryRow(ctx, tc.applied).Scan(&applied))
			require.True(t, applied)
		})
	}
}
