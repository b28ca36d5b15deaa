package tests

import (
	"context"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/bench"
	"github.com/kasa-pay/kasa/workflows"
)

var record = flag.Bool("record", false, "write the recorded workflow histories to workflows/testdata")

// TestRecordHistories runs real payments through the real server, then replays their histories
// against the current workflow code: a non-deterministic change fails here. With -record it also
// stores them in workflows/testdata, where the workflows package replays them on every run.
func TestRecordHistories(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	ctx := context.Background()

	cases := []struct{ name, key, amount string }{
		{"succeeded", "hist-ok", "10.00"},
		{"insufficient_funds", "hist-poor", "1000.00"},
	}
	histories := map[string]*historypb.History{}
	for _, c := range cases {
		r := s.pay(m, c.key, payBody(c.key, c.amount, "TRY", acct))
		require.Contains(t, []int{http.StatusCreated, http.StatusPaymentRequired}, r.Status, "%s", r.Body)
		histories[c.name] = fetchHistory(t, ctx, workflows.PaymentWorkflowID(mustUUID(t, m.ID), c.key))
	}

	// Unknown (the bank's answer lost, capability none), then settled through the checked update
	// after a rejected malformed one and an ignored early signal.
	n := newStack(t, workflows.CapabilityNone)
	nm := n.newMerchant()
	nacct := n.newAccount(nm, "TRY", "100.00")
	n.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	r := n.pay(nm, "hist-unknown", payBody("hist-unknown", "10.00", "TRY", nacct))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	wfID := workflows.PaymentWorkflowID(mustUUID(t, nm.ID), "hist-unknown")
	starter := workflows.Starter{Client: tc, TaskQueue: n.queue}
	_, err := starter.Settle(ctx, wfID, workflows.Settlement{Outcome: "maybe"})
	require.ErrorIs(t, err, workflows.ErrSettlementRejected)
	status, err := starter.Settle(ctx, wfID, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_settled"})
	require.NoError(t, err)
	require.Equal(t, "succeeded", status)
	histories["unknown_settled"] = fetchHistory(t, ctx, wfID)

	// Unknown, a cancellation request ignored (Revision 7), then settled.
	n.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	r = n.pay(nm, "hist-cancel-requested", payBody("hist-cancel-requested", "10.00", "TRY", nacct))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	wfID = workflows.PaymentWorkflowID(mustUUID(t, nm.ID), "hist-cancel-requested")
	require.Eventually(t, func() bool { return paymentByKey(t, nm, "hist-cancel-requested").Status == payment.StatusUnknown },
		20*time.Second, 50*time.Millisecond)
	require.NoError(t, tc.CancelWorkflow(ctx, wfID, ""))
	status, err = starter.Settle(ctx, wfID, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_settled"})
	require.NoError(t, err)
	require.Equal(t, "succeeded", status)
	histories["unknown_cancel_requested_settled"] = fetchHistory(t, ctx, wfID)

	// Inquiry: the bank books the charge after the connection died; inquiries find it within
	// the booking window, and nothing is sent again.
	q := newStackWith(t, stackOptions{capability: workflows.CapabilityInquiry, temporal: tc, bookingWindow: 4 * time.Second})
	qm := q.newMerchant()
	qacct := q.newAccount(qm, "TRY", "100.00")
	q.setFaults(`{"rules":[{"on":"charge","action":"late_booking","delay_ms":2500,"count":1}]}`)
	r = q.pay(qm, "hist-late", payBody("hist-late", "10.00", "TRY", qacct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	histories["inquiry_late_booking"] = fetchHistory(t, ctx, workflows.PaymentWorkflowID(mustUUID(t, qm.ID), "hist-late"))
	// Inquiry: the charge's answer lost and the bank answering no inquiry, parked unknown, then
	// settled as charged once the inquiry it waits for gives up (Revision 12: within the charge
	// timeout).
	u := newStackWith(t, stackOptions{capability: workflows.CapabilityInquiry, temporal: tc,
		chargeBudget: 6 * time.Second, chargeTimeout: 6 * time.Second, syncWait: time.Second})
	um := u.newMerchant()
	u.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1},{"on":"inquiry","action":"error_503"}]}`)
	r = u.pay(um, "hist-unanswered", payBody("hist-unanswered", "10.00", "TRY", u.newAccount(um, "TRY", "100.00")))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Eventually(t, func() bool { return paymentByKey(t, um, "hist-unanswered").Status == payment.StatusUnknown },
		30*time.Second, 50*time.Millisecond)
	wfID = workflows.PaymentWorkflowID(mustUUID(t, um.ID), "hist-unanswered")
	status, err = workflows.Starter{Client: tc, TaskQueue: u.queue}.Settle(ctx, wfID,
		workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_settled"})
	require.NoError(t, err)
	require.Equal(t, "succeeded", status)
	histories["inquiry_unanswered_settled"] = fetchHistory(t, ctx, wfID)

	// Manual payments: captured in part; canceled by the merchant; voided at capture_before;
	// a capture whose answer was lost (capability none), settled as charged.
	mm := n.newMerchant()
	macct := n.newAccount(mm, "TRY", "100.00")
	for _, c := range []struct{ name, key, command, body string }{
		{"manual_captured", "hist-cap", "capture", `{"amount":"4.00"}`},
		{"manual_canceled", "hist-cancel", "cancel", ""},
	} {
		r := n.pay(mm, c.key, manualBody(c.key, "10.00", macct))
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		r = n.command(mm, r.json(t)["id"].(string), c.command, c.key, c.body)
		require.Contains(t, []int{http.StatusOK, http.StatusCreated}, r.Status, "%s", r.Body)
		histories[c.name] = fetchHistory(t, ctx, workflows.PaymentWorkflowID(mustUUID(t, mm.ID), c.key))
	}
	r = n.pay(mm, "hist-cap-unknown", manualBody("hist-cap-unknown", "10.00", macct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	n.setFaults(`{"rules":[{"on":"capture","action":"drop_response","count":1}]}`)
	r = n.command(mm, r.json(t)["id"].(string), "capture", "hist-cap-unknown", "")
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	wfID = workflows.PaymentWorkflowID(mustUUID(t, mm.ID), "hist-cap-unknown")
	status, err = starter.Settle(ctx, wfID, workflows.Settlement{Outcome: workflows.OutcomeCharged})
	require.NoError(t, err)
	require.Equal(t, "succeeded", status)
	histories["manual_capture_unknown_settled"] = fetchHistory(t, ctx, wfID)
	// Waiting for its capture, terminated by mistake, reset (Revision 11: the reset run takes it
	// on), then captured.
	r = n.pay(mm, "hist-reset", manualBody("hist-reset", "10.00", macct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	wfID = workflows.PaymentWorkflowID(mustUUID(t, mm.ID), "hist-reset")
	terminateByMistake(t, wfID)
	resetToLastWorkflowTask(t, wfID)
	r = n.command(mm, r.json(t)["id"].(string), "capture", "hist-reset", "")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	histories["manual_reset_captured"] = fetchHistory(t, ctx, wfID)
	// Its authorization's answer lost, terminated by mistake, reset (Revision 11: the reset run
	// waits for its settlement), settled as charged, then captured.
	id := n.authorizeUnknown(mm, "hist-reset-unknown", macct)
	wfID = workflows.PaymentWorkflowID(mustUUID(t, mm.ID), "hist-reset-unknown")
	terminateByMistake(t, wfID)
	resetToLastWorkflowTask(t, wfID)
	held := n.held(id)
	require.Len(t, held.Live, 1)
	status, err = starter.Settle(ctx, wfID, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: held.Live[0]})
	require.NoError(t, err)
	require.Equal(t, string(payment.StatusRequiresCapture), status)
	r = n.command(mm, id, "capture", "hist-reset-unknown", "")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	histories["manual_reset_unknown_settled_captured"] = fetchHistory(t, ctx, wfID)
	e := newStackWith(t, stackOptions{capability: workflows.CapabilityInquiry, temporal: tc, captureWindow: 2 * time.Second})
	em := e.newMerchant()
	r = e.pay(em, "hist-expired", manualBody("hist-expired", "10.00", e.newAccount(em, "TRY", "100.00")))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	histories["manual_expired"] = fetchHistory(t, ctx, workflows.PaymentWorkflowID(mustUUID(t, em.ID), "hist-expired"))

	for name, hist := range histories {
		replayer := worker.NewWorkflowReplayer()
		replayer.RegisterWorkflowWithOptions(workflows.PaymentWorkflow, workflowOptions())
		require.NoError(t, replayer.ReplayWorkflowHistory(nil, hist), name)

		if *record {
			b, err := protojson.MarshalOptions{Indent: "  "}.Marshal(hist)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join("..", "workflows", "testdata", "payment_"+name+".json"), b, 0o644))
		}
	}
}

// fetchHistory returns the workflow's whole history once it has closed. It waits: the API answers
// a payment as soon as its outcome commits, before the workflow's last task reaches Temporal.
func fetchHistory(t *testing.T, ctx context.Context, workflowID string) *historypb.History {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, tc.GetWorkflow(wctx, workflowID, "").Get(wctx, nil), "%s did not close", workflowID)
	it := tc.GetWorkflowHistory(ctx, workflowID, "", false, 0)
	var h historypb.History
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		h.Events = append(h.Events, ev)
	}
	require.NotEmpty(t, h.Events)
	return &h
}

// With every provider capability, a payment that succeeds at its first charge runs the shape
// bench.ShapeFor names: the one ceiling T copies and the bench's report states. Eager start
// is not in a history; the provider must have seen the charge exactly once.
func TestShapeForEveryCapability(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range workflows.Capabilities {
		s := newStack(t, c)
		m := s.newMerchant()
		acct := s.newAccount(m, "TRY", "100.00")
		key := "shape-" + string(c)
		r := s.pay(m, key, payBody(key, "10.00", "TRY", acct))
		require.Equal(t, http.StatusCreated, r.Status, "%s: %s", c, r.Body)
		require.Equal(t, 1, s.simCount(r.json(t)["id"].(string)), c)

		want := bench.ShapeFor(c)
		want.Eager = false
		got := bench.HistoryShape(fetchHistory(t, ctx, workflows.PaymentWorkflowID(mustUUID(t, m.ID), key)))
		require.Equal(t, want.String(), got.String(), c)
	}
}
