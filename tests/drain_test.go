package tests

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/worker"
)

// A worker told to stop (kasa worker on SIGTERM) lets its in-flight activities finish, a bank
// call among them, rather than cancel them mid-call (docs/deployment.md, upgrades).
func TestWorkerStopDrainsInFlightActivities(t *testing.T) {
	queue := "drain-" + payment.NewID().String()
	started, finished := make(chan struct{}), make(chan error, 1)
	slow := func(ctx context.Context) error {
		close(started)
		select {
		case <-time.After(2 * time.Second):
			finished <- nil
			return nil
		case <-ctx.Done():
			finished <- ctx.Err()
			return ctx.Err()
		}
	}
	w := worker.New(tc, queue, &activities.Activities{}, nil)
	w.RegisterWorkflowWithOptions(func(ctx workflow.Context) error {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
		return workflow.ExecuteActivity(ctx, "Slow").Get(ctx, nil)
	}, workflow.RegisterOptions{Name: "Drain"})
	w.RegisterActivityWithOptions(slow, activity.RegisterOptions{Name: "Slow"})
	require.NoError(t, w.Start())
	_, err := tc.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{TaskQueue: queue}, "Drain")
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the activity never started")
	}
	w.Stop()
	select {
	case err := <-finished:
		require.NoError(t, err, "the in-flight activity was canceled by the stop, not drained")
	case <-time.After(10 * time.Second):
		t.Fatal("the activity neither finished nor was canceled")
	}
}
