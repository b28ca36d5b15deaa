package workflows_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/workflows"
)

// PaymentShape, which the benchmark's Temporal ceiling copies, is the shape a succeeded payment
// really has in its recorded history (payments from before changeLocalSteps had three regular
// activities).
func TestPaymentShapeMatchesARecordedPayment(t *testing.T) {
	recorded := workflows.PaymentShape
	recorded.Eager = false // not recorded in a history
	for file, want := range map[string]string{"payment_succeeded.json": recorded.String(), "payment_succeeded_regular_steps.json": "RRR+search-attributes"} {
		b, err := os.ReadFile(filepath.Join("testdata", file))
		require.NoError(t, err)
		h, err := client.HistoryFromJSON(bytes.NewReader(b), client.HistoryJSONOptions{})
		require.NoError(t, err)
		require.Equal(t, want, workflows.HistoryShape(h).String(), file)
	}
	require.Equal(t, "LLL+eager", workflows.LeanestShape.String())
	require.Equal(t, "LLL+eager+search-attributes", workflows.PaymentShape.String())
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
