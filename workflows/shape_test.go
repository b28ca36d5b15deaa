package workflows_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/workflows"
)

// PaymentShape, which the benchmark's Temporal ceiling copies, is the shape a succeeded payment
// really has in its recorded history (payments from before changeLocalSteps had three regular
// activities).
func TestPaymentShapeMatchesARecordedPayment(t *testing.T) {
	steps := workflows.Shape{Steps: workflows.PaymentShape.Steps}.String()
	for file, want := range map[string]string{"payment_succeeded.json": steps, "payment_succeeded_regular_steps.json": "RRR"} {
		b, err := os.ReadFile(filepath.Join("testdata", file))
		require.NoError(t, err)
		h, err := client.HistoryFromJSON(bytes.NewReader(b), client.HistoryJSONOptions{})
		require.NoError(t, err)
		require.Equal(t, want, shapeOf(h), file)
	}
	require.Equal(t, "LLL+eager", workflows.LeanestShape.String())
	require.Equal(t, "LLL+eager+search-attributes", workflows.PaymentShape.String())
}

func shapeOf(h *historypb.History) string {
	s := ""
	for _, e := range h.GetEvents() {
		switch e.GetEventType() {
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			s += string(workflows.StepRegular)
		case enumspb.EVENT_TYPE_MARKER_RECORDED:
			if e.GetMarkerRecordedEventAttributes().GetMarkerName() == "LocalActivity" {
				s += string(workflows.StepLocal)
			}
		}
	}
	return s
}

func TestParseShape(t *testing.T) {
	for _, sh := range []workflows.Shape{workflows.PaymentShape, workflows.LeanestShape, {Steps: []workflows.StepKind{workflows.StepRegular, workflows.StepLocal, workflows.StepRegular}}} {
		got, err := workflows.ParseShape(sh.String())
		if err != nil || got.String() != sh.String() {
			t.Errorf("workflows.ParseShape(%q) = %v, %v", sh, got, err)
		}
	}
	for _, bad := range []string{"LXL", "LLL+fast", "LLL+"} {
		if _, err := workflows.ParseShape(bad); err == nil {
			t.Errorf("workflows.ParseShape(%q): no error", bad)
		}
	}
}
