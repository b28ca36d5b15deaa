// Package sweeper completes operations nobody retries: a record committed by an API process that
// died (or lost Temporal) before starting the workflow is taken over once its lease expires, and
// its workflow started. The workflow id deduplicates, so a start that did happen is not repeated.
// A payment's record is left for its run's first step to mark started: until then it is taken
// over again every lease, and a run that waits where no worker polls is moved (startPayment).
package sweeper

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// Store is what the sweeper reads and claims.
type Store interface {
	Stranded(ctx context.Context, limit int, merchant *uuid.UUID) ([]store.Record, error)
	TakeOver(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error)
	PaymentByKey(ctx context.Context, merchantID uuid.UUID, key string) (payment.Payment, error)
	TakeOverRefund(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error)
	RefundByKey(ctx context.Context, merchantID uuid.UUID, key string) (payment.Refund, error)
	WorkflowStarted(ctx context.Context, operationID uuid.UUID) error
	ExpireLease(ctx context.Context, operationID uuid.UUID) error
}

// Starter starts payment and refund workflows.
type Starter interface {
	StartPayment(ctx context.Context, key string, in workflows.PaymentInput) (runID string, err error)
	StartRefund(ctx context.Context, key string, in workflows.RefundInput) (runID string, err error)
}

// readier is a starter that can tell whether a worker polls the task queue it starts on
// (workflows.Starter does). The sweeper and the drainer start nothing while it says no: a
// process whose task queue or namespace is not the workers' (its /readyz says so, and a load
// balancer sends it nothing) would start the operations other processes accepted where no
// worker runs them, and they would stay processing, their workflows started.
type readier interface {
	Ready(ctx context.Context) error
}

// ready is the starter's answer, or nil when it cannot tell.
func ready(ctx context.Context, st any) error {
	if r, ok := st.(readier); ok {
		return r.Ready(ctx)
	}
	return nil
}

// Sweeper periodically starts stranded operations.
type Sweeper struct {
	Store    Store
	Starter  Starter
	Interval time.Duration // default 5s
	Lease    time.Duration // default 30s
	Logger   *slog.Logger
	Merchant *uuid.UUID // sweep only this merchant's keys (tests, per-merchant operations); nil: all
}

// Run sweeps until ctx ends.
func (s *Sweeper) Run(ctx context.Context) {
	if s.Interval == 0 {
		s.Interval = 5 * time.Second
	}
	if s.Lease == 0 {
		s.Lease = 30 * time.Second
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		if n, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.Logger.Warn("sweep", "error", err)
		} else if n > 0 {
			s.Logger.Info("started stranded operations", "count", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sweep starts every stranded operation it can claim and returns how many it started.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	recs, err := s.Store.Stranded(ctx, 100, s.Merchant)
	if err != nil || len(recs) == 0 {
		return 0, err
	}
	if err := ready(ctx, s.Starter); err != nil {
		return 0, fmt.Errorf("%d stranded operation(s) left to another process: %w", len(recs), err)
	}
	started := 0
	for _, r := range recs {
		ok, err := s.start(ctx, r)
		if err != nil {
			return started, err
		}
		if ok {
			started++
		}
	}
	return started, nil
}

// start takes the record over and starts its operation's workflow, in the record's key space:
// a merchant's payment and refund may share a key. false: someone else took it first.
func (s *Sweeper) start(ctx context.Context, r store.Record) (bool, error) {
	var (
		won   bool
		id    uuid.UUID
		begin func() error
		err   error
	)
	if r.Scope == store.ScopeRefund {
		if won, err = s.takeOver(ctx, r, s.Store.TakeOverRefund); err != nil || !won {
			return false, err // a retrying client or another sweeper got it
		}
		rf, err := s.Store.RefundByKey(ctx, r.MerchantID, r.Key)
		if err != nil {
			return false, err
		}
		if m, ok := s.Starter.(refundMover); ok {
			in := workflows.RefundInputFor(rf)
			return s.startRun(ctx, "refund", rf.ID,
				func() (bool, error) { _, created, err := m.StartRefundRun(ctx, r.Key, in); return created, err },
				func() (workflows.RunState, error) { return m.CheckRefundRun(ctx, r.Key, in) })
		}
		id = rf.ID
		begin = func() error {
			_, err := s.Starter.StartRefund(ctx, r.Key, workflows.RefundInputFor(rf))
			return err
		}
	} else {
		if won, err = s.takeOver(ctx, r, s.Store.TakeOver); err != nil || !won {
			return false, err
		}
		p, err := s.Store.PaymentByKey(ctx, r.MerchantID, r.Key)
		if err != nil {
			return false, err
		}
		if m, ok := s.Starter.(runMover); ok {
			in := workflows.InputFor(p)
			return s.startRun(ctx, "payment", p.ID,
				func() (bool, error) { _, created, err := m.StartPaymentRun(ctx, r.Key, in); return created, err },
				func() (workflows.RunState, error) { return m.CheckPaymentRun(ctx, r.Key, in) })
		}
		id = p.ID
		begin = func() error {
			_, err := s.Starter.StartPayment(ctx, r.Key, workflows.InputFor(p))
			return err
		}
	}
	if err := begin(); err != nil {
		_ = s.Store.ExpireLease(context.WithoutCancel(ctx), id)
		return false, err
	}
	return true, s.Store.WorkflowStarted(ctx, id)
}

// runMover is a starter that says whether a start made the payment's run, and reads the run,
// moving it here when it waits where no worker polls (workflows.Starter can); refundMover, the
// same for refunds.
type runMover interface {
	creator
	CheckPaymentRun(ctx context.Context, key string, in workflows.PaymentInput) (workflows.RunState, error)
}

type refundMover interface {
	StartRefundRun(ctx context.Context, key string, in workflows.RefundInput) (runID string, created bool, err error)
	CheckRefundRun(ctx context.Context, key string, in workflows.RefundInput) (workflows.RunState, error)
}

// startRun starts a stranded operation's run (start), or finds the one its API (or an earlier
// sweep) started. While that run is open, the record is left for the run's first step to mark
// started (the reserve, or the refund's hold, does), and the sweeper takes it over again every
// lease until then: a run started on a task queue the workers were leaving (a poller counts as
// fresh for two minutes) would wait there for ever, and once no worker polls that queue, the
// run, never having taken a step, is moved to this sweeper's (check). A closed run takes no step:
// its operation is marked started, for the operators' stuck list. true: it started a run, here
// or by a move.
// takeOver takes record r over with take. A takeover commits in the database even when a stop
// gives up on its answer: it is read whatever the stop, and one a stopping sweeper won is given
// back at once (its lease expired), for the client's retry or another sweeper, rather than left
// leased to no one.
func (s *Sweeper) takeOver(ctx context.Context, r store.Record, take func(context.Context, uuid.UUID, string, time.Duration) (bool, error)) (bool, error) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), takeOverTimeout)
	defer cancel()
	won, err := take(tctx, r.MerchantID, r.Key, s.Lease)
	if err != nil || !won || ctx.Err() == nil {
		return won, err
	}
	if err := s.Store.ExpireLease(tctx, r.OperationID); err != nil {
		return false, err
	}
	return false, ctx.Err()
}

// takeOverTimeout bounds a takeover, which a stop lets finish.
const takeOverTimeout = 10 * time.Second

func (s *Sweeper) startRun(ctx context.Context, noun string, id uuid.UUID, start func() (bool, error), check func() (workflows.RunState, error)) (bool, error) {
	created, err := start()
	switch {
	case err != nil:
		_ = s.Store.ExpireLease(context.WithoutCancel(ctx), id)
		return false, err
	case created:
		return true, nil
	}
	switch state, err := check(); {
	case err != nil:
		return false, err
	case state == workflows.RunMoved:
		s.logger().Warn("sweeper: a "+noun+"'s run waited on a task queue no worker polls; started it again here", "operation_id", id)
		return true, nil
	case state == workflows.RunClosed:
		return false, s.Store.WorkflowStarted(ctx, id)
	}
	return false, nil
}

func (s *Sweeper) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.Default()
	}
	return s.Logger
}
