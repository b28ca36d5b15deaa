package workflows_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kasa-pay/kasa/workflows"
)

// pollers is a Temporal that answers with a task queue's pollers, each last seen ago.
type pollers struct {
	client.Client
	ago []time.Duration
}

func (p pollers) CheckHealth(context.Context, *client.CheckHealthRequest) (*client.CheckHealthResponse, error) {
	return &client.CheckHealthResponse{}, nil
}

func (p pollers) DescribeTaskQueue(context.Context, string, enumspb.TaskQueueType) (*workflowservice.DescribeTaskQueueResponse, error) {
	var out []*taskqueuepb.PollerInfo
	for _, ago := range p.ago {
		out = append(out, &taskqueuepb.PollerInfo{LastAccessTime: timestamppb.New(time.Now().Add(-ago))})
	}
	return &workflowservice.DescribeTaskQueueResponse{Pollers: out}, nil
}

// Temporal lists a worker among a task queue's pollers for minutes after it stopped polling: only
// a poll within the long poll's interval means a worker is there.
func TestReadyNeedsAWorkerPollingNow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ago   []time.Duration
		ready bool
	}{
		{"none", nil, false},
		{"polling", []time.Duration{5 * time.Second}, true},
		{"idle in a long poll", []time.Duration{65 * time.Second}, true},
		{"gone minutes ago", []time.Duration{3 * time.Minute}, false},
		{"one gone, one polling", []time.Duration{4 * time.Minute, time.Second}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := workflows.Starter{Client: pollers{ago: tc.ago}}.Ready(context.Background())
			if tc.ready {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}
