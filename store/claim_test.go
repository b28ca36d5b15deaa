package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// pendingDeliveries inserts n due deliveries of a merchant, one per payment, due from first on,
// every step.
func pendingDeliveries(t *testing.T, s *store.Store, merchantID uuid.UUID, n int, first time.Time, step time.Duration) {
	t.Helper()
	require.NoError(t, s.Exec(context.Background(), `INSERT INTO webhook_deliveries
		(id, merchant_id, aggregate_id, event_type, event_created_at, url, body, status, next_attempt_at)
		SELECT gen_random_uuid(), $1, gen_random_uuid(), 'payment.succeeded', now(), 'http://127.0.0.1:9/hook',
			convert_to('{}', 'UTF8'), 'pending', $2::timestamptz + g * $3::float8 * interval '1 second'
		FROM generate_series(0, $4 - 1) g`, merchantID, first, step.Seconds(), n))
}

// A claim reads a bounded part of the backlog, whatever its size: every step of its plan
// handles at most about the candidates it looks at, planned for the values (custom plan) and
// for any values (generic plan, which prepared statements end up with).
func TestClaimDeliveriesPlanReadsABoundedPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	// A backlog of 5,000 rows of 200 merchants, interleaved: each merchant has one due every
	// 200 ms. (A merchant's own due rows are read to count its leases.)
	start := time.Now().Add(-time.Hour)
	for i := range 200 {
		m := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
		pendingDeliveries(t, own, m.ID, 25, start.Add(time.Duration(i)*time.Millisecond), 200*time.Millisecond)
	}
	require.NoError(t, own.Exec(ctx, `ANALYZE webhook_deliveries`))

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	limit, perMerchant := 32, 4
	candidates := store.ClaimCandidates(limit)
	for _, generic := range []bool{false, true} {
		t.Run(fmt.Sprintf("generic=%v", generic), func(t *testing.T) {
			plan, raw := planOf(t, conn, generic, true, store.QueryClaimDeliveries,
				fmt.Sprintf(`%d, %d, 60, %d, '-infinity', '%s'`,
					limit, perMerchant, candidates, uuid.Nil))
			most, claimed := 0.0, 0.0
			plan.walk(func(n analyzedNode) {
				most = max(most, n.ActualRows)
				if n.RelationName == "webhook_deliveries" {
					require.NotEqual(t, "Seq Scan", n.NodeType, "deliveries are never read whole: plan %s", raw)
				}
				if n.NodeType == "ModifyTable" {
					claimed = n.ActualRows
				}
			})
			require.Equal(t, float64(limit), claimed, "plan %s", raw)
			require.LessOrEqual(t, most, float64(candidates), "a step handled more rows than the claim looks at: plan %s", raw)
		})
	}
}

// planOf prepares query and explains its execution with args (literals) under a custom or a
// generic plan, in a transaction it rolls back (EXPLAIN ANALYZE runs the statement); it returns
// the plan and its JSON, for messages.
func planOf(t *testing.T, conn *pgx.Conn, generic, analyze bool, query, args string) (analyzedNode, []byte) {
	t.Helper()
	ctx := context.Background()
	mode := map[bool]string{false: "force_custom_plan", true: "force_generic_plan"}[generic]
	options := map[bool]string{false: "FORMAT JSON", true: "ANALYZE, FORMAT JSON"}[analyze]
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
	require.NoError(t, err)
	_, _ = tx.Exec(ctx, "DEALLOCATE ALL") // prepared statements outlive the transaction
	_, err = tx.Exec(ctx, "PREPARE q AS "+query)
	require.NoError(t, err)
	var raw []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN ("+options+") EXECUTE q("+args+")", pgx.QueryExecModeSimpleProtocol).Scan(&raw))
	var out []struct {
		Plan analyzedNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &out))
	return out[0].Plan, raw
}

type analyzedNode struct {
	NodeType     string         `json:"Node Type"`
	RelationName string         `json:"Relation Name"`
	ActualRows   float64        `json:"Actual Rows"`
	Plans        []analyzedNode `json:"Plans"`
}

func (n analyzedNode) walk(fn func(analyzedNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// A merchant whose backlog fills the head of the queue beyond what one statement looks at, and
// which is at its limit, holds nobody else back: the claim goes on past its rows.
func TestClaimDeliveriesGoesPastAMerchantAtItsLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	busy := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
	pendingDeliveries(t, own, busy.ID, 5*store.ClaimCandidates(10), time.Now().Add(-time.Hour), time.Millisecond)
	var others []uuid.UUID
	for range 4 {
		m := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
		pendingDeliveries(t, own, m.ID, 5, time.Now().Add(-time.Minute), time.Millisecond)
		others = append(others, m.ID)
	}

	perMerchant := func(ds []store.ClaimedDelivery) map[uuid.UUID]int {
		n := map[uuid.UUID]int{}
		for _, d := range ds {
			n[d.MerchantID]++
		}
		return n
	}
	got, err := own.ClaimDeliveries(ctx, 10, 2, time.Minute)
	require.NoError(t, err)
	want := map[uuid.UUID]int{busy.ID: 2}
	for _, m := range others {
		want[m] = 2
	}
	require.Equal(t, want, perMerchant(got), "the busy merchant's two oldest, then two of each other merchant")

	got, err = own.ClaimDeliveries(ctx, 10, 2, time.Minute)
	require.NoError(t, err)
	require.Empty(t, got, "every merchant is at its limit")
	got, err = own.ClaimDeliveries(ctx, 10, 3, time.Minute)
	require.NoError(t, err)
	want = map[uuid.UUID]int{busy.ID: 1}
	for _, m := range others {
		want[m] = 1
	}
	require.Equal(t, want, perMerchant(got), "one more each under a higher limit")
}

// Claiming a delivery changes no indexed column (the lease, the attempt count): PostgreSQL
// updates it in place (a HOT update, no new index entries, a small WAL record), which the table
// leaves room for on each page.
func TestDeliveryClaimIsHOT(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
	pendingDeliveries(t, own, m.ID, 40, time.Now().Add(-time.Minute), time.Millisecond)
	updates := func() (all, hot int64) {
		require.NoError(t, own.QueryRow(ctx, `SELECT coalesce(n_tup_upd, 0), coalesce(n_tup_hot_upd, 0)
			FROM pg_stat_user_tables WHERE relname = 'webhook_deliveries'`, nil, &all, &hot))
		return all, hot
	}
	_, hotBefore := updates()
	got, err := own.ClaimDeliveries(ctx, 40, 40, time.Minute)
	require.NoError(t, err)
	require.Len(t, got, 40)
	// The statistics reach the shared counters when a backend goes idle, within a second.
	require.Eventually(t, func() bool {
		all, hot := updates()
		return all >= 40 && hot-hotBefore >= 40
	}, 10*time.Second, 100*time.Millisecond, "claims were not HOT updates")
}

// A claim is planned for the table as it is at each call: a plan cached while the table was
// empty (a sender starts before the traffic does) would read the whole backlog at every step of
// its walk once the table has filled.
func TestClaimDeliveriesPlannedForTheTableAsItIs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, err := store.Open(ctx, store.Options{URL: env.OwnDatabase(t), SecretKey: testkit.SecretKey, Migrate: true, MaxConns: 1})
	require.NoError(t, err)
	defer own.Close()
	require.NoError(t, own.Exec(ctx, `VACUUM ANALYZE webhook_deliveries`))
	for range 10 { // past the five custom plans after which a prepared statement may keep a generic one
		got, err := own.ClaimDeliveries(ctx, 32, 4, time.Minute)
		require.NoError(t, err)
		require.Empty(t, got)
	}
	start := time.Now().Add(-time.Hour)
	for i := range 200 {
		m := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
		pendingDeliveries(t, own, m.ID, 25, start.Add(time.Duration(i)*time.Millisecond), 200*time.Millisecond)
	}
	before := blocksRead(t, own)
	got, err := own.ClaimDeliveries(ctx, 32, 4, time.Minute)
	require.NoError(t, err)
	require.Len(t, got, 32)
	read := blocksRead(t, own) - before
	t.Logf("one claim of 32 from a backlog of 5,000 read %d blocks", read)
	require.Less(t, read, int64(20_000), "the claim read the backlog over and over")
}

// A merchant at its limit whose backlog fills the queue costs a claim a bounded walk, not a read
// of its whole backlog: a slow endpoint with thousands of due webhooks (one merchant's payday)
// must not make every claim of every sender slower with each webhook it has waiting.
func TestClaimPastAMerchantAtItsLimitIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, err := store.Open(ctx, store.Options{URL: env.OwnDatabase(t), SecretKey: testkit.SecretKey, Migrate: true, MaxConns: 1})
	require.NoError(t, err)
	defer own.Close()
	busy := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
	pendingDeliveries(t, own, busy.ID, 5000, time.Now().Add(-time.Hour), time.Millisecond)
	require.NoError(t, own.Exec(ctx, `VACUUM ANALYZE webhook_deliveries`))
	got, err := own.ClaimDeliveries(ctx, 32, 4, time.Minute)
	require.NoError(t, err)
	require.Len(t, got, 4, "the merchant's limit")

	before := blocksRead(t, own)
	got, err = own.ClaimDeliveries(ctx, 32, 4, time.Minute)
	require.NoError(t, err)
	require.Empty(t, got, "the only merchant is at its limit")
	read := blocksRead(t, own) - before
	t.Logf("a claim past 5,000 rows of a merchant at its limit read %d blocks", read)
	// One statement walking 128 rows and one reading 16 merchants' oldest rows, a few blocks a
	// row (1,008 here; 7,145 when it walked 8 statements of 64 rows); before the walk was
	// bounded, it read the merchant's whole backlog for every row it walked (1.2 M blocks).
	require.Less(t, read, int64(10_000), "the claim walked the merchant's whole backlog")
}

// blocksRead is how many blocks the database's backends have read so far (hits included).
func blocksRead(t *testing.T, s *store.Store) int64 {
	t.Helper()
	// The counters reach the shared statistics when a backend goes idle, within a second or two.
	time.Sleep(2500 * time.Millisecond)
	var n int64
	require.NoError(t, s.QueryRow(context.Background(), `SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()`, nil, &n))
	return n
}

// A hanging merchant at its limit whose due backlog is longer than a claim walks (one merchant's
// payday, its endpoint down) holds up no other merchant: docs/webhooks.md promises that one slow
// or hanging endpoint cannot hold up the others.
func TestHangingMerchantBacklogHoldsUpNobody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	newMerchant := func() testkit.Merchant {
		return testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
	}
	busy := newMerchant()
	pendingDeliveries(t, own, busy.ID, 1000, time.Now().Add(-time.Hour), time.Second)
	got, err := own.ClaimDeliveries(ctx, 32, 4, 40*time.Second)
	require.NoError(t, err)
	require.Len(t, got, 4, "the busy merchant's limit: these four now hang")

	other := newMerchant()
	pendingDeliveries(t, own, other.ID, 1, time.Now().Add(-time.Second), 0)
	got, err = own.ClaimDeliveries(ctx, 28, 4, 40*time.Second)
	require.NoError(t, err)
	require.Len(t, got, 1, "the other merchant's due delivery")
	require.Equal(t, other.ID, got[0].MerchantID)
}

// The claim merchant by merchant reads a bounded part of the backlog too: every step of its
// plan handles at most the rows it reads of the merchants it looks at, for the values and for
// any values.
func TestClaimMerchantDeliveriesPlanIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	start := time.Now().Add(-time.Hour)
	for i := range 200 {
		m := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
		pendingDeliveries(t, own, m.ID, 25, start.Add(time.Duration(i)*time.Millisecond), 200*time.Millisecond)
	}
	require.NoError(t, own.Exec(ctx, `ANALYZE webhook_deliveries`))

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	limit, perMerchant := 32, 4
	merchants := store.ClaimMerchants(limit, perMerchant)
	for _, generic := range []bool{false, true} {
		t.Run(fmt.Sprintf("generic=%v", generic), func(t *testing.T) {
			plan, raw := planOf(t, conn, generic, true, store.QueryClaimMerchantDeliveries,
				fmt.Sprintf(`%d, %d, 60, %d, '%s'`,
					limit, perMerchant, merchants, uuid.New()))
			most, claimed := 0.0, 0.0
			plan.walk(func(n analyzedNode) {
				most = max(most, n.ActualRows)
				if n.RelationName == "webhook_deliveries" {
					require.NotEqual(t, "Seq Scan", n.NodeType, "deliveries are never read whole: plan %s", raw)
				}
				if n.NodeType == "ModifyTable" {
					claimed = n.ActualRows
				}
			})
			require.Equal(t, float64(limit), claimed, "plan %s", raw)
			require.LessOrEqual(t, most, float64(merchants*2*perMerchant), "a step handled more rows than the claim reads: plan %s", raw)
		})
	}
}

// The claim merchant by merchant looks at each merchant with pending deliveries once, from
// after its start round to it again, and at no more merchants than it is told.
func TestClaimMerchantDeliveriesGoesRoundOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		start     func(ids []uuid.UUID) uuid.UUID
		merchants int
		want      int // merchants claimed from
	}{
		{"from the first", func([]uuid.UUID) uuid.UUID { return uuid.Nil }, 16, 5},
		{"from after the last", func([]uuid.UUID) uuid.UUID { return uuid.Max }, 16, 5},
		{"from the middle", func(ids []uuid.UUID) uuid.UUID { return ids[2] }, 16, 5},
		{"from the middle, three merchants", func(ids []uuid.UUID) uuid.UUID { return ids[2] }, 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			own, err := store.Open(ctx, store.Options{URL: env.OwnDatabase(t), SecretKey: testkit.SecretKey, Migrate: true})
			require.NoError(t, err)
			defer own.Close()
			var ids []uuid.UUID
			for range 5 {
				m := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
				pendingDeliveries(t, own, m.ID, 3, time.Now().Add(-time.Minute), time.Millisecond)
				ids = append(ids, m.ID)
			}
			slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
			got, err := own.ClaimMerchantDeliveries(ctx, 100, 2, time.Minute, tc.merchants, tc.start(ids))
			require.NoError(t, err)
			n := map[uuid.UUID]int{}
			for _, d := range got {
				n[d.MerchantID]++
			}
			require.Len(t, n, tc.want, "merchants claimed from")
			for m, k := range n {
				require.Equal(t, 2, k, "merchant %s: its limit", m)
			}
		})
	}
}

// A merchant whose oldest due rows wait for an earlier event of their payment (due later, after
// its backoff: its endpoint was down) still gets its turn behind another merchant's backlog: the
// claim looks past the rows that wait for an earlier event to the earlier events themselves.
func TestClaimReachesEventsBehindTheirPaymentsLaterOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	newMerchant := func() testkit.Merchant {
		return testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
	}
	busy := newMerchant()
	pendingDeliveries(t, own, busy.ID, 1000, time.Now().Add(-time.Hour), time.Second)
	got, err := own.ClaimDeliveries(ctx, 32, 4, 40*time.Second)
	require.NoError(t, err)
	require.Len(t, got, 4)

	other := newMerchant()
	// 9 payments: each's first event retried, due again 1 s ago; its second event, created while
	// the first was in backoff, due since 30 min and waiting for the first.
	require.NoError(t, own.Exec(ctx, `WITH a AS (SELECT gen_random_uuid() AS agg FROM generate_series(1, 9))
		INSERT INTO webhook_deliveries (id, merchant_id, aggregate_id, event_type, event_created_at, url, body, status, next_attempt_at)
		SELECT gen_random_uuid(), $1, agg, t, ec, 'http://127.0.0.1:9/hook', convert_to('{}', 'UTF8'), 'pending', na
		FROM a CROSS JOIN (VALUES ('payment.requires_capture', now() - interval '2 hours', now() - interval '1 second'),
		                          ('payment.captured', now() - interval '40 minutes', now() - interval '30 minutes')) v(t, ec, na)`, other.ID))
	for range 5 {
		got, err = own.ClaimDeliveries(ctx, 28, 4, 40*time.Second)
		require.NoError(t, err)
		if len(got) > 0 {
			break
		}
	}
	require.NotEmpty(t, got, "the other merchant's due first events are never claimed")
}

// A merchant whose webhook secret cannot be opened (a damaged row) holds up only its own
// deliveries: the claim still hands out the others, and names the damaged one in its error.
func TestClaimDeliveriesPastAnUnreadableSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	damaged := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
	pendingDeliveries(t, own, damaged.ID, 3, time.Now().Add(-time.Hour), time.Millisecond)
	require.NoError(t, own.Exec(ctx, `UPDATE merchants SET webhook_secret_enc = '\x00' WHERE id = $1`, damaged.ID))
	fine := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
	pendingDeliveries(t, own, fine.ID, 3, time.Now().Add(-time.Minute), time.Millisecond)

	got, err := own.ClaimDeliveries(ctx, 10, 5, time.Minute)
	require.ErrorContains(t, err, damaged.ID.String())
	require.Len(t, got, 3, "the other merchant's deliveries are handed out")
	for _, d := range got {
		require.Equal(t, fine.ID, d.MerchantID)
		require.Equal(t, "whsec_test", d.Secret)
	}
}

// A merchant at its limit stays at it when the claim goes on merchant by merchant, even when its
// oldest due rows are not its leased ones: events that waited for an earlier event of their
// payment are due since they were recorded, older than the rows claimed while they waited, and
// its leases must still be counted.
func TestClaimMerchantByMerchantCountsEveryLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	const perMerchant = 2
	newMerchant := func() testkit.Merchant {
		return testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
	}
	// A hanging merchant's backlog fills the head of the queue: a claim goes on merchant by
	// merchant behind it.
	busy := newMerchant()
	pendingDeliveries(t, own, busy.ID, 1000, time.Now().Add(-time.Hour), time.Second)
	slow := newMerchant()
	// Two payments' only events, due a second ago; and 2*perMerchant payments whose first event
	// is backing off (due in an hour) and whose second, due since 30 minutes, waits for it.
	pendingDeliveries(t, own, slow.ID, perMerchant, time.Now().Add(-time.Second), time.Millisecond)
	require.NoError(t, own.Exec(ctx, `WITH a AS (SELECT gen_random_uuid() AS agg FROM generate_series(1, $2::int))
		INSERT INTO webhook_deliveries (id, merchant_id, aggregate_id, event_type, event_created_at, url, body, status, next_attempt_at)
		SELECT gen_random_uuid(), $1, agg, t, ec, 'http://127.0.0.1:9/hook', convert_to('{}', 'UTF8'), 'pending', na
		FROM a CROSS JOIN (VALUES ('payment.unknown', now() - interval '2 hours', now() + interval '1 hour'),
		                          ('payment.succeeded', now() - interval '40 minutes', now() - interval '30 minutes')) v(t, ec, na)`,
		slow.ID, 2*perMerchant))

	inFlight := map[uuid.UUID]int{}
	claim := func() {
		got, err := own.ClaimDeliveries(ctx, 10, perMerchant, time.Minute)
		require.NoError(t, err)
		for _, d := range got {
			inFlight[d.MerchantID]++
		}
	}
	claim()
	require.Equal(t, map[uuid.UUID]int{busy.ID: perMerchant, slow.ID: perMerchant}, inFlight, "both merchants at their limit")

	// The first events are delivered while the slow merchant's two sends are still in flight:
	// their second events come due, older than the rows in flight.
	require.NoError(t, own.Exec(ctx, `UPDATE webhook_deliveries SET status = 'delivered', delivered_at = now()
		WHERE merchant_id = $1 AND event_type = 'payment.unknown'`, slow.ID))
	claim()
	require.Equal(t, map[uuid.UUID]int{busy.ID: perMerchant, slow.ID: perMerchant}, inFlight,
		"a merchant at its limit gets no more deliveries in flight")
}
