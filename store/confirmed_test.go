package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
)

func ids(evs []store.OutboxEvent) []uuid.UUID {
	out := make([]uuid.UUID, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// A consumer's point moves over the published rows its inbox holds and stops at the first one it
// lacks; what the inbox lacks is due, oldest first; rows too recent are not looked at, rows too
// old are given up; one relay at a time moves the point.
func TestUnconfirmedOutboxFollowsTheInbox(t *testing.T) {
	ctx := context.Background()
	publishAll(t) // whatever earlier tests left: published before the point starts
	consumer := "confirm-" + uuid.NewString()
	q := store.UnconfirmedQuery{Consumer: consumer, After: 0, GiveUp: time.Hour, Page: 10, Pages: 5}
	u, err := db.UnconfirmedOutbox(ctx, q) // the point starts now
	require.NoError(t, err)
	require.Zero(t, u.Checked)

	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	p1 := settle(t, mID, aID, true) // two events: unknown, then succeeded
	p2 := settle(t, mID, aID, false)
	evs := publishAll(t)
	evs = append(evs, publishAll(t)...)
	e1, e2 := eventsOf(evs, p1), eventsOf(evs, p2)
	require.Len(t, e1, 2)
	require.Len(t, e2, 1)

	// Too recent to look at.
	u, err = db.UnconfirmedOutbox(ctx, store.UnconfirmedQuery{Consumer: consumer, After: time.Hour, GiveUp: 2 * time.Hour, Page: 10, Pages: 5})
	require.NoError(t, err)
	require.Zero(t, u.Checked)
	require.Empty(t, u.Due)

	// The first event is in the inbox: the point moves over it; the other two are due.
	acc, err := db.AcceptEvent(ctx, consumer, newDelivery(e1[0]))
	require.NoError(t, err)
	require.Equal(t, store.AcceptedPending, acc)
	u, err = db.UnconfirmedOutbox(ctx, q)
	require.NoError(t, err)
	require.Equal(t, 3, u.Checked)
	require.ElementsMatch(t, []uuid.UUID{e1[1].ID, e2[0].ID}, ids(u.Due))
	for _, e := range u.Due {
		require.NotEmpty(t, e.Payload, "a due event comes whole, to be published again")
	}
	require.Empty(t, u.GaveUp)

	// Another relay holds the point: this one checks nothing.
	release, err := db.HoldConfirmedPoint(ctx, consumer)
	require.NoError(t, err)
	u, err = db.UnconfirmedOutbox(ctx, q)
	require.NoError(t, err)
	require.True(t, u.Busy)
	require.Zero(t, u.Checked)
	release()

	// Both in the inbox: the point crosses them a page of one at a time; then nothing is left.
	for _, e := range []store.OutboxEvent{e1[1], e2[0]} {
		_, err := db.AcceptEvent(ctx, consumer, newDelivery(e))
		require.NoError(t, err)
	}
	u, err = db.UnconfirmedOutbox(ctx, store.UnconfirmedQuery{Consumer: consumer, GiveUp: time.Hour, Page: 1, Pages: 5})
	require.NoError(t, err)
	require.Equal(t, 2, u.Checked, "one page per row, and the point started past the first event")
	require.Empty(t, u.Due)
	u, err = db.UnconfirmedOutbox(ctx, q)
	require.NoError(t, err)
	require.Zero(t, u.Checked)

	progress, err := db.OutboxProgress(ctx, consumer, []uuid.UUID{e1[0].ID, e2[0].ID})
	require.NoError(t, err)
	require.Len(t, progress, 2)
	for _, p := range progress {
		require.NotNil(t, p.PublishedAt)
		require.True(t, p.Inboxed)
	}

	// Never in the inbox and older than GiveUp: passed over and reported once.
	p3 := settle(t, mID, aID, false)
	e3 := eventsOf(publishAll(t), p3)
	require.Len(t, e3, 1)
	u, err = db.UnconfirmedOutbox(ctx, store.UnconfirmedQuery{Consumer: consumer, GiveUp: 0, Page: 10, Pages: 5})
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{e3[0].ID}, u.GaveUp)
	require.Empty(t, u.Due)
	u, err = db.UnconfirmedOutbox(ctx, q)
	require.NoError(t, err)
	require.Zero(t, u.Checked)
	progress, err = db.OutboxProgress(ctx, consumer, []uuid.UUID{e3[0].ID})
	require.NoError(t, err)
	require.False(t, progress[0].Inboxed)
}

// The check reads the outbox through outbox_published from the point on, a page at most, however
// much was published before: planned for the values and for any values.
func TestUnconfirmedOutboxPlanReadsAPage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	// A week of published events, one every 30 seconds, in the inbox, and the last minute's
	// unpublished ones.
	require.NoError(t, own.Exec(ctx, `INSERT INTO outbox (id, aggregate_id, type, payload, created_at, published_at)
		SELECT gen_random_uuid(), gen_random_uuid(), 'payment.succeeded', '{}', t, CASE WHEN g > 2 THEN t END
		FROM generate_series(1, 20160) g, LATERAL (SELECT now() - g * interval '30 seconds' AS t) x`))
	require.NoError(t, own.Exec(ctx, `INSERT INTO inbox (consumer, message_id) SELECT 'webhooks', id FROM outbox WHERE published_at IS NOT NULL`))
	require.NoError(t, own.Exec(ctx, `ANALYZE outbox, inbox`))

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	page := 100
	for _, generic := range []bool{false, true} {
		t.Run(fmt.Sprintf("generic=%v", generic), func(t *testing.T) {
			// The point a day back: 2,880 rows after it, of which a page is read.
			plan, raw := planOf(t, conn, generic, true, store.QueryOutboxAfterConfirmed,
				fmt.Sprintf(`86400, '%s', '%s', 60, 'infinity', %d, 'webhooks'`,
					time.Now().Add(-24*time.Hour).UTC().Format(time.RFC3339Nano), uuid.Nil, page))
			most, returned := 0.0, plan.ActualRows
			plan.walk(func(n analyzedNode) {
				most = max(most, n.ActualRows)
				if n.RelationName == "outbox" || n.RelationName == "inbox" {
					require.NotEqual(t, "Seq Scan", n.NodeType, "neither table is read whole: plan %s", raw)
				}
				require.NotContains(t, n.NodeType, "Sort", "the index gives the order: plan %s", raw)
			})
			require.Equal(t, float64(page), returned, "plan %s", raw)
			require.LessOrEqual(t, most, float64(page), "a step handled more rows than a page: plan %s", raw)
		})
	}
}

// After a broker lost many acknowledged events, one check returns every lost event it reads (its
// pages, not only the first): the relay then publishes them all again at once, instead of a page
// a check while the merchants' webhooks wait.
func TestUnconfirmedOutboxReturnsEveryLostEventItReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	q := store.UnconfirmedQuery{Consumer: "webhooks", GiveUp: time.Hour, Page: 10, Pages: 5}
	u, err := own.UnconfirmedOutbox(ctx, q) // the point starts now
	require.NoError(t, err)
	require.Zero(t, u.Checked)
	// 25 events published after it, the first in the inbox, the other 24 lost by the broker.
	require.NoError(t, own.Exec(ctx, `INSERT INTO outbox (id, aggregate_id, type, payload, created_at, published_at)
		SELECT gen_random_uuid(), gen_random_uuid(), 'payment.succeeded', '{}', t, t
		FROM generate_series(1, 25) g, LATERAL (SELECT now() + g * interval '1 millisecond' AS t) x`))
	require.NoError(t, own.Exec(ctx, `INSERT INTO inbox (consumer, message_id)
		SELECT 'webhooks', id FROM outbox ORDER BY published_at LIMIT 1`))
	time.Sleep(50 * time.Millisecond) // every row published in the past

	u, err = own.UnconfirmedOutbox(ctx, q)
	require.NoError(t, err)
	require.Len(t, u.Due, 24, "every lost event of the five pages read")
	require.Empty(t, u.GaveUp)
	u, err = own.UnconfirmedOutbox(ctx, store.UnconfirmedQuery{Consumer: "webhooks", GiveUp: time.Hour, Page: 10, Pages: 2})
	require.NoError(t, err)
	require.Len(t, u.Due, 20, "two pages from the point, which the first check moved past the event the inbox holds")
}
