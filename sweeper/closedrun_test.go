package sweeper_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/sweeper"
	"github.com/kasa-pay/kasa/workflows"
)

// unqueueFails is the store, but its first Unqueue fails (the database away for a moment).
type unqueueFails struct {
	*store.Store
	calls atomic.Int32
}

func (s *unqueueFails) Unqueue(ctx context.Context, ids []uuid.UUID) error {
	if s.calls.Add(1) == 1 {
		return errors.New("connection reset by peer")
	}
	return s.Store.Unqueue(ctx, ids)
}

// A payment whose run closed before its first step (an operator terminated it) while the
// drainer held it, and whose handing to the sweeper then failed, stays queued: the drainer
// claims it again once its lease ran out. That start finds the operation's closed run and starts
// nothing (REJECT_DUPLICATE, the same operation id); a lease later the drainer reads the run
// closed again and hands the payment to the sweeper, which marks it started for the operators'
// stuck list. On real PostgreSQL and Temporal: one run of the operation, never a second.
func TestDrainerWhoseUnqueueOfAClosedRunFailed(t *testing.T) {
	ctx := context.Background()
	queueName := "closed-unqueue-" + uuid.NewString()
	// A worker whose payment workflow never takes its first step: the payment stays queued.
	w := sdkworker.New(temporalClient, queueName, sdkworker.Options{})
	w.RegisterWorkflowWithOptions(func(ctx workflow.Context, _ workflows.PaymentInput) error {
		return workflow.Await(ctx, func() bool { return false })
	}, workflow.RegisterOptions{Name: workflows.WorkflowPayment})
	require.NoError(t, w.Start())
	defer w.Stop()
	starter := workflows.Starter{Client: temporalClient, TaskQueue: queueName}

	m := orderMerchant(t, "closed-unqueue")
	key := queue(t, m, "closed-unqueue", 1)[0]
	st := &unqueueFails{Store: db}
	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&sweeper.Drainer{Store: st, Starter: starter, MaxRunning: 2, Lease: 500 * time.Millisecond}).Run(dctx)
	}()
	defer func() { stop(); <-done }()

	id := workflows.PaymentWorkflowID(m.ID, key)
	latest := func() (runID string, status enumspb.WorkflowExecutionStatus, err error) {
		desc, err := temporalClient.DescribeWorkflow(ctx, id, "")
		if err != nil {
			return "", 0, err
		}
		info := desc.RawResponse.GetWorkflowExecutionInfo()
		return info.GetExecution().GetRunId(), info.GetStatus(), nil
	}
	var runID string
	require.Eventually(t, func() bool {
		var err error
		runID, _, err = latest()
		return err == nil
	}, 20*time.Second, 20*time.Millisecond, "the drainer starts the payment's run")
	require.NoError(t, temporalClient.TerminateWorkflow(ctx, id, runID, "an operator ends it before its first step"))

	require.Eventually(t, func() bool {
		rec, err := db.Record(ctx, m.ID, key)
		return err == nil && !rec.Queued && st.calls.Load() >= 2
	}, 20*time.Second, 20*time.Millisecond, "handed to the sweeper once the second Unqueue works")
	stop()
	<-done
	require.EqualValues(t, 2, st.calls.Load(), "the failed Unqueue, then the one a lease after the claim again")
	run, status, err := latest()
	require.NoError(t, err)
	require.Equal(t, runID, run, "no second run of the operation")
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED, status)

	// The sweeper starts nothing either: it marks the payment started, for the stuck list.
	sw := &sweeper.Sweeper{Store: db, Starter: starter, Lease: time.Minute, Merchant: &m.ID}
	n, err := sw.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "no run started")
	rec, err := db.Record(ctx, m.ID, key)
	require.NoError(t, err)
	require.True(t, rec.WorkflowStarted)
	run, _, err = latest()
	require.NoError(t, err)
	require.Equal(t, runID, run, "still the one run")
	p, err := db.PaymentByKey(ctx, m.ID, key)
	require.NoError(t, err)
	require.Equal(t, "processing", string(p.Status), "its outcome waits for an operator, not guessed")
}
