package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// The outbox tests below do not call t.Parallel: RelayOutbox and ClaimDeliveries work on every
// row of the database, and sequential tests never overlap the package's parallel ones.

// webhookMerchant makes a merchant with a webhook URL (empty: none) and a funded TRY account.
func webhookMerchant(t *testing.T, url string) (merchantID, accountID uuid.UUID) {
	t.Helper()
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "hooks", WebhookURL: url, WebhookSecret: "whsec_test", Deposit: 1_000_000})
	return m.ID, m.Account
}

// publishAll relays every claimable event (marking it), returning them in relay order.
func publishAll(t *testing.T) []store.OutboxEvent {
	t.Helper()
	var all []store.OutboxEvent
	for {
		var batch []store.OutboxEvent
		_, _, err := db.RelayOutbox(context.Background(), 500, func(_ context.Context, evs []store.OutboxEvent) ([]uuid.UUID, error) {
			batch = evs
			ids := make([]uuid.UUID, len(evs))
			for i, e := range evs {
				ids[i] = e.ID
			}
			return ids, nil
		})
		require.NoError(t, err)
		if len(batch) == 0 {
			return all
		}
		all = append(all, batch...)
	}
}

func eventsOf(evs []store.OutboxEvent, aggregate uuid.UUID) []store.OutboxEvent {
	var out []store.OutboxEvent
	for _, e := range evs {
		if e.AggregateID == aggregate {
			out = append(out, e)
		}
	}
	return out
}

func TestRelayOutboxOneEventPerAggregateAndSkipLocked(t *testing.T) {
	ctx := context.Background()
	publishAll(t) // whatever earlier tests left
	mID, aID := webhookMerchant(t, "")
	p1 := settle(t, mID, aID, true) // unknown, then succeeded
	p2 := settle(t, mID, aID, false)

	// Relay A claims and holds its batch while relay B claims: B must skip A's rows and must not
	// take p1's second event before its first is published.
	holding, release := make(chan []store.OutboxEvent), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, published, err := db.RelayOutbox(ctx, 100, func(_ context.Context, evs []store.OutboxEvent) ([]uuid.UUID, error) {
			holding <- evs
			<-release
			ids := []uuid.UUID{}
			for _, e := range evs {
				ids = append(ids, e.ID)
			}
			return ids, nil
		})
		require.NoError(t, err)
		require.Equal(t, 2, published)
	}()
	a := <-holding
	require.Len(t, a, 2, "one event per payment: p1's first and p2's only")
	require.Equal(t, "payment.unknown", eventsOf(a, p1)[0].Type)
	require.Len(t, eventsOf(a, p2), 1)

	claimedByB, _, err := db.RelayOutbox(ctx, 100, func(_ context.Context, evs []store.OutboxEvent) ([]uuid.UUID, error) {
		return nil, nil
	})
	require.NoError(t, err)
	require.Zero(t, claimedByB, "rows locked by A are skipped and p1's next event waits for its first")
	close(release)
	wg.Wait()

	rest := publishAll(t)
	require.Len(t, eventsOf(rest, p1), 1)
	require.Equal(t, "payment.succeeded", eventsOf(rest, p1)[0].Type)
	n, age, err := db.OutboxBacklog(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Zero(t, age)
}

func TestRelayOutboxMarksOnlyAcknowledged(t *testing.T) {
	ctx := context.Background()
	publishAll(t)
	mID, aID := webhookMerchant(t, "")
	p1, p2 := settle(t, mID, aID, false), settle(t, mID, aID, false)
	claimed, published, err := db.RelayOutbox(ctx, 100, func(_ context.Context, evs []store.OutboxEvent) ([]uuid.UUID, error) {
		return []uuid.UUID{eventsOf(evs, p1)[0].ID}, fmt.Errorf("broker lost the other one")
	})
	require.ErrorContains(t, err, "broker lost")
	require.Equal(t, 2, claimed)
	require.Equal(t, 1, published)
	rest := publishAll(t)
	require.Len(t, rest, 1)
	require.Equal(t, p2, rest[0].AggregateID)
}

func newDelivery(e store.OutboxEvent) store.NewDelivery {
	return store.NewDelivery{EventID: e.ID, AggregateID: e.AggregateID, Type: e.Type, CreatedAt: e.CreatedAt, Body: []byte(`{"id":"` + e.ID.String() + `"}`)}
}

func TestAcceptEventOnceInOrder(t *testing.T) {
	ctx := context.Background()
	publishAll(t)
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	p := settle(t, mID, aID, true)
	noURL, noURLAccount := webhookMerchant(t, "")
	q := settle(t, noURL, noURLAccount, false)
	evs := publishAll(t)
	pe, qe := eventsOf(evs, p), eventsOf(evs, q)
	require.Len(t, pe, 2)

	// Reading the succeeded event brings the unknown one, which this inbox lacks: the consumer
	// records it first.
	evs, err := db.EventsToRecord(ctx, "test", []uuid.UUID{pe[1].ID})
	require.NoError(t, err)
	require.ElementsMatch(t, []uuid.UUID{pe[0].ID, pe[1].ID}, eventIDs(evs))
	// The inbox records what it is given: another one took the later event alone.
	acc, err := db.AcceptEvent(ctx, "other", newDelivery(pe[1]))
	require.NoError(t, err)
	require.Equal(t, store.AcceptedPending, acc)

	acc, err = db.AcceptEvent(ctx, "test", newDelivery(pe[0]))
	require.NoError(t, err)
	require.Equal(t, store.AcceptedPending, acc)
	evs, err = db.EventsToRecord(ctx, "test", []uuid.UUID{pe[1].ID})
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{pe[1].ID}, eventIDs(evs), "the inbox holds the earlier one now")
	acc, err = db.AcceptEvent(ctx, "test", newDelivery(pe[1]))
	require.NoError(t, err)
	require.Equal(t, store.AcceptedDuplicate, acc, "new to this inbox, but its delivery exists (made through the other inbox)")
	for range 3 {
		acc, err = db.AcceptEvent(ctx, "test", newDelivery(pe[1]))
		require.NoError(t, err)
		require.Equal(t, store.AcceptedDuplicate, acc)
	}

	acc, err = db.AcceptEvent(ctx, "test", newDelivery(qe[0]))
	require.NoError(t, err)
	require.Equal(t, store.AcceptedSkipped, acc)
	ignored := newDelivery(qe[0])
	ignored.EventID, ignored.Body = payment.NewID(), nil
	acc, err = db.AcceptEvent(ctx, "test", ignored)
	require.NoError(t, err)
	require.Equal(t, store.AcceptedIgnored, acc)
	orphan := newDelivery(qe[0])
	orphan.EventID, orphan.AggregateID = payment.NewID(), payment.NewID()
	acc, err = db.AcceptEvent(ctx, "test", orphan)
	require.NoError(t, err)
	require.Equal(t, store.AcceptedOrphan, acc)

	ds, err := db.PaymentDeliveries(ctx, p)
	require.NoError(t, err)
	require.Len(t, ds, 2, "one delivery per event id whatever the redeliveries")
	require.Equal(t, pe[0].ID, ds[0].ID, "in event order")
	require.Equal(t, pe[1].ID, ds[1].ID)
	require.Equal(t, store.DeliveryPending, ds[0].Status)
	require.Equal(t, "http://127.0.0.1:9/hook", ds[0].URL)
	ds, err = db.MerchantDeliveries(ctx, noURL, 10)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, store.DeliverySkipped, ds[0].Status)
	_, err = db.MerchantDeliveries(ctx, payment.NewID(), 10)
	require.ErrorIs(t, err, payment.ErrNotFound)
}

func TestAcceptEventsInOneTransaction(t *testing.T) {
	ctx := context.Background()
	publishAll(t)
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	p := settle(t, mID, aID, true)
	q := settle(t, mID, aID, true)
	evs := publishAll(t)
	pe, qe := eventsOf(evs, p), eventsOf(evs, q)
	require.Len(t, pe, 2)
	require.Len(t, qe, 2)
	deliveries := func(id uuid.UUID) []uuid.UUID {
		ds, err := db.PaymentDeliveries(ctx, id)
		require.NoError(t, err)
		var ids []uuid.UUID
		for _, d := range ds {
			ids = append(ids, d.ID)
		}
		return ids
	}

	// Reading later events brings the earlier ones this inbox lacks, and only those.
	evs, err := db.EventsToRecord(ctx, "batch", []uuid.UUID{pe[1].ID})
	require.NoError(t, err)
	require.ElementsMatch(t, []uuid.UUID{pe[0].ID, pe[1].ID}, eventIDs(evs))
	acc, err := db.AcceptEvents(ctx, "batch", []store.NewDelivery{newDelivery(pe[0])})
	require.NoError(t, err)
	require.Equal(t, []store.Acceptance{store.AcceptedPending}, acc)
	require.Equal(t, []uuid.UUID{pe[0].ID}, deliveries(p))
	evs, err = db.EventsToRecord(ctx, "batch", []uuid.UUID{pe[1].ID, qe[1].ID, payment.NewID()})
	require.NoError(t, err)
	require.ElementsMatch(t, []uuid.UUID{pe[1].ID, qe[0].ID, qe[1].ID}, eventIDs(evs))

	// In order; a message seen before, or twice in one batch, is a duplicate.
	acc, err = db.AcceptEvents(ctx, "batch", []store.NewDelivery{
		newDelivery(qe[0]), newDelivery(qe[1]), newDelivery(pe[0]), newDelivery(pe[1]), newDelivery(qe[1]),
	})
	require.NoError(t, err)
	require.Equal(t, []store.Acceptance{
		store.AcceptedPending, store.AcceptedPending, store.AcceptedDuplicate, store.AcceptedPending, store.AcceptedDuplicate,
	}, acc)
	require.Equal(t, []uuid.UUID{pe[0].ID, pe[1].ID}, deliveries(p))
	require.Equal(t, []uuid.UUID{qe[0].ID, qe[1].ID}, deliveries(q))

	// A statement that fails undoes the whole batch: the event before it is not in the inbox.
	r := settle(t, mID, aID, false)
	re := eventsOf(publishAll(t), r)
	bad := newDelivery(re[0])
	bad.EventID, bad.Type = payment.NewID(), "payment.\xff"
	_, err = db.AcceptEvents(ctx, "batch", []store.NewDelivery{newDelivery(re[0]), bad})
	require.Error(t, err)
	require.Empty(t, deliveries(r))
	acc, err = db.AcceptEvents(ctx, "batch", []store.NewDelivery{newDelivery(re[0])})
	require.NoError(t, err)
	require.Equal(t, []store.Acceptance{store.AcceptedPending}, acc, "not a duplicate: the failed batch left no inbox row")
}

// The webhook consumer's read of a batch finds each event by its key and its aggregate's earlier
// events through outbox_aggregate, and probes the inbox by key for those only, however large
// both tables are: planned for the values and for any values.
func TestOutboxEventsInboxLacksPlanReadsTheAggregates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	// 10,000 payments of three events each, all in the inbox but the newest 64 payments' last
	// event (the batch) and, for 8 of them, the one before it too.
	require.NoError(t, own.Exec(ctx, `INSERT INTO outbox (id, aggregate_id, type, payload, created_at, published_at)
		SELECT gen_random_uuid(), a.agg, 'payment.succeeded', '{}', a.t + e * interval '1 second', a.t + e * interval '1 second'
		FROM (SELECT gen_random_uuid() AS agg, now() - g * interval '1 minute' AS t FROM generate_series(1, 10000) g) a,
		generate_series(0, 2) e`))
	var batch []uuid.UUID
	require.NoError(t, own.QueryRow(ctx, `SELECT array_agg(id) FROM (SELECT id FROM outbox ORDER BY created_at DESC LIMIT 64 * 3) s
		WHERE id IN (SELECT DISTINCT ON (aggregate_id) id FROM outbox ORDER BY aggregate_id, created_at DESC)`, nil, &batch))
	require.Len(t, batch, 64)
	require.NoError(t, own.Exec(ctx, `INSERT INTO inbox (consumer, message_id) SELECT 'webhooks', o.id FROM outbox o
		WHERE o.id <> ALL($1) AND NOT (o.id IN (SELECT DISTINCT ON (aggregate_id) id FROM outbox
			WHERE aggregate_id IN (SELECT aggregate_id FROM outbox WHERE id = ANY($1) LIMIT 8) AND id <> ALL($1)
			ORDER BY aggregate_id, created_at DESC))`, batch))
	require.NoError(t, own.Exec(ctx, `ANALYZE outbox, inbox`))

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	ids := make([]string, len(batch))
	for i, id := range batch {
		ids[i] = id.String()
	}
	for _, generic := range []bool{false, true} {
		t.Run(fmt.Sprintf("generic=%v", generic), func(t *testing.T) {
			plan, raw := planOf(t, conn, generic, true, store.QueryOutboxEventsInboxLacks,
				fmt.Sprintf(`'{%s}', 'webhooks'`,
					strings.Join(ids, ",")))
			most := 0.0
			plan.walk(func(n analyzedNode) {
				most = max(most, n.ActualRows)
				if n.RelationName == "outbox" || n.RelationName == "inbox" {
					require.NotEqual(t, "Seq Scan", n.NodeType, "neither table is read whole: plan %s", raw)
				}
			})
			require.Equal(t, float64(64+8), plan.ActualRows, "the batch and the 8 earlier events: plan %s", raw)
			require.LessOrEqual(t, most, float64(3*64), "a step handled more rows than the batch's payments have events: plan %s", raw)
		})
	}
}

func eventIDs(evs []store.OutboxEvent) []uuid.UUID {
	var ids []uuid.UUID
	for _, e := range evs {
		ids = append(ids, e.ID)
	}
	return ids
}

// accepted relays the merchant's events into deliveries through one inbox, in order.
func accepted(t *testing.T) {
	t.Helper()
	for _, e := range publishAll(t) {
		_, err := db.AcceptEvent(context.Background(), "test-sender", newDelivery(e))
		require.NoError(t, err)
	}
}

// claimFor claims every due delivery and returns those of the merchant (other tests' stay leased).
func claimFor(t *testing.T, merchantID uuid.UUID, limit, perMerchant int, lease time.Duration) []store.ClaimedDelivery {
	t.Helper()
	all, err := db.ClaimDeliveries(context.Background(), limit, perMerchant, lease)
	require.NoError(t, err)
	var mine []store.ClaimedDelivery
	for _, d := range all {
		if d.MerchantID == merchantID {
			mine = append(mine, d)
		}
	}
	return mine
}

func TestClaimDeliveriesLeaseFencingAndLimits(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	var payments []uuid.UUID
	for range 5 {
		payments = append(payments, settle(t, mID, aID, false))
	}
	accepted(t)

	got := claimFor(t, mID, 100, 2, 2*time.Second) // long enough for a loaded machine
	require.Len(t, got, 2, "at most two in flight for the merchant")
	require.Equal(t, 1, got[0].Attempt)
	require.Equal(t, "whsec_test", got[0].Secret, "the webhook secret is decrypted for signing")
	require.Equal(t, `{"id":"`+got[0].ID.String()+`"}`, string(got[0].Body))
	require.Empty(t, claimFor(t, mID, 100, 2, time.Minute), "the merchant is at its limit")

	// The first is delivered; the second's sender "crashes": its lease runs out.
	first, second := got[0], got[1]
	status, attempts, superseded, err := db.RecordAttempt(ctx, store.AttemptResult{
		DeliveryID: first.ID, Attempt: 1, StartedAt: time.Now(), Duration: 5 * time.Millisecond, StatusCode: 204, Delivered: true,
	})
	require.NoError(t, err)
	require.False(t, superseded)
	require.Equal(t, store.DeliveryDelivered, status)
	require.Equal(t, 1, attempts)

	time.Sleep(2100 * time.Millisecond)
	again := claimFor(t, mID, 100, 1, time.Minute)
	require.Len(t, again, 1)
	var retaken *store.ClaimedDelivery
	if again[0].ID == second.ID {
		retaken = &again[0]
	}
	require.NotNil(t, retaken, "the expired lease is claimed first (it is the oldest due)")
	require.Equal(t, 2, retaken.Attempt, "same event id, next attempt")
	require.Equal(t, 2, retaken.Step, "the attempt that never reported counts in the backoff")

	// The crashed attempt reports late: it no longer owns the delivery.
	_, _, superseded, err = db.RecordAttempt(ctx, store.AttemptResult{
		DeliveryID: second.ID, Attempt: 1, StartedAt: time.Now(), StatusCode: 500, Error: "HTTP 500", RetryIn: time.Millisecond, RetryFor: time.Hour,
	})
	require.NoError(t, err)
	require.True(t, superseded)
	status, _, superseded, err = db.RecordAttempt(ctx, store.AttemptResult{
		DeliveryID: second.ID, Attempt: 2, StartedAt: time.Now(), StatusCode: 503, Error: "HTTP 503", RetryIn: time.Hour, RetryFor: 72 * time.Hour,
	})
	require.NoError(t, err)
	require.False(t, superseded)
	require.Equal(t, store.DeliveryPending, status)

	d, err := db.Delivery(ctx, second.ID)
	require.NoError(t, err)
	require.Equal(t, 2, d.AttemptCount)
	require.Nil(t, d.ClaimedUntil)
	require.True(t, d.NextAttemptAt.After(time.Now().Add(30*time.Minute)), "backing off")
	require.Equal(t, 503, d.LastStatusCode)
	require.Len(t, d.Attempts, 2, "both attempts are logged, the superseded one too")
	require.Equal(t, 500, d.Attempts[0].StatusCode)
	require.Equal(t, 503, d.Attempts[1].StatusCode)

	// The other three are due; the one backing off is not.
	rest := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, rest, 3)
	for _, c := range rest {
		require.NotEqual(t, second.ID, c.ID)
		_, _, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: c.ID, Attempt: c.Attempt, StartedAt: time.Now(), StatusCode: 200, Delivered: true})
		require.NoError(t, err)
	}
	_ = payments
}

func TestClaimDeliveriesKeepsPaymentOrder(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	p := settle(t, mID, aID, true)
	accepted(t)
	got := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1, "the succeeded event waits while the unknown one is pending")
	require.Equal(t, "payment.unknown", got[0].EventType)
	_, _, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: 1, StartedAt: time.Now(),
		Error: "timeout", RetryIn: 0, RetryFor: time.Hour})
	require.NoError(t, err)
	got = claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1, "a failed attempt keeps it first in line")
	require.Equal(t, "payment.unknown", got[0].EventType)
	_, _, _, err = db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: 2, StartedAt: time.Now(), StatusCode: 200, Delivered: true})
	require.NoError(t, err)
	got = claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1)
	require.Equal(t, "payment.succeeded", got[0].EventType)
	require.Equal(t, p, got[0].AggregateID)
	_, _, _, err = db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: 1, StartedAt: time.Now(), StatusCode: 200, Delivered: true})
	require.NoError(t, err)
}

// A payment's later event waits while an earlier one is retried; its own retry window starts at
// its first attempt, not when it was created: the wait must not use it up.
func TestDeliveryRetryWindowStartsAtItsFirstAttempt(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	settle(t, mID, aID, true)
	accepted(t)
	got := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1)
	require.Equal(t, "payment.unknown", got[0].EventType)
	_, _, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: 1, StartedAt: time.Now(),
		StatusCode: 500, Error: "HTTP 500", RetryIn: 0, RetryFor: time.Hour})
	require.NoError(t, err)
	time.Sleep(1200 * time.Millisecond) // the later event waits longer than its window below
	got = claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1)
	_, _, _, err = db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: 2, StartedAt: time.Now(), StatusCode: 200, Delivered: true})
	require.NoError(t, err)

	got = claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1)
	require.Equal(t, "payment.succeeded", got[0].EventType)
	status, _, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: 1, StartedAt: time.Now(),
		StatusCode: 503, Error: "HTTP 503", RetryIn: 10 * time.Millisecond, RetryFor: time.Second})
	require.NoError(t, err)
	require.Equal(t, store.DeliveryPending, status, "retried within its own window")
}

func TestDeliveryGivesUpAndRedelivers(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	settle(t, mID, aID, false)
	accepted(t)
	got := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1)
	require.Equal(t, 1, got[0].Step)
	status, _, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: 1, StartedAt: time.Now(),
		StatusCode: 500, Error: "HTTP 500", RetryIn: time.Second, RetryFor: time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, store.DeliveryFailed, status, "the next attempt would fall after the retry window")
	require.Empty(t, claimFor(t, mID, 100, 10, time.Minute))

	d, err := db.Redeliver(ctx, got[0].ID)
	require.NoError(t, err)
	require.Equal(t, store.DeliveryPending, d.Status)
	again := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, again, 1)
	require.Equal(t, got[0].ID, again[0].ID, "the same event id")
	require.Equal(t, got[0].Body, again[0].Body, "the same body")
	require.Equal(t, 2, again[0].Attempt, "the attempt count goes on")
	require.Equal(t, 1, again[0].Step, "the retry schedule starts again")
	status, attempts, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: again[0].ID, Attempt: again[0].Attempt, StartedAt: time.Now(), StatusCode: 200, Delivered: true})
	require.NoError(t, err)
	require.Equal(t, store.DeliveryDelivered, status)
	require.Equal(t, 2, attempts)

	_, err = db.Redeliver(ctx, payment.NewID())
	require.ErrorIs(t, err, payment.ErrNotFound)
	noURL, noURLAccount := webhookMerchant(t, "")
	settle(t, noURL, noURLAccount, false)
	accepted(t)
	ds, err := db.MerchantDeliveries(ctx, noURL, 10)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	_, err = db.Redeliver(ctx, ds[0].ID)
	var ve *payment.ValidationError
	require.ErrorAs(t, err, &ve, "a merchant without a webhook URL has nowhere to redeliver to")
}

// A redelivered delivery is pending again and no longer says when it was delivered, in the
// redelivery's answer and in the list alike: the earlier 2xx stays in its attempt log, and the
// new send's 2xx sets delivered_at again.
func TestRedeliveryOfADeliveredEventClearsDeliveredAt(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	settle(t, mID, aID, false)
	accepted(t)
	got := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1)
	_, _, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: 1, StartedAt: time.Now(), StatusCode: 200, Delivered: true})
	require.NoError(t, err)
	delivered, err := db.Delivery(ctx, got[0].ID)
	require.NoError(t, err)
	require.NotNil(t, delivered.DeliveredAt)

	d, err := db.Redeliver(ctx, got[0].ID)
	require.NoError(t, err)
	listed, err := db.MerchantDeliveries(ctx, mID, 10)
	require.NoError(t, err)
	require.Len(t, listed, 1)
	for _, d := range []store.Delivery{d, listed[0]} {
		require.Equal(t, store.DeliveryPending, d.Status)
		require.Nil(t, d.DeliveredAt, "pending again, not delivered")
		require.Len(t, d.Attempts, 1)
		require.Equal(t, 200, d.Attempts[0].StatusCode, "the earlier 2xx stays in the log")
	}

	again := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, again, 1)
	_, _, _, err = db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: again[0].ID, Attempt: again[0].Attempt, StartedAt: time.Now(), StatusCode: 204, Delivered: true})
	require.NoError(t, err)
	d, err = db.Delivery(ctx, got[0].ID)
	require.NoError(t, err)
	require.Equal(t, store.DeliveryDelivered, d.Status)
	require.NotNil(t, d.DeliveredAt)
	require.True(t, d.DeliveredAt.After(*delivered.DeliveredAt), "delivered again, at the new send")
}

// A redelivery asked for while an attempt is in flight keeps that attempt's lease (no second
// concurrent send), but the attempt failing does not push the send the operator asked for out
// by the attempt's backoff: the delivery is due again at once, within a fresh retry window.
func TestRedeliveryDuringAnAttemptIsSentAfterIt(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	settle(t, mID, aID, false)
	accepted(t)
	got := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1)
	_, err := db.Redeliver(ctx, got[0].ID)
	require.NoError(t, err)
	require.Empty(t, claimFor(t, mID, 100, 10, time.Minute), "the attempt in flight keeps its lease")

	status, _, superseded, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: got[0].Attempt, StartedAt: time.Now(), StatusCode: 502, Error: "HTTP 502", RetryIn: time.Hour, RetryFor: 72 * time.Hour})
	require.NoError(t, err)
	require.False(t, superseded)
	require.Equal(t, store.DeliveryPending, status)
	again := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, again, 1, "due at once, not an hour later")
	require.Equal(t, got[0].Attempt+1, again[0].Attempt)
}

// An attempt whose sender died (no log row) before a redelivery leaks into the new window's
// backoff step: the redelivery's first failure should wait step 1 (5-10 s), not step 2.
func TestRedeliveryStepIgnoresAnUnloggedAttempt(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	settle(t, mID, aID, false)
	accepted(t)
	first := claimFor(t, mID, 100, 10, 300*time.Millisecond)
	require.Len(t, first, 1)
	time.Sleep(400 * time.Millisecond) // the sender died: no attempt row
	second := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, second, 1)
	status, _, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: second[0].ID, Attempt: second[0].Attempt, StartedAt: time.Now(), StatusCode: 500, Error: "HTTP 500", RetryIn: time.Second, RetryFor: time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, store.DeliveryFailed, status)
	_, err = db.Redeliver(ctx, second[0].ID)
	require.NoError(t, err)
	again := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, again, 1)
	require.Equal(t, 1, again[0].Step, "a redelivery starts the schedule again")
}

// A redelivery asked for during an attempt: the attempt fails, the redelivery is sent right
// after; its failure should be the first of the new schedule (5-10 s), step 1.
func TestRedeliveryDuringAnAttemptStartsItsSchedule(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	settle(t, mID, aID, false)
	accepted(t)
	got := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1)
	_, err := db.Redeliver(ctx, got[0].ID)
	require.NoError(t, err)
	_, _, _, err = db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: got[0].Attempt, StartedAt: time.Now(), StatusCode: 502, Error: "HTTP 502", RetryIn: time.Hour, RetryFor: 72 * time.Hour})
	require.NoError(t, err)
	again := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, again, 1)
	require.Equal(t, 1, again[0].Step, "the redelivery's own send is the first step of its schedule")
}

// A stalled attempt's late 2xx after the takeover gave up: its 2xx marks the delivery delivered
// (the merchant has the event) unless an operator redelivered it since.
func TestLate2xxAfterTheTakeoverGaveUpIsDelivered(t *testing.T) {
	ctx := context.Background()
	_, stalled, takeover := stalledAndTakenOver(t)
	status, _, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: takeover[0].ID, Attempt: takeover[0].Attempt, StartedAt: time.Now(), StatusCode: 500, Error: "HTTP 500", RetryIn: time.Second, RetryFor: time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, store.DeliveryFailed, status)
	status, _, superseded, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: stalled[0].ID, Attempt: stalled[0].Attempt, StartedAt: time.Now(), StatusCode: 200, Delivered: true})
	require.NoError(t, err)
	d, err := db.Delivery(ctx, stalled[0].ID)
	require.NoError(t, err)
	require.Equal(t, store.DeliveryDelivered, d.Status, "superseded=%v status=%v: the merchant has the event", superseded, status)
}

// An attempt cut short by its own sender stopping (SIGTERM) is no attempt of the merchant's: it
// is logged as aborted, and the delivery is due again at once with its attempt count and backoff
// step as they were before its claim, whatever came before it; it never ends the retry window.
func TestAbortedAttemptLeavesTheDeliveryAsItWas(t *testing.T) {
	for _, tc := range []struct {
		name      string
		before    func(t *testing.T, c store.ClaimedDelivery) // runs on the claim that is then cut short
		failures  int                                         // failed attempts before that claim
		retryFor  time.Duration                               // the sender's retry window
		wantError string                                      // the delivery's last_error after the cut
		wantStep  int                                         // the next claim's backoff step
	}{
		{name: "first attempt", retryFor: 72 * time.Hour, wantStep: 1},
		{name: "after two failures", failures: 2, retryFor: 72 * time.Hour, wantError: "HTTP 500", wantStep: 3},
		// The redelivery's schedule starts at the send after the cut one.
		{name: "redelivered during it", failures: 1, retryFor: 72 * time.Hour, wantError: "HTTP 500", wantStep: 1,
			before: func(t *testing.T, c store.ClaimedDelivery) {
				_, err := db.Redeliver(context.Background(), c.ID)
				require.NoError(t, err)
			}},
		{name: "past its retry window", failures: 1, retryFor: time.Millisecond, wantError: "HTTP 500", wantStep: 2,
			before: func(*testing.T, store.ClaimedDelivery) { time.Sleep(20 * time.Millisecond) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
			settle(t, mID, aID, false)
			accepted(t)
			for i := range tc.failures {
				got := claimFor(t, mID, 100, 10, time.Minute)
				require.Len(t, got, 1)
				require.Equal(t, i+1, got[0].Attempt)
				status, _, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: got[0].Attempt, StartedAt: time.Now(),
					StatusCode: 500, Error: "HTTP 500", RetryFor: time.Hour})
				require.NoError(t, err)
				require.Equal(t, store.DeliveryPending, status)
			}
			got := claimFor(t, mID, 100, 10, time.Minute)
			require.Len(t, got, 1)
			cut := got[0]
			if tc.before != nil {
				tc.before(t, cut)
			}
			before, err := db.Delivery(ctx, cut.ID)
			require.NoError(t, err)

			status, attempts, superseded, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: cut.ID, Attempt: cut.Attempt,
				StartedAt: time.Now(), Duration: 3 * time.Second, Error: "aborted: the sender is stopping", Aborted: true, RetryFor: tc.retryFor})
			require.NoError(t, err)
			require.False(t, superseded)
			require.Equal(t, store.DeliveryPending, status, "a stop of kasa's own never ends a delivery")
			require.Equal(t, tc.failures, attempts, "the cut attempt is not counted")

			d, err := db.Delivery(ctx, cut.ID)
			require.NoError(t, err)
			require.Equal(t, store.DeliveryPending, d.Status)
			require.Equal(t, tc.failures, d.AttemptCount)
			require.Nil(t, d.ClaimedUntil, "its lease is given back")
			require.False(t, d.NextAttemptAt.After(time.Now()), "due again at once")
			require.Equal(t, tc.wantError, d.LastError, "the merchant's last answer stays the delivery's")
			require.Equal(t, before.RetrySince, d.RetrySince)
			require.Len(t, d.Attempts, tc.failures+1, "the cut attempt is logged")
			require.Contains(t, d.Attempts[len(d.Attempts)-1].Error, "aborted")

			again := claimFor(t, mID, 100, 10, time.Minute)
			require.Len(t, again, 1, "due again at once")
			require.Equal(t, cut.ID, again[0].ID)
			require.Equal(t, cut.Attempt, again[0].Attempt, "the next attempt takes the cut one's number")
			require.Equal(t, tc.wantStep, again[0].Step, "and its backoff step")
			_, _, _, err = db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: again[0].ID, Attempt: again[0].Attempt, StartedAt: time.Now(),
				StatusCode: 204, Delivered: true})
			require.NoError(t, err)
			d, err = db.Delivery(ctx, cut.ID)
			require.NoError(t, err)
			require.Equal(t, store.DeliveryDelivered, d.Status)
			require.Equal(t, tc.failures+1, d.AttemptCount)
		})
	}
}

// A stalled attempt that reports after the attempt that took the delivery over was cut short by
// its own sender's stop reports into a delivery whose count is back at the stalled attempt's
// number: it still changes nothing but the log (no retry scheduled, no failed, no count undone,
// no delivered over a redelivery made since its claim), and the delivery stays due at once.
func TestStalledAttemptReportingAfterAnAbortedTakeoverChangesNothing(t *testing.T) {
	for _, tc := range []struct {
		name       string
		redeliver  bool // an operator redelivers during the takeover
		stalled    store.AttemptResult
		wantLogged string
	}{
		{name: "a failure", stalled: store.AttemptResult{StatusCode: 500, Error: "HTTP 500", RetryIn: time.Hour, RetryFor: 72 * time.Hour}},
		{name: "a failure past its retry window", stalled: store.AttemptResult{StatusCode: 500, Error: "HTTP 500", RetryIn: time.Second, RetryFor: time.Millisecond}},
		{name: "its own stop", stalled: store.AttemptResult{Error: "aborted: the sender is stopping", Aborted: true}},
		{name: "a 2xx after a redelivery", redeliver: true, stalled: store.AttemptResult{StatusCode: 200, Delivered: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			mID, stalled, takeover := stalledAndTakenOver(t)
			require.Equal(t, stalled[0].Attempt+1, takeover[0].Attempt)
			if tc.redeliver {
				_, err := db.Redeliver(ctx, takeover[0].ID)
				require.NoError(t, err)
			}
			_, _, superseded, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: takeover[0].ID, Attempt: takeover[0].Attempt,
				StartedAt: time.Now(), Error: "aborted: the sender is stopping", Aborted: true, RetryFor: 72 * time.Hour})
			require.NoError(t, err)
			require.False(t, superseded, "the takeover owned the delivery")

			r := tc.stalled
			r.DeliveryID, r.Attempt, r.StartedAt = stalled[0].ID, stalled[0].Attempt, time.Now()
			status, _, superseded, err := db.RecordAttempt(ctx, r)
			require.NoError(t, err)
			require.True(t, superseded, "the stalled attempt no longer owns the delivery (status %s)", status)

			d, err := db.Delivery(ctx, stalled[0].ID)
			require.NoError(t, err)
			require.Equal(t, store.DeliveryPending, d.Status)
			require.Equal(t, stalled[0].Attempt, d.AttemptCount, "the stalled attempt counted, the cut one not")
			require.False(t, d.NextAttemptAt.After(time.Now()), "due again at once, as the cut attempt left it")
			require.Len(t, d.Attempts, 2, "both attempts are logged")
			again := claimFor(t, mID, 100, 10, time.Minute)
			require.Len(t, again, 1, "due again at once")
			require.Equal(t, takeover[0].Attempt, again[0].Attempt, "the next attempt takes the cut one's number")
		})
	}
}

func TestPurgeEventsInBatches(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "")
	for range 3 {
		settle(t, mID, aID, false)
	}
	accepted(t) // published, in the inbox, and a skipped (finished) delivery each
	p, err := db.PurgeEvents(ctx, time.Hour, 1)
	require.NoError(t, err)
	require.Zero(t, p, "nothing is old enough")
	p, err = db.PurgeEvents(ctx, 0, 1)
	require.NoError(t, err)
	require.GreaterOrEqual(t, p.Outbox, int64(3))
	require.GreaterOrEqual(t, p.Inbox, int64(3))
	require.GreaterOrEqual(t, p.Deliveries, int64(3))
	ds, err := db.MerchantDeliveries(ctx, mID, 10)
	require.NoError(t, err)
	require.Empty(t, ds, "finished deliveries are gone")
	p, err = db.PurgeEvents(ctx, 0, 1)
	require.NoError(t, err)
	require.Zero(t, p)

	// Unpublished rows and pending deliveries are never purged.
	hooked, hookedAccount := webhookMerchant(t, "http://127.0.0.1:1/hook")
	settle(t, hooked, hookedAccount, false)
	accepted(t)
	settle(t, mID, aID, false)
	_, err = db.PurgeEvents(ctx, 0, 1000)
	require.NoError(t, err)
	ds, err = db.MerchantDeliveries(ctx, hooked, 10)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, store.DeliveryPending, ds[0].Status, "still owed to the merchant")
	n, _, err := db.OutboxBacklog(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	publishAll(t)
}

// consume records the events ids name as the webhook consumer does: with every earlier event of
// their aggregates the inbox lacks, in commit order.
func consume(t *testing.T, s *store.Store, consumer string, ids ...uuid.UUID) []store.Acceptance {
	t.Helper()
	evs, err := s.EventsToRecord(context.Background(), consumer, ids)
	require.NoError(t, err)
	slices.SortFunc(evs, func(a, b store.OutboxEvent) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return slices.Compare(a.ID[:], b.ID[:])
	})
	nds := make([]store.NewDelivery, len(evs))
	for i, e := range evs {
		nds[i] = newDelivery(e)
	}
	accs, err := s.AcceptEvents(context.Background(), consumer, nds)
	require.NoError(t, err)
	return accs
}

// A retention pass whose outbox statement runs long (here: it waits for a row lock) deletes the
// inbox rows and finished deliveries of events its outbox statement found too recent. An event
// delivered meanwhile is then still in the outbox without its inbox row until the next pass; a
// later event of its payment must not bring it from the outbox and send it to the merchant again.
func TestRetentionNeverLeavesAnOutboxRowWithoutItsInboxRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test", Deposit: 1_000_000})
	old := payment.NewID()
	require.NoError(t, own.Exec(ctx, `INSERT INTO outbox (id, aggregate_id, type, payload, created_at, published_at)
		VALUES ($1, $2, 'payment.succeeded', '{}', now() - interval '1 hour', now() - interval '1 hour')`, old, payment.NewID()))
	p, err := testkit.Settle(ctx, own, m, true) // payment.unknown, then payment.succeeded
	require.NoError(t, err)
	relay := func() []store.OutboxEvent {
		var got []store.OutboxEvent
		_, _, err := own.RelayOutbox(ctx, 10, func(_ context.Context, evs []store.OutboxEvent) ([]uuid.UUID, error) {
			got = evs
			return eventIDs(evs), nil
		})
		require.NoError(t, err)
		return got
	}
	first := relay()
	require.Len(t, first, 1)
	require.Equal(t, "payment.unknown", first[0].Type)
	require.Equal(t, []store.Acceptance{store.AcceptedPending}, consume(t, own, "webhooks", first[0].ID))
	claimed, err := own.ClaimDeliveries(ctx, 10, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	status, _, _, err := own.RecordAttempt(ctx, store.AttemptResult{DeliveryID: claimed[0].ID, Attempt: claimed[0].Attempt,
		StartedAt: time.Now(), StatusCode: 200, Delivered: true})
	require.NoError(t, err)
	require.Equal(t, store.DeliveryDelivered, status)

	// Retention of 2 s: its outbox statement starts now, finds payment.unknown too recent and
	// waits for the lock on the old row until the inbox row and the delivery are old enough.
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE`, old)
	require.NoError(t, err)
	purged := make(chan error, 1)
	go func() {
		_, err := own.PurgeEvents(ctx, 2*time.Second, 1000)
		purged <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, own.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%DELETE FROM outbox%')`, nil, &waiting))
		return waiting
	}, 10*time.Second, 10*time.Millisecond)
	time.Sleep(3 * time.Second)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-purged)

	// The payment's next event: only it is recorded, and only it is owed to the merchant.
	next := relay()
	require.Len(t, next, 1)
	require.Equal(t, "payment.succeeded", next[0].Type)
	require.Equal(t, []store.Acceptance{store.AcceptedPending}, consume(t, own, "webhooks", next[0].ID))
	ds, err := own.PaymentDeliveries(ctx, p)
	require.NoError(t, err)
	var pending []string
	for _, d := range ds {
		if d.Status == store.DeliveryPending {
			pending = append(pending, d.EventType)
		}
	}
	require.Equal(t, []string{"payment.succeeded"}, pending, "payment.unknown was delivered already")
}

// A redelivery that commits while retention is deleting its (finished, old) delivery keeps it:
// the operator was answered 202 pending, so the merchant is owed the send. Retention picks its
// rows from a snapshot taken before the redelivery, and waits for its row lock.
func TestRetentionSparesADeliveryRedeliveredMeanwhile(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	settle(t, mID, aID, false)
	accepted(t)
	got := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, got, 1)
	status, _, _, err := db.RecordAttempt(ctx, store.AttemptResult{DeliveryID: got[0].ID, Attempt: 1, StartedAt: time.Now(),
		StatusCode: 500, Error: "HTTP 500", RetryIn: time.Second, RetryFor: time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, store.DeliveryFailed, status)

	conn, err := pgx.Connect(ctx, env.DatabaseURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, store.QueryRedeliver, got[0].ID)
	require.NoError(t, err)

	purged := make(chan error, 1)
	go func() {
		_, err := db.PurgeEvents(ctx, 0, 1000)
		purged <- err
	}()
	// The deletion of the deliveries waits for the redelivery's row lock.
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%DELETE FROM webhook_deliveries%')`, nil, &waiting))
		return waiting
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-purged)

	d, err := db.Delivery(ctx, got[0].ID)
	require.NoError(t, err, "the redelivered delivery is still there")
	require.Equal(t, store.DeliveryPending, d.Status)
	again := claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, again, 1, "and is sent")
}

// Retention runs inline in the relay's loop, every 10 minutes: its pass over the deliveries reads
// the finished rows old enough to go through an index, not the whole table, even when there is
// nothing to delete (2 M recent deliveries took 0.8 s a pass read whole). Planned for the values
// and for any values (the plan a prepared statement may end up with).
func TestPurgeDeliveriesReadsAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "http://127.0.0.1:9/hook", WebhookSecret: "whsec_test"})
	// 20,000 recent deliveries, nearly all finished: none old enough for the retention.
	require.NoError(t, own.Exec(ctx, `INSERT INTO webhook_deliveries
		(id, merchant_id, aggregate_id, event_type, event_created_at, url, body, status)
		SELECT gen_random_uuid(), $1, gen_random_uuid(), 'payment.succeeded', now(), 'http://127.0.0.1:9/hook',
			convert_to('{}', 'UTF8'), (ARRAY['delivered', 'delivered', 'failed', 'skipped', 'pending'])[1 + g % 5]
		FROM generate_series(1, 20000) g`, m.ID))
	require.NoError(t, own.Exec(ctx, `ANALYZE webhook_deliveries`))

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, generic := range []bool{false, true} {
		t.Run(fmt.Sprintf("generic=%v", generic), func(t *testing.T) {
			plan, raw := planOf(t, conn, generic, false, store.QueryPurgeDeliveries,
				fmt.Sprintf(`%f, 1000`,
					(7*24*time.Hour).Seconds()))
			read := false
			plan.walk(func(n analyzedNode) {
				if n.RelationName == "webhook_deliveries" {
					require.NotEqual(t, "Seq Scan", n.NodeType, "deliveries are never read whole: plan %s", raw)
					read = read || n.NodeType != "ModifyTable"
				}
			})
			require.True(t, read, "plan %s", raw)
		})
	}
}

// The backlog's age is the database's: its clock stamped the oldest unpublished event, and a
// relay's host clock may be minutes off it.
func TestOutboxBacklogAgeByTheDatabasesClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	require.NoError(t, own.Exec(ctx, `INSERT INTO outbox (id, aggregate_id, type, payload, created_at)
		VALUES ($1, $2, 'payment.succeeded', '{}', now() - interval '10 minutes')`, payment.NewID(), payment.NewID()))
	n, age, err := own.OutboxBacklog(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.InDelta(t, (10 * time.Minute).Seconds(), age.Seconds(), 5)
}

// Retention passes of several relays at once (every relay purges) take their turns, never one
// another's rows in another order: none fails with a deadlock.
func TestConcurrentPurgesDoNotDeadlock(t *testing.T) {
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "")
	for round := range 3 {
		for range 100 {
			settle(t, mID, aID, false)
		}
		accepted(t)
		errs := make(chan error, 8)
		for range cap(errs) {
			go func() {
				_, err := db.PurgeEvents(ctx, 0, 3)
				errs <- err
			}()
		}
		for range cap(errs) {
			require.NoError(t, <-errs, "round %d", round)
		}
		ds, err := db.MerchantDeliveries(ctx, mID, 10)
		require.NoError(t, err)
		require.Empty(t, ds, "every finished delivery purged")
	}
}

// stalledAndTakenOver is a new merchant's one delivery, claimed by an attempt that stalled past
// its lease (300 ms), then claimed by another (for a minute): each claim's one delivery.
func stalledAndTakenOver(t *testing.T) (mID uuid.UUID, stalled, takeover []store.ClaimedDelivery) {
	t.Helper()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	settle(t, mID, aID, false)
	accepted(t)
	stalled = claimFor(t, mID, 100, 10, 300*time.Millisecond)
	require.Len(t, stalled, 1)
	time.Sleep(400 * time.Millisecond)
	takeover = claimFor(t, mID, 100, 10, time.Minute)
	require.Len(t, takeover, 1)
	return mID, stalled, takeover
}
