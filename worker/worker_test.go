package worker_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/worker"
	"github.com/kasa-pay/kasa/workflows"
)

// steps records which database steps the registered activities reached.
type steps struct {
	activities.Store
	mu  sync.Mutex
	ran []string
}

func (s *steps) add(step string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ran = append(s.ran, step)
}

// refunded is the payment the fake's refunds pay back.
var refunded = payment.NewID()

func (s *steps) Refund(_ context.Context, id uuid.UUID) (payment.Refund, error) {
	return payment.Refund{ID: id, PaymentID: refunded, AmountMinor: 3000, Currency: "TRY"}, nil
}

func (s *steps) HoldRefund(context.Context, uuid.UUID) error { s.add("hold"); return nil }

func (s *steps) BeginRefundSend(context.Context, uuid.UUID, int) (bool, error) {
	s.add("send recorded")
	return true, nil
}

func (s *steps) PostRefund(_ context.Context, _ uuid.UUID, ref string) (payment.Refund, error) {
	s.add("post " + ref)
	return payment.Refund{}, nil
}

// bank refunds everything it is asked to.
type bank struct{ activities.Provider }

func (bank) Refund(_ context.Context, key string, _ provider.RefundRequest) (provider.Refund, error) {
	return provider.Refund{ID: "re_" + key[:8], Status: provider.StatusSucceeded}, nil
}

// The refund workflow and its activities are registered under their history names: a refund
// runs through them to the posting, as local and as regular activities.
func TestRegisterRunsRefunds(t *testing.T) {
	for _, local := range []bool{true, false} {
		var suite testsuite.WorkflowTestSuite
		env := suite.NewTestWorkflowEnvironment()
		st := &steps{}
		worker.Register(env, &activities.Activities{Store: st, Provider: bank{}})
		id := payment.NewID()
		env.ExecuteWorkflow(workflows.WorkflowRefund, workflows.RefundInput{
			OperationID: id, PaymentID: refunded, MerchantID: payment.NewID(), AmountMinor: 3000, Currency: "TRY",
			Capability: workflows.CapabilityInquiry, LocalSteps: local,
		})
		require.True(t, env.IsWorkflowCompleted())
		require.NoError(t, env.GetWorkflowError())
		var res workflows.RefundWorkflowResult
		require.NoError(t, env.GetWorkflowResult(&res))
		require.Equal(t, string(payment.StatusSucceeded), res.Status)
		require.Equal(t, []string{"hold", "send recorded", "post re_" + id.String()[:8]}, st.ran, "local steps: %v", local)
	}
}
