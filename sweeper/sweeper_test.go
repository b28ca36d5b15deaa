package sweeper_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/sweeper"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

var (
	db             *store.Store
	dbURL          string
	temporalClient client.Client // a Temporal dev server's, for the tests that need a real one
)

func TestMain(m *testing.M) {
	testkit.Main(m, testkit.Options{Temporal: true}, func(e *testkit.Env) { db, dbURL, temporalClient = e.Store, e.DatabaseURL, e.Temporal })
}

// starts records the workflows the sweeper starts, as Temporal would receive them.
type starts struct {
	mu       sync.Mutex
	payments map[string]workflows.PaymentInput
	refunds  map[string]workflows.RefundInput
}

func (s *starts) StartPayment(_ context.Context, key string, in workflows.PaymentInput) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.payments[key] = in
	return "run", nil
}

func (s *starts) StartRefund(_ context.Context, key string, in workflows.RefundInput) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refunds[key] = in
	return "run", nil
}

// A payment and a refund whose API process died before starting their workflows are both
// taken over once their leases ran out, each with its own workflow, and only once.
func TestSweepStartsStrandedPaymentsAndRefunds(t *testing.T) {
	ctx := context.Background()
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Deposit: 100_000})
	paid, err := testkit.Settle(ctx, db, m, false)
	require.NoError(t, err)

	// The same key for both: the sweeper must tell a payment's record from a refund's.
	const key = "stranded-1"
	_, p, began, err := db.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, OperationID: payment.NewID(), Lease: time.Millisecond,
		Request: payment.Request{InvoiceID: "inv-stranded", AmountMinor: 500, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	_, r, began, err := db.BeginRefund(ctx, store.BeginRefundInput{MerchantID: m.ID, PaymentID: paid, Key: key, OperationID: payment.NewID(),
		Lease: time.Millisecond, Request: payment.RefundRequest{Amount: "0.4"}})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	time.Sleep(20 * time.Millisecond)

	st := &starts{payments: map[string]workflows.PaymentInput{}, refunds: map[string]workflows.RefundInput{}}
	sw := &sweeper.Sweeper{Store: db, Starter: st, Lease: time.Minute, Merchant: &m.ID}
	n, err := sw.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, map[string]workflows.PaymentInput{key: workflows.InputFor(p)}, st.payments)
	require.Equal(t, map[string]workflows.RefundInput{key: workflows.RefundInputFor(r)}, st.refunds)
	require.EqualValues(t, 40, st.refunds[key].AmountMinor)

	rec, err := db.RefundRecord(ctx, m.ID, key)
	require.NoError(t, err)
	require.True(t, rec.WorkflowStarted, "the refund's record belongs to its workflow now")
	rec, err = db.Record(ctx, m.ID, key)
	require.NoError(t, err)
	require.True(t, rec.WorkflowStarted)

	n, err = sw.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is stranded any more")
	require.Len(t, st.refunds, 1)
}
