package workflows_test

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/workflows"
)

var recordRefunds = flag.Bool("record", false, "write the refund workflow histories to testdata/")

// fakeRefundSteps stands in for the refund activities on a real worker: the database steps
// succeed, and the bank's answer to a send is scripted.
type fakeRefundSteps struct {
	send   func(workflows.SendRefundInput) (workflows.RefundSendResult, error)
	policy workflows.ChargePolicy // the worker's, which the workflow asks for

	mu    sync.Mutex
	calls map[string]int
}

func (f *fakeRefundSteps) count(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
}

func (f *fakeRefundSteps) counts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.calls {
		out[k] = v
	}
	return out
}

func (f *fakeRefundSteps) register(w worker.Worker) {
	step := func(name string) func(context.Context, uuid.UUID) error {
		return func(context.Context, uuid.UUID) error { f.count(name); return nil }
	}
	reg := func(fn any, name string) { w.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name}) }
	reg(func(context.Context) (workflows.ChargePolicy, error) {
		f.count(workflows.ActivityChargePolicy)
		return f.policy, nil
	}, workflows.ActivityChargePolicy)
	reg(step(workflows.ActivityHoldRefund), workflows.ActivityHoldRefund)
	reg(step(workflows.ActivityHoldRefundForRun), workflows.ActivityHoldRefundForRun)
	reg(step(workflows.ActivityMarkRefundUnknown), workflows.ActivityMarkRefundUnknown)
	reg(func(_ context.Context, in workflows.SendRefundInput) (workflows.RefundSendResult, error) {
		f.count(workflows.ActivitySendRefund)
		return f.send(in)
	}, workflows.ActivitySendRefund)
	reg(func(context.Context, uuid.UUID) (workflows.RefundSendResult, error) {
		f.count(workflows.ActivityInquireRefund)
		return workflows.RefundSendResult{}, notFound()
	}, workflows.ActivityInquireRefund)
	reg(func(context.Context, workflows.PostRefundInput) error {
		f.count(workflows.ActivityPostRefund)
		return nil
	}, workflows.ActivityPostRefund)
	reg(func(context.Context, workflows.ReleaseRefundInput) error {
		f.count(workflows.ActivityReleaseRefund)
		return nil
	}, workflows.ActivityReleaseRefund)
	reg(func(context.Context, workflows.FlagInput) error {
		f.count(workflows.ActivityFlagRefundStuck)
		return nil
	}, workflows.ActivityFlagRefundStuck)
}

// TestRefundOnTemporal runs refunds through a Temporal dev server with the Starter the API uses:
// a second start of a key finds the first run, a refund the bank answered is posted, and an
// unknown one is settled through the checked update the reconciliation tool sends. Every history
// replays against the current code; with -record they are stored in testdata/, where
// TestReplayRecordedHistories replays them on every run.
func TestRefundOnTemporal(t *testing.T) {
	ctx := context.Background()
	c := devTemporal(t)

	cases := []struct {
		name       string
		capability workflows.Capability
		send       func(workflows.SendRefundInput) (workflows.RefundSendResult, error)
		settle     bool // the refund ends unknown and is settled as refunded
		want       workflows.RefundWorkflowResult
		calls      map[string]int
	}{
		{
			name: "succeeded", capability: workflows.CapabilityIdempotent,
			send: func(in workflows.SendRefundInput) (workflows.RefundSendResult, error) {
				return workflows.RefundSendResult{ProviderReference: "rf_" + in.OperationID.String()[:8], Succeeded: true}, nil
			},
			want: workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_" + refundID.String()[:8]},
			calls: map[string]int{
				workflows.ActivityChargePolicy: 1, workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 1, workflows.ActivityPostRefund: 1,
			},
		},
		{
			name: "unknown_settled", capability: workflows.CapabilityNone,
			send: func(workflows.SendRefundInput) (workflows.RefundSendResult, error) {
				return workflows.RefundSendResult{}, ambiguous()
			},
			settle: true,
			want:   workflows.RefundWorkflowResult{Status: statusSucceeded, ProviderReference: "rf_file"},
			calls: map[string]int{
				workflows.ActivityChargePolicy: 1, workflows.ActivityHoldRefundForRun: 1, workflows.ActivitySendRefund: 1, workflows.ActivityMarkRefundUnknown: 1,
				workflows.ActivityPostRefund: 1,
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			queue := "refunds-" + uuid.NewString()
			fake := &fakeRefundSteps{send: tc.send, policy: workflows.ChargePolicy{Capability: tc.capability}, calls: map[string]int{}}
			w := worker.New(c, queue, worker.Options{})
			w.RegisterWorkflowWithOptions(workflows.RefundWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowRefund})
			fake.register(w)
			require.NoError(t, w.Start())
			t.Cleanup(w.Stop)

			starter := workflows.Starter{Client: c, TaskQueue: queue}
			merchant := uuid.New()
			in := workflows.RefundInputFor(payment.Refund{
				ID: refundID, PaymentID: paymentID, MerchantID: merchant, AmountMinor: 4_000, Currency: "TRY",
			}) // as the API starts it: the worker's policy governs
			key := "rf-" + tc.name
			runID, err := starter.StartRefund(ctx, key, in)
			require.NoError(t, err)
			again, err := starter.StartRefund(ctx, key, in)
			require.NoError(t, err)
			require.Equal(t, runID, again, "a second start of the key finds the first run")
			id := workflows.RefundWorkflowID(merchant, key)

			if tc.settle {
				require.Eventually(t, func() bool { return queryStatus(ctx, c, id) == statusUnknown }, 20*time.Second, 50*time.Millisecond)
				_, err := starter.Settle(ctx, id, workflows.Settlement{Outcome: "refunded"})
				require.ErrorIs(t, err, workflows.ErrSettlementRejected)
				status, err := starter.Settle(ctx, id, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "rf_file"})
				require.NoError(t, err)
				require.Equal(t, statusSucceeded, status)
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			res, err := starter.AwaitRefund(wctx, merchant, key, runID)
			require.NoError(t, err)
			require.Equal(t, tc.want, res)
			require.Equal(t, tc.calls, fake.counts())

			_, err = starter.Settle(ctx, id, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
			require.ErrorIs(t, err, workflows.ErrSettlementRejected, "a finished refund is never settled again")

			hist := refundHistory(t, ctx, c, id)
			replayer := worker.NewWorkflowReplayer()
			replayer.RegisterWorkflowWithOptions(workflows.RefundWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowRefund})
			require.NoError(t, replayer.ReplayWorkflowHistory(nil, hist))
			if *recordRefunds {
				b, err := protojson.MarshalOptions{Indent: "  "}.Marshal(hist)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(filepath.Join("testdata", "refund_"+tc.name+".json"), b, 0o644))
			}
		})
	}
}

// devTemporal starts a Temporal dev server for the test and dials it.
func devTemporal(t *testing.T) client.Client {
	t.Helper()
	srv, err := devenv.StartTemporal(context.Background(), devenv.TemporalOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	c, err := client.Dial(client.Options{HostPort: srv.Address, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

func queryStatus(ctx context.Context, c client.Client, id string) string {
	v, err := c.QueryWorkflow(ctx, id, "", workflows.QueryStatus)
	if err != nil {
		return ""
	}
	var s string
	_ = v.Get(&s)
	return s
}

func refundHistory(t *testing.T, ctx context.Context, c client.Client, id string) *historypb.History {
	t.Helper()
	it := c.GetWorkflowHistory(ctx, id, "", false, 0)
	var h historypb.History
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		h.Events = append(h.Events, ev)
	}
	require.NotEmpty(t, h.Events)
	return &h
}

func quietLogger() log.Logger { return log.NewStructuredLogger(slog.New(slog.DiscardHandler)) }
