package workflows_test

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/workflows"
)

// recordHint says how to (re)create the recorded histories this test replays.
const recordHint = "record them against a Temporal dev server with: go test ./tests -run TestRecordHistories -record " +
	"(payments) or go test ./workflows -run TestRefundOnTemporal -args -record (refunds)"

// TestReplayRecordedHistories replays every recorded payment and refund workflow history in
// testdata/ against the current workflow code. A failure means a change to the workflow is not deterministic
// for payments already in flight: give the new rule a Revision (workflows.CurrentRevision) and
// keep the old path for inputs of earlier revisions (docs/development.md).
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no workflow histories in workflows/testdata/*.json; %s", recordHint)

	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			replayer := worker.NewWorkflowReplayer()
			replayer.RegisterWorkflowWithOptions(workflows.PaymentWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowPayment})
			replayer.RegisterWorkflowWithOptions(workflows.RefundWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowRefund})
			logger := log.NewStructuredLogger(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
			require.NoError(t, replayer.ReplayWorkflowHistoryFromJSONFile(logger, file),
				"replaying %s: the workflow code no longer matches this recorded history (if the history itself is stale, %s)",
				file, recordHint)
		})
	}
}

// testWriter sends the replayer's log lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}
