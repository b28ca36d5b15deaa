package tests

import (
	"testing"

	"encoding/json"
	"net/http"

	"github.com/google/uuid"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/workflows"
	"github.com/stretchr/testify/require"
)

func mustUUID(t *testing.T, s string) uuid.UUID {
	t.Helper()
	id, err := uuid.Parse(s)
	require.NoError(t, err)
	return id
}

func workflowOptions() workflow.RegisterOptions {
	return workflow.RegisterOptions{Name: workflows.WorkflowPayment}
}

func jsonDecode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }
