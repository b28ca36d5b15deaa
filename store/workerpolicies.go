package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// WorkerPolicy is a worker's charge policy: the settings that decide how money moves.
type WorkerPolicy struct {
	Capability    string
	BookingWindow time.Duration
	ChargeBudget  time.Duration
	ChargeTimeout time.Duration
}

func (p WorkerPolicy) String() string {
	return fmt.Sprintf("capability %s, booking window %s, charge budget %s, charge timeout %s",
		p.Capability, p.BookingWindow, p.ChargeBudget, p.ChargeTimeout)
}

// PolicyConflictError: another worker on the task queue runs with other money settings.
type PolicyConflictError struct {
	TaskQueue   string
	Mine, Other WorkerPolicy
}

func (e *PolicyConflictError) Error() string {
	return fmt.Sprintf("a worker on task queue %q runs with %s; this one is configured with %s: "+
		"every worker of a deployment needs the same money settings (stop the others first, then wait a minute)",
		e.TaskQueue, e.Other, e.Mine)
}

// ClaimWorkerPolicy reports a starting worker's policy on its task queue, unless a worker on the
// queue reported another within live: then it is a *PolicyConflictError and nothing is written.
// The check and the report are one transaction under the queue's lock.
func (s *Store) ClaimWorkerPolicy(ctx context.Context, queue string, p WorkerPolicy, live time.Duration) error {
	var conflict *PolicyConflictError
	err := s.tx(ctx, func(tx pgx.Tx) error {
		q := s.q.WithTx(tx)
		if err := q.LockWorkerPolicies(ctx, queue); err != nil {
			return err
		}
		o, err := q.WorkerPolicyConflict(ctx, dbsqlc.WorkerPolicyConflictParams{
			TaskQueue: queue, Since: time.Now().Add(-live), Capability: p.Capability,
			BookingWindowMs: p.BookingWindow.Milliseconds(), ChargeBudgetMs: p.ChargeBudget.Milliseconds(), ChargeTimeoutMs: p.ChargeTimeout.Milliseconds(),
		})
		switch {
		case err == nil:
			conflict = &PolicyConflictError{TaskQueue: queue, Mine: p, Other: WorkerPolicy{
				Capability: o.Capability, BookingWindow: time.Duration(o.BookingWindowMs) * time.Millisecond,
				ChargeBudget: time.Duration(o.ChargeBudgetMs) * time.Millisecond, ChargeTimeout: time.Duration(o.ChargeTimeoutMs) * time.Millisecond,
			}}
			return nil
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		return q.SeeWorkerPolicy(ctx, seeParams(queue, p))
	})
	if err != nil {
		return err
	}
	if conflict != nil {
		return conflict
	}
	return nil
}

// SeeWorkerPolicy reports that a worker runs with p on queue now.
func (s *Store) SeeWorkerPolicy(ctx context.Context, queue string, p WorkerPolicy) error {
	return translate(s.q.SeeWorkerPolicy(ctx, seeParams(queue, p)))
}

func seeParams(queue string, p WorkerPolicy) dbsqlc.SeeWorkerPolicyParams {
	return dbsqlc.SeeWorkerPolicyParams{
		TaskQueue: queue, Capability: p.Capability,
		BookingWindowMs: p.BookingWindow.Milliseconds(), ChargeBudgetMs: p.ChargeBudget.Milliseconds(), ChargeTimeoutMs: p.ChargeTimeout.Milliseconds(),
	}
}

// LongestBookingWindow is the longest booking window any worker reported within the last since
// (0 when none did).
func (s *Store) LongestBookingWindow(ctx context.Context, since time.Duration) (time.Duration, error) {
	ms, err := s.q.LongestBookingWindowMS(ctx, time.Now().Add(-since))
	return time.Duration(ms) * time.Millisecond, translate(err)
}
