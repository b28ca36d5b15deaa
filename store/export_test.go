package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// Exec runs one statement; tests use it to prove the schema guards itself.
func (s *Store) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := s.pool.Exec(ctx, sql, args...)
	return translate(err)
}

var MinUUIDv7 = minUUIDv7

// HoldRowLock locks an account row in a transaction of its own until release is called.
func (s *Store) HoldRowLock(ctx context.Context, account uuid.UUID) (release func(), err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, account); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return func() { _ = tx.Rollback(ctx) }, nil
}

// QueryRow runs one query and scans its single row; tests use it to check type handling.
func (s *Store) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	return s.pool.QueryRow(ctx, sql, args...).Scan(dest...)
}

// Pipelined runs fn in a pipelined transaction (BEGIN with the first batch, COMMIT with the
// last), each batch here one statement.
func (s *Store) Pipelined(ctx context.Context, fn func(send, commit func(sql string) error, nothingToCommit func()) error) error {
	return s.pipelined(ctx, func(tx *pipeTx) error {
		one := func(sql string) *pgx.Batch {
			b := &pgx.Batch{}
			b.Queue(sql)
			return b
		}
		send := func(sql string) error { return tx.send(ctx, one(sql)).Close() }
		commit := func(sql string) error { return tx.commit(ctx, one(sql)) }
		return fn(send, commit, tx.nothingToCommit)
	})
}

// AcceptEvent is AcceptEvents for one message.
func (s *Store) AcceptEvent(ctx context.Context, consumer string, e NewDelivery) (Acceptance, error) {
	acc, err := s.AcceptEvents(ctx, consumer, []NewDelivery{e})
	if err != nil {
		return "", err
	}
	return acc[0], nil
}

// QueryClaimDeliveries is the sender's claim statement, for plan tests.
var QueryClaimDeliveries = queryClaimDeliveries

// ClaimCandidates is how many due rows one claim statement looks at for limit rows.
var ClaimCandidates = claimCandidates

// QueryPurgeDeliveries is retention's statement for webhook deliveries, for plan tests.
var QueryPurgeDeliveries = dbsqlc.PurgeDeliveries

// QueryRedeliver is the redelivery statement, for tests that hold it in a transaction.
var QueryRedeliver = dbsqlc.Redeliver

// QueryClaimMerchantDeliveries is the claim merchant by merchant, for plan tests.
var QueryClaimMerchantDeliveries = queryClaimMerchantDeliveries

// ClaimMerchants is how many merchants the claim merchant by merchant looks at.
var ClaimMerchants = claimMerchants

// ClaimMerchantDeliveries runs the claim merchant by merchant from after start.
func (s *Store) ClaimMerchantDeliveries(ctx context.Context, limit, perMerchant int, lease time.Duration, merchants int, start uuid.UUID) ([]ClaimedDelivery, error) {
	return s.claimMerchantDeliveries(ctx, limit, perMerchant, lease, merchants, start)
}

// Uncommitted runs sql in a transaction of its own and leaves it open: commit ends it.
func (s *Store) Uncommitted(ctx context.Context, sql string, args ...any) (commit func() error, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return func() error { return tx.Commit(ctx) }, nil
}

// QueryOutboxAfterConfirmed is the statement that reads past a consumer's confirmed point, for
// plan tests.
var QueryOutboxAfterConfirmed = dbsqlc.OutboxAfterConfirmed

// QueryOutboxEventsInboxLacks is the webhook consumer's read of a batch's events, for plan tests.
var QueryOutboxEventsInboxLacks = dbsqlc.OutboxEventsInboxLacks

// HoldConfirmedPoint locks a consumer's confirmed point in a transaction of its own until release
// is called, as a relay checking it does.
func (s *Store) HoldConfirmedPoint(ctx context.Context, consumer string) (release func(), err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM outbox_confirmed WHERE consumer = $1 FOR UPDATE`, consumer); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return func() { _ = tx.Rollback(ctx) }, nil
}

// SetLeadIdle sets how long a leader's session may stay idle, until the returned restore.
func SetLeadIdle(d time.Duration) (restore func()) {
	old := leadIdle
	leadIdle = d
	return func() { leadIdle = old }
}

// QueryStranded is the sweeper's read of the records it takes over, for plan tests.
var QueryStranded = dbsqlc.Stranded
