package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// seedPayment writes a payment of merchant m created at created with status, with its
// idempotency record, as Begin and the workflow's steps would have left it.
func seedPayment(t *testing.T, s *store.Store, m testkit.Merchant, created time.Time, status payment.Status) uuid.UUID {
	t.Helper()
	id := payment.NewID()
	var failure *string
	if status == payment.StatusFailed {
		code := "declined"
		failure = &code
	}
	require.NoError(t, s.Exec(context.Background(), `WITH r AS (
		INSERT INTO idempotency_records (merchant_id, idempotency_key, request_hash, status, operation_id, created_at)
		VALUES ($2, $1::uuid::text, repeat('0', 64),
			CASE WHEN $4 IN ('processing', 'unknown') THEN $4 ELSE 'completed' END, $1::uuid, $6)
		RETURNING merchant_id, idempotency_key, operation_id, created_at)
		INSERT INTO payments (id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id,
			payment_type, status, failure_code, created_at, updated_at)
		SELECT operation_id, merchant_id, idempotency_key, $3, 100, 'TRY', idempotency_key, 'purchase', $4, $5, created_at, created_at FROM r`,
		id, m.ID, m.Account, status, failure, created))
	return id
}

// ownStore opens a database of the test's own.
func ownStore(t *testing.T) *store.Store {
	t.Helper()
	own, _ := ownStoreAt(t)
	return own
}

// ownStoreAt is ownStore and its database's URL, for tests that also connect by hand.
func ownStoreAt(t *testing.T) (*store.Store, string) {
	t.Helper()
	url := env.OwnDatabase(t)
	own, err := store.Open(context.Background(), store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true})
	require.NoError(t, err)
	t.Cleanup(own.Close)
	return own, url
}

// walk reads every page of in (in.StartingAfter is moved along) and the has_more of each.
func walk(t *testing.T, s *store.Store, in store.ListPaymentsInput) (ids []uuid.UUID, more []bool) {
	t.Helper()
	for {
		page, hasMore, err := s.ListPayments(context.Background(), in)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page), in.Limit)
		for _, p := range page {
			require.Equal(t, in.MerchantID, p.MerchantID, "only the merchant's own payments")
			ids = append(ids, p.ID)
		}
		more = append(more, hasMore)
		if !hasMore {
			return ids, more
		}
		require.NotEmpty(t, page, "has_more with an empty page")
		last := page[len(page)-1].ID
		in.StartingAfter = &last
	}
}

func TestListPaymentsPagesFiltersAndBounds(t *testing.T) {
	t.Parallel()
	db := ownStore(t) // seeded payments have no postings: the shared database's verify would fail
	ctx := context.Background()
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{})
	other := testkit.NewMerchant(t, db, testkit.MerchantOptions{})
	base := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	statuses := []payment.Status{payment.StatusSucceeded, payment.StatusFailed, payment.StatusProcessing, payment.StatusUnknown}

	// Ten payments a minute apart, newest last, the 5th and 6th at the same instant (the id
	// orders them); the other merchant's payments sit between them in time.
	type seeded struct {
		id      uuid.UUID
		created time.Time
		status  payment.Status
	}
	var mine []seeded
	for i := range 10 {
		created := base.Add(time.Duration(i) * time.Minute)
		if i == 5 {
			created = mine[4].created
		}
		st := statuses[i%len(statuses)]
		mine = append(mine, seeded{seedPayment(t, db, m, created, st), created, st})
		seedPayment(t, db, other, created.Add(30*time.Second), st)
	}
	newestFirst := func(keep func(seeded) bool) []uuid.UUID {
		var out []uuid.UUID
		for i := len(mine) - 1; i >= 0; i-- {
			if keep(mine[i]) {
				out = append(out, mine[i].id)
			}
		}
		return out
	}
	all := newestFirst(func(seeded) bool { return true })
	require.Equal(t, mine[5].id, all[4], "equal created_at: the later id first")

	t.Run("pages", func(t *testing.T) {
		for _, tc := range []struct {
			limit int
			more  []bool
		}{
			{3, []bool{true, true, true, false}},
			{5, []bool{true, false}}, // exactly two full pages: the second says no more
			{9, []bool{true, false}},
			{10, []bool{false}},
			{100, []bool{false}},
		} {
			ids, more := walk(t, db, store.ListPaymentsInput{MerchantID: m.ID, Limit: tc.limit})
			require.Equal(t, all, ids, "limit %d", tc.limit)
			require.Equal(t, tc.more, more, "limit %d", tc.limit)
		}
	})

	t.Run("status", func(t *testing.T) {
		for _, st := range statuses {
			ids, _ := walk(t, db, store.ListPaymentsInput{MerchantID: m.ID, Limit: 2, Status: st})
			require.Equal(t, newestFirst(func(s seeded) bool { return s.status == st }), ids, st)
		}
	})

	t.Run("created bounds", func(t *testing.T) {
		gte, lt := mine[2].created, mine[7].created
		ids, _ := walk(t, db, store.ListPaymentsInput{MerchantID: m.ID, Limit: 2, CreatedGTE: &gte, CreatedLT: &lt})
		require.Equal(t, newestFirst(func(s seeded) bool { return !s.created.Before(gte) && s.created.Before(lt) }), ids,
			"created_gte includes its instant, created_lt excludes its own")
		require.Equal(t, mine[6].id, ids[0])
		require.Equal(t, mine[2].id, ids[len(ids)-1])

		// Bounds finer than the database's microseconds round up: a payment at t is before
		// t+500ns and not at or after it.
		justAfter := mine[3].created.Add(500 * time.Nanosecond)
		ids, _ = walk(t, db, store.ListPaymentsInput{MerchantID: m.ID, Limit: 20, CreatedLT: &justAfter})
		require.Equal(t, []uuid.UUID{mine[3].id, mine[2].id, mine[1].id, mine[0].id}, ids)
		ids, _ = walk(t, db, store.ListPaymentsInput{MerchantID: m.ID, Limit: 20, CreatedGTE: &justAfter})
		require.Equal(t, all[:6], ids)

		st := payment.StatusSucceeded
		ids, _ = walk(t, db, store.ListPaymentsInput{MerchantID: m.ID, Limit: 1, Status: st, CreatedGTE: &gte, CreatedLT: &lt})
		require.Equal(t, newestFirst(func(s seeded) bool {
			return s.status == st && !s.created.Before(gte) && s.created.Before(lt)
		}), ids)
	})

	t.Run("cursor", func(t *testing.T) {
		// A cursor is a position: it need not match the filters.
		after := mine[6].id
		st := payment.StatusSucceeded
		page, more, err := db.ListPayments(ctx, store.ListPaymentsInput{MerchantID: m.ID, Limit: 10, StartingAfter: &after, Status: st})
		require.NoError(t, err)
		require.False(t, more)
		var ids []uuid.UUID
		for _, p := range page {
			ids = append(ids, p.ID)
		}
		require.Equal(t, newestFirst(func(s seeded) bool { return s.status == st && s.created.Before(mine[6].created) }), ids)

		// The oldest payment's page is empty and the end.
		oldest := mine[0].id
		page, more, err = db.ListPayments(ctx, store.ListPaymentsInput{MerchantID: m.ID, Limit: 10, StartingAfter: &oldest})
		require.NoError(t, err)
		require.Empty(t, page)
		require.False(t, more)

		// A cursor with created_lt: the tighter of the two bounds holds.
		lt := mine[3].created
		after = mine[8].id
		ids, _ = walk(t, db, store.ListPaymentsInput{MerchantID: m.ID, Limit: 10, StartingAfter: &after, CreatedLT: &lt})
		require.Equal(t, []uuid.UUID{mine[2].id, mine[1].id, mine[0].id}, ids)
		after = mine[1].id
		lt = mine[8].created
		ids, _ = walk(t, db, store.ListPaymentsInput{MerchantID: m.ID, Limit: 10, StartingAfter: &after, CreatedLT: &lt})
		require.Equal(t, []uuid.UUID{mine[0].id}, ids)
	})

	t.Run("unknown cursor", func(t *testing.T) {
		theirs := seedPayment(t, db, other, base, payment.StatusSucceeded)
		for _, id := range []uuid.UUID{theirs, payment.NewID()} {
			_, _, err := db.ListPayments(ctx, store.ListPaymentsInput{MerchantID: m.ID, Limit: 10, StartingAfter: &id})
			require.ErrorIs(t, err, store.ErrUnknownCursor, "another merchant's payment or none at all")
		}
	})

	t.Run("nothing listed", func(t *testing.T) {
		empty := testkit.NewMerchant(t, db, testkit.MerchantOptions{})
		page, more, err := db.ListPayments(ctx, store.ListPaymentsInput{MerchantID: empty.ID, Limit: 10})
		require.NoError(t, err)
		require.NotNil(t, page, "an empty page is an empty list, not null")
		require.Empty(t, page)
		require.False(t, more)
	})

	t.Run("the listed payment is the payment", func(t *testing.T) {
		page, _, err := db.ListPayments(ctx, store.ListPaymentsInput{MerchantID: m.ID, Limit: 1})
		require.NoError(t, err)
		p, err := db.Payment(ctx, page[0].ID)
		require.NoError(t, err)
		require.Equal(t, p, page[0])
	})

	t.Run("bad limit", func(t *testing.T) {
		_, _, err := db.ListPayments(ctx, store.ListPaymentsInput{MerchantID: m.ID})
		require.Error(t, err)
	})
}

// Payments inserted while a client pages through the list never make it skip or repeat one:
// every payment that existed before the walk is listed exactly once.
func TestListPaymentsStableUnderConcurrentInserts(t *testing.T) {
	t.Parallel()
	db := ownStore(t) // seeded payments have no postings: the shared database's verify would fail
	ctx := context.Background()
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Deposit: 1_000_000})
	before := map[uuid.UUID]bool{}
	start := time.Now().Add(-time.Hour)
	for i := range 150 {
		// Some share an instant, as payments of one busy millisecond do.
		before[seedPayment(t, db, m, start.Add(time.Duration(i/3)*time.Second), payment.StatusSucceeded)] = true
	}

	stop := make(chan struct{})
	var inserted atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("concurrent-%d-%d", w, i)
				req := payment.Request{InvoiceID: key, AmountMinor: 1, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
				if _, _, _, err := db.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute}); err != nil {
					t.Error(err)
					return
				}
				inserted.Add(1)
			}
		}()
	}

	seen := map[uuid.UUID]int{}
	in := store.ListPaymentsInput{MerchantID: m.ID, Limit: 7}
	for pages := 0; ; pages++ {
		page, more, err := db.ListPayments(ctx, in)
		require.NoError(t, err)
		for _, p := range page {
			seen[p.ID]++
		}
		if !more {
			break
		}
		last := page[len(page)-1].ID
		in.StartingAfter = &last
		if pages%5 == 0 {
			time.Sleep(5 * time.Millisecond) // let the inserts interleave with the walk
		}
	}
	close(stop)
	wg.Wait()

	require.Positive(t, inserted.Load(), "payments were inserted during the walk")
	for id, n := range seen {
		require.Equal(t, 1, n, "payment %s listed %d times", id, n)
	}
	for id := range before {
		require.Equal(t, 1, seen[id], "payment %s that existed before the walk is listed", id)
	}
}

// planNode is the part of EXPLAIN (FORMAT JSON) the plan test reads.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	IndexName    string     `json:"Index Name"`
	RelationName string     `json:"Relation Name"`
	Plans        []planNode `json:"Plans"`
}

func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// The list is served by its indexes in their order: an index scan and no sort, with and
// without the status filter, on the first page and after a cursor, planned for the values
// (custom plan) and for any values (generic plan, which prepared statements end up with).
func TestListPaymentsPlanUsesIndexWithoutSort(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	var merchants []testkit.Merchant
	for range 4 {
		merchants = append(merchants, testkit.NewMerchant(t, own, testkit.MerchantOptions{}))
	}
	// 20,000 payments of four merchants over 30 days, mostly succeeded, few unknown or
	// processing, each with its record as Begin and the workflow's steps leave it.
	for _, m := range merchants {
		require.NoError(t, own.Exec(ctx, `WITH g AS (
			SELECT n, 'k' || n AS key, gen_random_uuid() AS id, now() - n * interval '500 seconds' AS created,
				CASE WHEN n % 100 = 0 THEN 'unknown' WHEN n % 100 = 50 THEN 'processing'
					WHEN n % 10 = 1 THEN 'failed' ELSE 'succeeded' END AS status
			FROM generate_series(1, 5000) n
		), r AS (
			INSERT INTO idempotency_records (merchant_id, idempotency_key, request_hash, status, operation_id, created_at)
			SELECT $1, key, repeat('0', 64), CASE WHEN status IN ('processing', 'unknown') THEN status ELSE 'completed' END,
				id, created FROM g)
			INSERT INTO payments (id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id,
				payment_type, status, failure_code, created_at)
			SELECT id, $1, key, $2, 100, 'TRY', key, 'purchase', status,
				CASE WHEN status = 'failed' THEN 'declined' END, created FROM g`, m.ID, m.Account))
	}
	require.NoError(t, own.Exec(ctx, `ANALYZE payments, idempotency_records`))
	m := merchants[1]
	page, _, err := own.ListPayments(ctx, store.ListPaymentsInput{MerchantID: m.ID, Limit: 50})
	require.NoError(t, err)
	cursor := page[len(page)-1]

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	explain := func(t *testing.T, sql string, args []any, generic bool) (planNode, string) {
		t.Helper()
		mode := "auto"
		if generic {
			mode = "force_generic_plan"
		}
		_, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode)
		require.NoError(t, err)
		_, _ = conn.Exec(ctx, "DEALLOCATE ALL")
		_, err = conn.Exec(ctx, "PREPARE listing AS "+sql)
		require.NoError(t, err)
		literals := make([]string, len(args))
		for i, a := range args {
			literals[i] = fmt.Sprintf("'%v'", a)
			if a == nil {
				literals[i] = "NULL"
			}
		}
		var out []struct {
			Plan planNode `json:"Plan"`
		}
		var raw []byte
		require.NoError(t, conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE listing("+strings.Join(literals, ", ")+")",
			pgx.QueryExecModeSimpleProtocol).Scan(&raw))
		require.NoError(t, json.Unmarshal(raw, &out))
		return out[0].Plan, string(raw)
	}

	farFuture, farPast := "infinity", "-infinity"
	maxID := "ffffffff-ffff-ffff-ffff-ffffffffffff"
	after := []any{cursor.CreatedAt.Format(time.RFC3339Nano), cursor.ID}
	first := []any{farFuture, maxID}
	byTime, failed, open := "payments_merchant_created", "payments_merchant_failed", "idempotency_open"
	both := []bool{false, true}
	for _, tc := range []struct {
		name    string
		sql     string
		args    []any
		indexes []string // any of these
		generic []bool
		join    string // the index each listed row's payment is then read by, if any
	}{
		{"first page", dbsqlc.ListPayments, append([]any{m.ID, farPast}, append(first, 21)...), []string{byTime}, both, ""},
		{"after a cursor", dbsqlc.ListPayments, append([]any{m.ID, farPast}, append(after, 21)...), []string{byTime}, both, ""},
		{"created range", dbsqlc.ListPayments, []any{m.ID, time.Now().Add(-20 * 24 * time.Hour).Format(time.RFC3339Nano),
			time.Now().Add(-10 * 24 * time.Hour).Format(time.RFC3339Nano), uuid.Nil, 101}, []string{byTime}, both, ""},
		// A common status is as cheap to find by filtering the merchant's payments in order.
		{"status succeeded", dbsqlc.ListPaymentsWithStatus, append([]any{m.ID, farPast}, append(first, 21, "succeeded")...), []string{byTime}, both, ""},
		{"status succeeded after a cursor", dbsqlc.ListPaymentsWithStatus, append([]any{m.ID, farPast}, append(after, 21, "succeeded")...), []string{byTime}, both, ""},
		// Failed payments have their own index.
		{"status failed", dbsqlc.ListFailedPayments, append([]any{m.ID, farPast}, append(first, 21)...), []string{failed}, both, ""},
		{"status failed after a cursor", dbsqlc.ListFailedPayments, append([]any{m.ID, farPast}, append(after, 21)...), []string{failed}, both, ""},
		// The rare ones, processing and unknown, are read along the merchant's open records,
		// each joined to its payment.
		{"status processing", dbsqlc.ListOpenPayments, append([]any{m.ID, farPast}, append(first, 21, "processing")...), []string{open}, both, "payments_pkey"},
		{"status processing after a cursor", dbsqlc.ListOpenPayments, append([]any{m.ID, farPast}, append(after, 21, "processing")...), []string{open}, both, "payments_pkey"},
		{"status unknown", dbsqlc.ListOpenPayments, append([]any{m.ID, farPast}, append(first, 21, "unknown")...), []string{open}, both, "payments_pkey"},
		{"status unknown after a cursor", dbsqlc.ListOpenPayments, append([]any{m.ID, farPast}, append(after, 21, "unknown")...), []string{open}, both, "payments_pkey"},
		// GET /v1/payments?idempotency_key= and the sweeper find a payment by its key.
		{"by idempotency key", dbsqlc.GetPaymentByKey, []any{m.ID, "k4242"}, []string{"payments_merchant_key"}, both, ""},
		// A duplicate invoice's live payment, by the business key.
		{"live payment of an invoice", dbsqlc.LivePayment, []any{m.ID, "k4242", "purchase"}, []string{"payments_business_key"}, both, ""},
	} {
		for _, generic := range tc.generic {
			t.Run(fmt.Sprintf("%s generic=%v", tc.name, generic), func(t *testing.T) {
				plan, raw := explain(t, tc.sql, tc.args, generic)
				var types, indexes []string
				plan.walk(func(n planNode) {
					types = append(types, n.NodeType)
					if n.IndexName != "" {
						indexes = append(indexes, n.IndexName)
					}
				})
				require.NotContains(t, types, "Sort", "plan %s", raw)
				require.NotContains(t, types, "Incremental Sort", "plan %s", raw)
				require.Contains(t, types, "Index Scan", "plan %s", raw)
				if tc.join == "" {
					require.Len(t, indexes, 1, "plan %s", raw)
				} else {
					// A nested loop keeps the outer index's order; a hash or merge join would not.
					require.Len(t, indexes, 2, "plan %s", raw)
					require.Equal(t, tc.join, indexes[1], "plan %s", raw)
					require.Contains(t, types, "Nested Loop", "plan %s", raw)
				}
				require.Contains(t, tc.indexes, indexes[0], "plan %s", raw)
			})
		}
	}

	// The health figures and the sweeper find the open payments through the open records too:
	// neither reads all of payments or of the records, however many operations finished.
	for _, tc := range []struct {
		name string
		sql  string
		args []any
	}{
		{"stats", dbsqlc.Stats, []any{store.StuckAfter.Seconds()}},
		{"stranded", dbsqlc.Stranded, []any{nil, 100}},
		{"stranded of a merchant", dbsqlc.Stranded, []any{m.ID, 100}},
	} {
		for _, generic := range both {
			t.Run(fmt.Sprintf("%s generic=%v", tc.name, generic), func(t *testing.T) {
				plan, raw := explain(t, tc.sql, tc.args, generic)
				var indexes []string
				plan.walk(func(n planNode) {
					if n.IndexName != "" {
						indexes = append(indexes, n.IndexName)
					}
					if n.NodeType == "Seq Scan" {
						require.NotContains(t, []string{"payments", "idempotency_records"}, n.RelationName, "plan %s", raw)
					}
				})
				require.Contains(t, indexes, open, "plan %s", raw)
			})
		}
	}
}
