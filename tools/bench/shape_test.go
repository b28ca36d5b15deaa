package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
)

// PaymentShape, which the benchmark's Temporal ceiling copies, is the shape a succeeded payment
// really has in its recorded history (payments from before changeLocalSteps had three regular
// activities; since Revision 2 the first local step asks the worker for its charge policy).
func TestPaymentShapeMatchesARecordedPayment(t *testing.T) {
	recorded := PaymentShape
	recorded.Eager = false // not recorded in a history
	for file, want := range map[string]string{"payment_succeeded.json": recorded.String(), "rev0_payment_succeeded_regular_steps.json": "RRR+search-attributes"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "workflows", "testdata", file))
		require.NoError(t, err)
		h, err := client.HistoryFromJSON(bytes.NewReader(b), client.HistoryJSONOptions{})
		require.NoError(t, err)
		require.Equal(t, want, HistoryShape(h).String(), file)
	}
	require.Equal(t, "LLL+eager", LeanestShape.String())
	require.Equal(t, "LLLL+eager+search-attributes", PaymentShape.String())
}
