package store

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// The start backlog (store/queries/backlog.sql): payments accepted while workflows could not
// start as fast as they arrived, queued on their records until the drainer starts them.

// ClaimQueued leases to the caller the oldest perMerchant queued payments of each of up to
// merchants merchants whose id follows after: one queue per merchant, in merchant id order,
// each in the order its payments arrived.
func (s *Store) ClaimQueued(ctx context.Context, after uuid.UUID, merchants, perMerchant int, lease time.Duration) ([][]payment.Payment, error) {
	rows, err := s.q.ClaimQueued(ctx, dbsqlc.ClaimQueuedParams{
		Lease: pgtype.Interval{Microseconds: lease.Microseconds(), Valid: true},
		After: after, Merchants: int32(merchants), PerMerchant: int32(perMerchant),
	})
	if err != nil {
		return nil, translate(err)
	}
	slices.SortFunc(rows, func(a, b dbsqlc.Payment) int {
		if c := slices.Compare(a.MerchantID[:], b.MerchantID[:]); c != 0 {
			return c
		}
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return slices.Compare(a.ID[:], b.ID[:])
	})
	var queues [][]payment.Payment
	for i, r := range rows {
		if i == 0 || r.MerchantID != rows[i-1].MerchantID {
			queues = append(queues, nil)
		}
		queues[len(queues)-1] = append(queues[len(queues)-1], paymentOf(r))
	}
	return queues, nil
}

// Unclaim puts claimed payments whose start failed back in their merchant's queue, in their
// place: the drainer claims them again, before anything that arrived after them.
func (s *Store) Unclaim(ctx context.Context, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	return translate(s.q.Unclaim(ctx, ids))
}

// Unqueue leaves payments whose start failed for a reason of their own to the sweeper: their
// merchant's queue goes on without them.
func (s *Store) Unqueue(ctx context.Context, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	return translate(s.q.Unqueue(ctx, ids))
}

// StillProcessing is which of the payments ids are still processing.
func (s *Store) StillProcessing(ctx context.Context, ids []uuid.UUID) ([]uuid.UUID, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	out, err := s.q.StillProcessing(ctx, ids)
	return out, translate(err)
}

// DrainedProcessing is the payments a drainer started that are still processing (not flagged
// stuck): a drainer that takes the lead keeps them among its running ones, as the last leader did.
func (s *Store) DrainedProcessing(ctx context.Context) ([]payment.Payment, error) {
	rows, err := s.q.DrainedProcessing(ctx)
	if err != nil {
		return nil, translate(err)
	}
	ps := make([]payment.Payment, len(rows))
	for i, r := range rows {
		ps[i] = paymentOf(r)
	}
	return ps, nil
}

// QueuedLeased says whether a queued payment is still leased to a drainer: one that took the lead
// waits for the last leader's claims to run out before it claims any itself.
func (s *Store) QueuedLeased(ctx context.Context) (bool, error) {
	leased, err := s.q.QueuedLeased(ctx)
	return leased, translate(err)
}

// BacklogState is the start backlog as its drainer last saw it.
type BacklogState struct {
	Queued         int64
	Oldest         time.Time     // the oldest queued record's arrival; zero when none is queued
	DrainPerSecond float64       // payments the drainer started per second, lately
	Age            time.Duration // how long ago the drainer saw it
	// Counted: the record was older than backlogRecordFresh (or there was none), and Queued and
	// Oldest were counted from the queue itself.
	Counted bool
	// Now is the database's clock at the read, which stamped Oldest: its age is taken from it,
	// never from a host's clock.
	Now time.Time
}

// backlogRecordFresh is how old the drainer's record may be and still say what the backlog holds:
// the drainer saves it every second, unless it is stuck starting a workflow or none leads.
const backlogRecordFresh = 2 * time.Second

// MerchantQueued says whether the merchant has payments queued in the start backlog.
func (s *Store) MerchantQueued(ctx context.Context, merchant uuid.UUID) (bool, error) {
	queued, err := s.q.MerchantQueued(ctx, merchant)
	return queued, translate(err)
}

// QueuedBacklog counts the queued records and finds the oldest's arrival.
func (s *Store) QueuedBacklog(ctx context.Context) (n int64, oldest time.Time, err error) {
	row, err := s.q.QueuedBacklog(ctx)
	if err != nil {
		return 0, time.Time{}, translate(err)
	}
	if row.Queued > 0 {
		oldest = row.Oldest
	}
	return row.Queued, oldest, nil
}

// SaveBacklogState records what the drainer saw, for the API's admission.
func (s *Store) SaveBacklogState(ctx context.Context, b BacklogState) error {
	var oldest *time.Time
	if !b.Oldest.IsZero() {
		oldest = &b.Oldest
	}
	return translate(s.q.SaveBacklogState(ctx, dbsqlc.SaveBacklogStateParams{
		Queued: b.Queued, Oldest: oldest, DrainPerSecond: b.DrainPerSecond,
	}))
}

// BacklogState is the drainer's last record, with the queue counted instead when the record is
// older than backlogRecordFresh or missing: the APIs bound new payments by it.
func (s *Store) BacklogState(ctx context.Context) (BacklogState, error) {
	var b BacklogState
	row, err := s.q.GetBacklogState(ctx)
	switch {
	case err == nil:
		b = BacklogState{Queued: row.Queued, DrainPerSecond: row.DrainPerSecond, Age: row.Now.Sub(row.UpdatedAt), Now: row.Now}
		if row.Oldest != nil {
			b.Oldest = *row.Oldest
		}
		if b.Age <= backlogRecordFresh {
			return b, nil
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return BacklogState{}, translate(err)
	}
	q, err := s.q.QueuedBacklog(ctx)
	if err != nil {
		return BacklogState{}, translate(err)
	}
	b.Queued, b.Oldest, b.Counted, b.Now = q.Queued, time.Time{}, true, q.Now
	if q.Queued > 0 {
		b.Oldest = q.Oldest
	}
	return b, nil
}

// leadIdle is how long a leader's session may go without a check of its lead (held) before
// PostgreSQL ends it, and so lets the lock go: a process that is frozen (a paused VM) or cut off
// keeps no lead longer than that, where its connection alone could hold it for hours. Longer
// than a drainer's slowest pass between two checks (its starts timing out while Temporal is away).
var leadIdle = 2 * time.Minute

// Lead makes the caller the one holder of name across every process on the database, while ok:
// a session advisory lock on a connection of its own, which PostgreSQL lets go when the process
// or its connection dies, or the session stays idle for leadIdle. held reports whether the lock
// is still held (the connection works), and must be called more often than that; release gives
// it up.
func (s *Store) Lead(ctx context.Context, name string) (ok bool, held func(context.Context) bool, release func(), err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, nil, nil, translate(err)
	}
	h := fnv.New64a()
	h.Write([]byte("kasa/" + name))
	key := int64(h.Sum64())
	q := dbsqlc.New(conn)
	if ok, err = q.TryLead(ctx, key); err != nil || !ok {
		conn.Release()
		return false, nil, nil, translate(err)
	}
	if err := q.SetSessionIdleTimeout(ctx, leadIdle.Milliseconds()); err != nil {
		releaseLead(conn, key)
		return false, nil, nil, translate(err)
	}
	held = func(ctx context.Context) bool {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a peer cut off answers nothing
		defer cancel()
		return conn.Ping(ctx) == nil
	}
	release = func() { releaseLead(conn, key) }
	return true, held, release, nil
}

func releaseLead(conn *pgxpool.Conn, key int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q := dbsqlc.New(conn)
	if err := q.Unlead(ctx, key); err != nil || q.SetSessionIdleTimeout(ctx, 0) != nil {
		conn.Conn().Close(ctx) // a session still holding the lock, or the leader's timeout, must not return to the pool
	}
	conn.Release()
}

// Processing counts the operations still processing: queued, or started and not yet final.
func (s *Store) Processing(ctx context.Context) (int64, error) {
	n, err := s.q.ProcessingRecords(ctx)
	return n, translate(err)
}
