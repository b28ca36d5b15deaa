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

// PolicyChangeError: the deployment's money settings on the task queue, the last a worker
// reported, are not this worker's. No worker reporting them lately does not make them another's:
// a worker may be stalled, not stopped, and come back.
type PolicyChangeError struct {
	TaskQueue        string
	Mine, Deployment WorkerPolicy
	Reported         time.Time // the deployment's settings' last report
}

func (e *PolicyChangeError) Error() string {
	return fmt.Sprintf("the deployment's money settings on task queue %q are %s (last reported %s); this worker is configured with %s, "+
		"and every worker of a deployment needs the same money settings. To change them: stop every worker, then start one with `kasa worker --change-money-settings`",
		e.TaskQueue, e.Deployment, e.Reported.UTC().Format(time.RFC3339), e.Mine)
}

// ClaimWorkerPolicy reports a starting worker's policy on its task queue, unless it is not the
// deployment's: a worker on the queue reported another within live (*PolicyConflictError), or
// the last policy reported on the queue is another (*PolicyChangeError). Then nothing is written.
// The checks and the report are one transaction under the queue's lock.
func (s *Store) ClaimWorkerPolicy(ctx context.Context, queue string, p WorkerPolicy, live time.Duration) error {
	return s.claimWorkerPolicy(ctx, queue, p, live, false)
}

// ChangeWorkerPolicy makes p the deployment's policy on the queue, unless a worker reported
// another within live (*PolicyConflictError): a worker with the old settings still runs.
func (s *Store) ChangeWorkerPolicy(ctx context.Context, queue string, p WorkerPolicy, live time.Duration) error {
	return s.claimWorkerPolicy(ctx, queue, p, live, true)
}

// claimWorkerPolicy and ReportWorkerPolicy return a refusal through their transaction: it has
// written nothing but the queue's lock, so rolling it back loses nothing.
func (s *Store) claimWorkerPolicy(ctx context.Context, queue string, p WorkerPolicy, live time.Duration, change bool) error {
	return s.tx(ctx, func(tx pgx.Tx) error {
		q := s.q.WithTx(tx)
		if err := q.LockWorkerPolicies(ctx, queue); err != nil {
			return err
		}
		o, err := q.WorkerPolicyConflict(ctx, dbsqlc.WorkerPolicyConflictParams{
			TaskQueue: queue, LiveS: live.Seconds(), Capability: p.Capability,
			BookingWindowMs: p.BookingWindow.Milliseconds(), ChargeBudgetMs: p.ChargeBudget.Milliseconds(), ChargeTimeoutMs: p.ChargeTimeout.Milliseconds(),
		})
		switch {
		case err == nil:
			return &PolicyConflictError{TaskQueue: queue, Mine: p, Other: policyOf(o.Capability, o.BookingWindowMs, o.ChargeBudgetMs, o.ChargeTimeoutMs)}
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		if !change {
			if err := newerPolicy(ctx, q, queue, p, nil); err != nil {
				return err
			}
		}
		_, err = q.SeeWorkerPolicy(ctx, seeParams(queue, p))
		return err
	})
}

// ReportWorkerPolicy reports that a worker runs with p on queue now, and answers when (by the
// database's clock), unless another policy was reported on the queue after the worker's last
// report (after; zero: none yet): the deployment's settings were changed while this worker was
// silent (*PolicyChangeError), and it must stop. Nothing is written then.
func (s *Store) ReportWorkerPolicy(ctx context.Context, queue string, p WorkerPolicy, after time.Time) (seen time.Time, err error) {
	err = s.tx(ctx, func(tx pgx.Tx) error {
		q := s.q.WithTx(tx)
		if err := q.LockWorkerPolicies(ctx, queue); err != nil {
			return err
		}
		if !after.IsZero() {
			if err := newerPolicy(ctx, q, queue, p, &after); err != nil {
				return err
			}
		}
		seen, err = q.SeeWorkerPolicy(ctx, seeParams(queue, p))
		return err
	})
	return seen, err
}

// newerPolicy is a *PolicyChangeError naming the latest policy other than p reported on the
// queue after after (nil: after p's own last report, or ever), nil if there is none, or the
// read's error.
func newerPolicy(ctx context.Context, q *dbsqlc.Queries, queue string, p WorkerPolicy, after *time.Time) error {
	o, err := q.WorkerPolicySince(ctx, dbsqlc.WorkerPolicySinceParams{
		TaskQueue: queue, Capability: p.Capability, After: after,
		BookingWindowMs: p.BookingWindow.Milliseconds(), ChargeBudgetMs: p.ChargeBudget.Milliseconds(), ChargeTimeoutMs: p.ChargeTimeout.Milliseconds(),
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	return &PolicyChangeError{TaskQueue: queue, Mine: p, Deployment: policyOf(o.Capability, o.BookingWindowMs, o.ChargeBudgetMs, o.ChargeTimeoutMs),
		Reported: o.LastSeen}
}

func policyOf(capability string, bookingMS, budgetMS, timeoutMS int64) WorkerPolicy {
	return WorkerPolicy{Capability: capability, BookingWindow: time.Duration(bookingMS) * time.Millisecond,
		ChargeBudget: time.Duration(budgetMS) * time.Millisecond, ChargeTimeout: time.Duration(timeoutMS) * time.Millisecond}
}

func seeParams(queue string, p WorkerPolicy) dbsqlc.SeeWorkerPolicyParams {
	return dbsqlc.SeeWorkerPolicyParams{
		TaskQueue: queue, Capability: p.Capability,
		BookingWindowMs: p.BookingWindow.Milliseconds(), ChargeBudgetMs: p.ChargeBudget.Milliseconds(), ChargeTimeoutMs: p.ChargeTimeout.Milliseconds(),
	}
}

// LongestBookingWindow is the longest booking window any worker reported within the last since
// (0 when none did), by the database's clock: the caller's host clock may be minutes off it.
func (s *Store) LongestBookingWindow(ctx context.Context, since time.Duration) (time.Duration, error) {
	ms, err := s.q.LongestBookingWindowMS(ctx, since.Seconds())
	return time.Duration(ms) * time.Millisecond, translate(err)
}
