package workflows_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// A key whose record expired names a new operation while the earlier operation's run is still
// open: the start never hands back that run (the new operation would wait on another's result and
// stay processing for good); it waits for it to close, then starts the new operation's run.
func TestStartWaitsForAnEarlierOperationsOpenRun(t *testing.T) {
	ctx := context.Background()
	c := devTemporal(t)

	release := make(chan struct{})
	fake := &fakeRefundSteps{calls: map[string]int{}, policy: workflows.ChargePolicy{Capability: workflows.CapabilityIdempotent},
		send: func(in workflows.SendRefundInput) (workflows.RefundSendResult, error) {
			if in.AmountMinor == 1_000 { // the earlier operation: its bank call hangs until released
				<-release
			}
			return workflows.RefundSendResult{ProviderReference: "rf_" + in.OperationID.String()[:8], Succeeded: true}, nil
		}}
	queue := "start-" + uuid.NewString()
	w := worker.New(c, queue, worker.Options{})
	w.RegisterWorkflowWithOptions(workflows.RefundWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowRefund})
	fake.register(w)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	starter := workflows.Starter{Client: c, TaskQueue: queue}
	merchant := uuid.New()
	earlier := workflows.RefundInputFor(payment.Refund{ID: payment.NewID(), PaymentID: paymentID, MerchantID: merchant, AmountMinor: 1_000, Currency: "TRY"})
	later := workflows.RefundInputFor(payment.Refund{ID: payment.NewID(), PaymentID: paymentID, MerchantID: merchant, AmountMinor: 2_000, Currency: "TRY"})

	firstRun, err := starter.StartRefund(ctx, "k", earlier)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return fake.counts()[workflows.ActivitySendRefund] > 0 }, 20*time.Second, 20*time.Millisecond)

	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	run, err := starter.StartRefund(short, "k", later)
	cancel()
	require.Error(t, err, "started as run %s", run)
	require.NotEqual(t, firstRun, run, "never the earlier operation's run")

	close(release)
	run, err = starter.StartRefund(ctx, "k", later)
	require.NoError(t, err)
	require.NotEqual(t, firstRun, run)
	res, err := starter.AwaitRefund(ctx, merchant, "k", run)
	require.NoError(t, err)
	require.Equal(t, "rf_"+later.OperationID.String()[:8], res.ProviderReference, "the later operation ran")
	again, err := starter.StartRefund(ctx, "k", later)
	require.NoError(t, err)
	require.Equal(t, run, again, "a retried start of the later operation finds its run")
}

// CheckPaymentRun reads the payment's latest run: open while it waits on the starter's own queue
// (no worker polls it here), closed once terminated, and closed when there is none.
func TestPaymentRunClosed(t *testing.T) {
	ctx := context.Background()
	c := devTemporal(t)
	starter := workflows.Starter{Client: c, TaskQueue: "closed-" + uuid.NewString()}
	merchant := uuid.New()
	in := workflows.InputFor(payment.Payment{ID: payment.NewID(), MerchantID: merchant, AmountMinor: 1_000, Currency: "TRY"})
	_, err := starter.StartPayment(ctx, "k", in)
	require.NoError(t, err)

	state, err := starter.CheckPaymentRun(ctx, "k", in)
	require.NoError(t, err)
	require.Equal(t, workflows.RunOpen, state, "started, not yet run")
	require.NoError(t, c.TerminateWorkflow(ctx, workflows.PaymentWorkflowID(merchant, "k"), "", "test: an operator's terminate"))
	state, err = starter.CheckPaymentRun(ctx, "k", in)
	require.NoError(t, err)
	require.Equal(t, workflows.RunClosed, state, "terminated")
	state, err = starter.CheckPaymentRun(ctx, "never-started", in)
	require.NoError(t, err)
	require.Equal(t, workflows.RunClosed, state, "no run at all")
}

// Two starters of the key's new operation (an API's retry and the sweeper, say) both wait for
// the earlier operation's run to close; the one that starts second finds the first one's run
// of the same operation and hands it back, never an error that would leave the request unanswered.
func TestConcurrentStartsAfterAnEarlierOperationsRunFindOneRun(t *testing.T) {
	ctx := context.Background()
	c := devTemporal(t)
	starter := workflows.Starter{Client: c, TaskQueue: "concurrent-" + uuid.NewString()} // no worker: runs stay open
	merchant := uuid.New()
	earlier := workflows.InputFor(payment.Payment{ID: payment.NewID(), MerchantID: merchant, AmountMinor: 1_000, Currency: "TRY"})
	later := workflows.InputFor(payment.Payment{ID: payment.NewID(), MerchantID: merchant, AmountMinor: 2_000, Currency: "TRY"})
	earlierRun, err := starter.StartPayment(ctx, "k", earlier)
	require.NoError(t, err)

	type started struct {
		run string
		err error
	}
	results := make(chan started, 2)
	for range 2 {
		go func() {
			run, err := starter.StartPayment(ctx, "k", later)
			results <- started{run, err}
		}()
	}
	time.Sleep(time.Second) // both wait for the earlier run
	require.NoError(t, c.TerminateWorkflow(ctx, workflows.PaymentWorkflowID(merchant, "k"), earlierRun, "test: the earlier operation ends"))
	a, b := <-results, <-results
	require.NoError(t, a.err)
	require.NoError(t, b.err)
	require.Equal(t, a.run, b.run, "one run of the later operation")
	require.NotEqual(t, earlierRun, a.run)
}

// A start says whether it made the run: the drainer counts only those in its drain rate. A
// repeated start of the operation finds its run (open or closed) and made nothing; the key's new
// operation, once the earlier one's run closed, gets a run of its own.
func TestStartPaymentRunSaysWhetherItMadeTheRun(t *testing.T) {
	ctx := context.Background()
	c := devTemporal(t)
	starter := workflows.Starter{Client: c, TaskQueue: "created-" + uuid.NewString()} // no worker: runs stay open
	merchant := uuid.New()
	earlier := workflows.InputFor(payment.Payment{ID: payment.NewID(), MerchantID: merchant, AmountMinor: 1_000, Currency: "TRY"})
	later := workflows.InputFor(payment.Payment{ID: payment.NewID(), MerchantID: merchant, AmountMinor: 2_000, Currency: "TRY"})

	first, created, err := starter.StartPaymentRun(ctx, "k", earlier)
	require.NoError(t, err)
	require.True(t, created, "the first start")
	again, created, err := starter.StartPaymentRun(ctx, "k", earlier)
	require.NoError(t, err)
	require.False(t, created, "a repeated start, the run open")
	require.Equal(t, first, again)
	require.NoError(t, c.TerminateWorkflow(ctx, workflows.PaymentWorkflowID(merchant, "k"), first, "test: the earlier operation ends"))
	again, created, err = starter.StartPaymentRun(ctx, "k", earlier)
	require.NoError(t, err)
	require.False(t, created, "a repeated start, the run closed")
	require.Equal(t, first, again)

	run, created, err := starter.StartPaymentRun(ctx, "k", later)
	require.NoError(t, err)
	require.True(t, created, "the key's new operation")
	require.NotEqual(t, first, run)
	again, created, err = starter.StartPaymentRun(ctx, "k", later)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, run, again)
}

// A capture or settlement that reaches a run before its first workflow task registered the
// handlers (a run just started, reset or moved: the task first reads its worker's policy) is
// refused by the SDK as an unknown update, which takes nothing: it is sent again until the run
// takes it, not answered with the SDK's words.
func TestUpdatesBeforeTheHandlersAreRegisteredAreSentAgain(t *testing.T) {
	ctx := context.Background()
	c := devTemporal(t)
	queue := "handlers-" + uuid.NewString()
	w := worker.New(c, queue, worker.Options{})
	late := func(ctx workflow.Context, _ workflows.PaymentInput) (string, error) {
		if err := workflow.Sleep(ctx, 500*time.Millisecond); err != nil { // as a first local step would block
			return "", err
		}
		done := false
		answer := func(workflow.Context, any) (string, error) { done = true; return "succeeded", nil }
		for _, name := range []string{workflows.UpdateCapture, workflows.UpdateSettle} {
			if err := workflow.SetUpdateHandler(ctx, name, answer); err != nil {
				return "", err
			}
		}
		return "succeeded", workflow.Await(ctx, func() bool { return done })
	}
	w.RegisterWorkflowWithOptions(late, workflow.RegisterOptions{Name: workflows.WorkflowPayment})
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	starter := workflows.Starter{Client: c, TaskQueue: queue}

	for _, update := range []string{workflows.UpdateCapture, workflows.UpdateSettle} {
		t.Run(update, func(t *testing.T) {
			merchant := uuid.New()
			in := workflows.InputFor(payment.Payment{ID: payment.NewID(), MerchantID: merchant, AmountMinor: 1_000, Currency: "TRY"})
			_, err := starter.StartPayment(ctx, "k", in)
			require.NoError(t, err)
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			var status string
			if update == workflows.UpdateCapture {
				status, err = starter.Command(wctx, merchant, "k", update, workflows.Command{ID: uuid.New()})
			} else {
				status, err = starter.Settle(wctx, workflows.PaymentWorkflowID(merchant, "k"), workflows.Settlement{Outcome: workflows.OutcomeCharged})
			}
			require.NoError(t, err)
			require.Equal(t, "succeeded", status)
		})
	}
}
