package tests

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// refundWorker runs the real refund workflow on its own task queue, with the store's steps and
// a bank whose every refund answer is lost: with capability none each refund parks as unknown,
// its holds kept, waiting for a settlement.
func refundWorker(t *testing.T) workflows.Starter {
	t.Helper()
	queue := "refunds-test-" + uuid.NewString()
	w := sdkworker.New(tc, queue, sdkworker.Options{})
	w.RegisterWorkflowWithOptions(workflows.RefundWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowRefund})
	for name, fn := range map[string]any{
		workflows.ActivityHoldRefund: db.HoldRefund,
		workflows.ActivityHoldRefundForRun: func(ctx context.Context, id uuid.UUID) error {
			return db.HoldRefundRun(ctx, id, activity.GetInfo(ctx).WorkflowExecution.RunID)
		},
		workflows.ActivitySendRefund: func(context.Context, workflows.SendRefundInput) (workflows.RefundSendResult, error) {
			return workflows.RefundSendResult{}, temporal.NewNonRetryableApplicationError("connection reset after the request was sent",
				workflows.ErrTypeAmbiguous, nil)
		},
		workflows.ActivityInquireRefund: func(context.Context, uuid.UUID) (workflows.RefundSendResult, error) {
			return workflows.RefundSendResult{}, temporal.NewNonRetryableApplicationError("no inquiry", workflows.ErrTypeInquiryNotAllowed, nil)
		},
		workflows.ActivityPostRefund: func(ctx context.Context, in workflows.PostRefundInput) error {
			_, err := db.PostRefund(ctx, in.OperationID, in.ProviderReference)
			return err
		},
		workflows.ActivityReleaseRefund: func(ctx context.Context, in workflows.ReleaseRefundInput) error {
			_, err := db.ReleaseRefund(ctx, in.OperationID, in.FailureCode)
			return err
		},
		workflows.ActivityMarkRefundUnknown: func(ctx context.Context, id uuid.UUID) error {
			_, err := db.MarkRefundUnknown(ctx, id)
			return err
		},
		workflows.ActivityFlagRefundStuck: func(ctx context.Context, in workflows.FlagInput) error {
			return db.FlagRefundStuck(ctx, in.OperationID, in.Reason)
		},
	} {
		w.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	return workflows.Starter{Client: tc, TaskQueue: queue}
}

// refundUnknown refunds amount of a payment through the store and the refund workflow, and
// waits until the refund is parked as unknown.
func refundUnknown(t *testing.T, starter workflows.Starter, m merchant, paymentID uuid.UUID, key, amount string) payment.Refund {
	t.Helper()
	ctx := context.Background()
	req, err := payment.ParseRefundRequest([]byte(`{"amount":"` + amount + `"}`))
	require.NoError(t, err)
	_, r, began, err := db.BeginRefund(ctx, store.BeginRefundInput{MerchantID: mustUUID(t, m.ID), PaymentID: paymentID, Key: key,
		Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	_, err = starter.StartRefund(ctx, key, workflows.RefundInputFor(r).WithPolicy(workflows.ChargePolicy{Capability: workflows.CapabilityNone}))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, err = db.Refund(ctx, r.ID)
		return err == nil && r.Status == payment.StatusUnknown
	}, 20*time.Second, 50*time.Millisecond)
	return r
}

// Unknown refunds are resolved from the bank's file through their own workflows: the listed one
// is posted (the payer gets the money back), the unlisted one on a complete day is released
// (refundable again); a dry run first changes nothing, and a second import changes nothing more.
func TestReconcileResolvesUnknownRefunds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	mID := mustUUID(t, m.ID)
	acct := s.newAccount(m, "TRY", "100.00")
	require.Equal(t, http.StatusCreated, s.pay(m, "p1", payBody("inv-1", "40.00", "TRY", acct)).Status)
	require.Equal(t, http.StatusCreated, s.pay(m, "p2", payBody("inv-2", "30.00", "TRY", acct)).Status)
	p1, p2 := paymentByKey(t, m, "p1"), paymentByKey(t, m, "p2")

	starter := refundWorker(t)
	refunded := refundUnknown(t, starter, m, p1.ID, "r1", "15.00")
	released := refundUnknown(t, starter, m, p2.ID, "r2", "10.00")
	require.Equal(t, "30.00", s.account(m, acct)["balance"], "nothing paid back yet")

	// The bank's file for today: its two charges, the refund it paid back, complete up to now.
	f, err := reconcile.ParseFile(strings.NewReader(s.settlementFile(today())))
	require.NoError(t, err)
	require.Len(t, f.Lines, 2)
	f.Lines = append(f.Lines, reconcile.Line{SettlementDate: reconcile.Day(today()), ProviderChargeID: "rf_bank_1", Reference: refunded.ID,
		AmountMinor: 1500, Currency: "TRY", Status: reconcile.StatusSettled, Type: reconcile.TypeRefund})
	f.Trailers = []reconcile.Trailer{{Day: reconcile.Day(today()), Lines: 3, AsOf: time.Now().Add(time.Second)}}
	var file strings.Builder
	require.NoError(t, reconcile.WriteFile(&file, f))
	time.Sleep(bookingWindow + time.Second) // both refunds older than the booking window, the file made after it

	rc := &reconcile.Reconciler{Store: db, Settler: starter, SettleTimeout: 30 * time.Second, BookingWindow: bookingWindow}
	opts := reconcile.Options{Merchants: []uuid.UUID{mID}}
	dry, err := rc.Import(ctx, strings.NewReader(file.String()), reconcile.Options{Merchants: opts.Merchants, DryRun: true})
	require.NoError(t, err)
	require.True(t, dry.OK(), "%+v %+v", dry.Mismatches, dry.RefundMismatches)
	require.Equal(t, reconcile.Counts{Matched: 2, RefundResolvedCharged: 1, RefundResolvedNotCharged: 1}, dry.Counts, "%+v", dry.RefundPending)
	for _, r := range []payment.Refund{refunded, released} {
		now, err := db.Refund(ctx, r.ID)
		require.NoError(t, err)
		require.Equal(t, payment.StatusUnknown, now.Status, "a dry run changes nothing")
	}

	rep, err := rc.Import(ctx, strings.NewReader(file.String()), opts)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%+v %+v", rep.Mismatches, rep.RefundMismatches)
	require.Equal(t, dry.Counts, rep.Counts)
	require.Equal(t, []reconcile.Resolution{
		// Line 5: the simulator's file declares its scope (every merchant, charges and refunds)
		// on line 2, so the refund line follows the two charge lines on line 5.
		{Outcome: workflows.OutcomeCharged, Line: 5, Reference: refunded.ID.String(), PaymentID: p1.ID.String(), RefundID: refunded.ID.String(),
			MerchantID: m.ID, WorkflowID: workflows.RefundWorkflowID(mID, "r1"), ProviderChargeID: "rf_bank_1"},
		{Outcome: workflows.OutcomeNotCharged, Reference: released.ID.String(), PaymentID: p2.ID.String(), RefundID: released.ID.String(),
			MerchantID: m.ID, WorkflowID: workflows.RefundWorkflowID(mID, "r2")},
	}, rep.RefundResolved)

	now, err := db.Refund(ctx, refunded.ID)
	require.NoError(t, err)
	require.Equal(t, payment.StatusSucceeded, now.Status)
	require.Equal(t, "rf_bank_1", now.ProviderReference, "the bank's refund id is recorded")
	now, err = db.Refund(ctx, released.ID)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, now.Status)
	require.Equal(t, "45.00", s.account(m, acct)["balance"], "the payer got the listed refund back, only it")
	require.Equal(t, int64(1500), paymentByKey(t, m, "p1").AmountRefunded)
	require.Zero(t, paymentByKey(t, m, "p2").AmountRefunded)
	requireVerified(t) // among others: every hold matches its refund

	again, err := rc.Import(ctx, strings.NewReader(file.String()), opts)
	require.NoError(t, err)
	require.True(t, again.OK())
	require.Equal(t, reconcile.Counts{Matched: 2, RefundMatched: 1}, again.Counts, "the settled refund now simply matches")

	// A settled refund cannot be settled again.
	_, err = starter.Settle(ctx, workflows.RefundWorkflowID(mID, "r2"), workflows.Settlement{Outcome: workflows.OutcomeCharged})
	require.True(t, errors.Is(err, workflows.ErrSettlementRejected), "%v", err)
}
