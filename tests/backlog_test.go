package tests

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/api"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/sweeper"
	"github.com/kasa-pay/kasa/workflows"
)

// fullBacklog is the drainer's record of a start backlog past its bound, with the merchant's
// payments queued in it: every new payment is refused.
type fullBacklog struct{}

func (fullBacklog) BacklogState(context.Context) (store.BacklogState, error) {
	return store.BacklogState{Queued: 1000, DrainPerSecond: 1}, nil
}

func (fullBacklog) MerchantQueued(context.Context, uuid.UUID) (bool, error) { return true, nil }

// An answer kasa knows without writing anything (another key's live payment for the invoice, a
// payer account that is not the merchant's) is the same below and past the backlog's bound: a
// 409 or a 400 is for good, and a 503 would send the merchant back for the same answer. Only a
// payment kasa would take is refused past the bound, and nothing is written for it.
func TestBacklogBoundAnswersWhatItKnowsAsBelowIt(t *testing.T) {
	below := newStack(t, workflows.CapabilityIdempotent)
	past := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc,
		backlog: api.Backlog{State: fullBacklog{}, MaxRunning: 8, MaxQueued: 10}})
	m := below.newMerchant()
	payer := below.newAccount(m, "TRY", "100.00")
	first := below.pay(m, "first", payBody("inv-live", "10.00", "TRY", payer))
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	firstID := first.json(t)["id"].(string)

	for _, tc := range []struct {
		name, invoice, account string
		status                 map[*stack]int // by load
		code                   map[*stack]string
	}{
		{"another key for the invoice's live payment", "inv-live", payer,
			map[*stack]int{below: http.StatusConflict, past: http.StatusConflict},
			map[*stack]string{below: "duplicate_payment", past: "duplicate_payment"}},
		{"a payer account of no one", "inv-nobody", uuid.NewString(),
			map[*stack]int{below: http.StatusBadRequest, past: http.StatusBadRequest},
			map[*stack]string{below: "invalid_request", past: "invalid_request"}},
		{"a new invoice", "inv-new", payer,
			map[*stack]int{below: http.StatusCreated, past: http.StatusServiceUnavailable},
			map[*stack]string{below: "", past: "unavailable"}},
	} {
		for load, s := range map[string]*stack{"below": below, "past": past} {
			t.Run(tc.name+" "+load+" the bound", func(t *testing.T) {
				key := fmt.Sprintf("%s-%s", tc.invoice, load)
				invoice := tc.invoice
				if tc.invoice == "inv-new" {
					invoice += "-" + load
				}
				r := s.pay(m, key, payBody(invoice, "1.00", "TRY", tc.account))
				require.Equal(t, tc.status[s], r.Status, "%s", r.Body)
				_, err := db.Record(context.Background(), mustUUID(t, m.ID), key)
				if r.Status == http.StatusCreated {
					require.NoError(t, err)
					return
				}
				require.Equal(t, tc.code[s], r.json(t)["code"], "%s", r.Body)
				require.ErrorIs(t, err, payment.ErrNotFound, "nothing was written for the key")
				if tc.code[s] == "duplicate_payment" {
					require.Equal(t, firstID, r.json(t)["payment_id"])
				}
			})
		}
	}
	list := below.do("GET", "/v1/payments", m.APIKey, "").json(t)
	require.Len(t, list["data"], 2, "the first payment and the new invoice's below the bound")
	requireVerified(t)
}

// A manual payment queued in the start backlog keeps the capture_before its 202 showed: its
// window runs from its arrival (docs/api.md), not from the authorization the drainer's start
// makes later. The bank holds the authorization from then on, so the window never outlasts it,
// and kasa voids the authorization at that capture_before, not a window after the authorization.
func TestQueuedManualPaymentKeepsItsCaptureBefore(t *testing.T) {
	const window, queuedFor = 6 * time.Second, 3 * time.Second
	s, m, payer, queued := queueManualPayment(t, window, "queued-manual")
	startQueuedAfter(t, s, queued, queuedFor) // the burst ahead of it

	var p payment.Payment
	require.Eventually(t, func() bool {
		p = paymentByKey(t, m, "queued-manual")
		return p.Status == payment.StatusRequiresCapture
	}, 20*time.Second, 50*time.Millisecond)
	require.Equal(t, 1, s.held(queued.ID.String()).Count, "authorized at the bank")
	run, err := tc.DescribeWorkflow(context.Background(), workflows.PaymentWorkflowID(mustUUID(t, m.ID), "queued-manual"), "")
	require.NoError(t, err)
	authorizedFrom := run.WorkflowStartTime
	require.True(t, authorizedFrom.After(queued.CreatedAt.Add(queuedFor)), "started by the drainer after its wait")
	require.True(t, p.CaptureBefore.Equal(queued.CaptureBefore), "capture_before %v, shown %v", p.CaptureBefore, queued.CaptureBefore)

	require.Eventually(t, func() bool {
		p = paymentByKey(t, m, "queued-manual")
		return p.Status == payment.StatusCanceled
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, payment.FailureAuthorizationExpired, p.FailureCode)
	require.False(t, p.UpdatedAt.Before(p.CaptureBefore), "not voided before its capture_before")
	require.True(t, p.UpdatedAt.Before(authorizedFrom.Add(window)), "voided at capture_before (%v), not a window after the authorization (%v): %v",
		p.CaptureBefore, authorizedFrom.Add(window), p.UpdatedAt)
	require.True(t, s.held(queued.ID.String()).Voided)
	require.Zero(t, reserved(t, payer))
	requireVerified(t)
}

// One still queued when its whole capture window has passed reads as any manual payment whose
// window ended (docs/api.md): authorized when it starts, then voided at once, the hold released
// at the bank and in kasa; no capture is taken in between.
func TestManualPaymentQueuedPastItsCaptureBeforeIsVoidedAtOnce(t *testing.T) {
	const window = 2 * time.Second
	s, m, payer, queued := queueManualPayment(t, window, "queued-past-window")
	startQueuedAfter(t, s, queued, window+time.Second)

	var p payment.Payment
	require.Eventually(t, func() bool {
		p = paymentByKey(t, m, "queued-past-window")
		return p.Status.Final()
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, payment.StatusCanceled, p.Status)
	require.Equal(t, payment.FailureAuthorizationExpired, p.FailureCode)
	require.Zero(t, p.CapturedMinor)
	held := s.held(queued.ID.String())
	require.Equal(t, 1, held.Count, "authorized once at the bank")
	require.True(t, held.Voided, "and voided")
	require.Zero(t, held.CapturedMinor)
	require.Zero(t, reserved(t, payer))
	r := s.command(m, queued.ID.String(), "capture", "late-capture", "{}")
	require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
	require.Equal(t, "payment_not_capturable", r.json(t)["code"])
	requireVerified(t)
}

// queueManualPayment queues a manual payment in the start backlog, as the API does past its
// workers' pace, on a stack whose capture window is window.
func queueManualPayment(t *testing.T, window time.Duration, key string) (*stack, merchant, string, payment.Payment) {
	t.Helper()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, captureWindow: window})
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	req := payment.Request{InvoiceID: "inv-" + key, AmountMinor: 2500, Currency: "TRY", AccountID: mustUUID(t, payer),
		PaymentType: "purchase", CaptureManual: true}
	rec, queued, began, err := db.Begin(context.Background(), store.BeginInput{MerchantID: mustUUID(t, m.ID), Key: key, Request: req,
		OperationID: payment.NewID(), Lease: time.Minute, Queue: true, CaptureWindow: window})
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	require.True(t, rec.Queued)
	require.Equal(t, queued.CreatedAt.Add(window), queued.CaptureBefore, "the 202's capture_before: a window from the arrival")
	t.Cleanup(func() { _ = db.Unqueue(context.Background(), []uuid.UUID{queued.ID}) })
	return s, m, payer, queued
}

// startQueuedAfter runs the drainer after wait (the burst ahead of the payment), until the test ends.
func startQueuedAfter(t *testing.T, s *stack, queued payment.Payment, wait time.Duration) {
	t.Helper()
	time.Sleep(wait)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	d := &sweeper.Drainer{Store: db, Starter: workflows.Starter{Client: tc, TaskQueue: s.queue}, Logger: slog.New(slog.DiscardHandler)}
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
}

// KASA_BACKLOG_MAX_WAIT holds while the drain has stalled (no drainer leads, or its starts never
// finish, and the rate reads 0): once the oldest queued payment has waited longer than the
// clients' patience, a new payment that would queue behind it is refused with 503 and
// Retry-After, nothing written. A system with nothing queued refuses nothing, drainer or not.
func TestBacklogMaxWaitRefusesWhileTheDrainStalls(t *testing.T) {
	ctx := context.Background()
	const maxWait = 2 * time.Second
	n, _, err := db.QueuedBacklog(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "another test left payments queued")
	// No drainer leads here: an earlier test's drainer record, with its drain rate, would say one does.
	c, err := pgx.Connect(ctx, env.DatabaseURL)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `DELETE FROM backlog_state`)
	require.NoError(t, err)
	require.NoError(t, c.Close(ctx))
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc,
		backlog: api.Backlog{State: db, MaxRunning: 8, MaxWait: maxWait}})
	m, idle := s.newMerchant(), s.newMerchant()
	payer, idlePayer := s.newAccount(m, "TRY", "100.00"), s.newAccount(idle, "TRY", "100.00")

	r := s.pay(m, "idle", payBody("inv-idle", "1.00", "TRY", payer))
	require.Equal(t, http.StatusCreated, r.Status, "nothing queued, no drainer: %s", r.Body)

	// A payment queued where no drainer runs: the drain has stalled.
	beginPayment(t, m, payer, "stalled", "1.00", time.Minute, true)

	r = s.pay(m, "behind-young", payBody("inv-behind-young", "1.00", "TRY", payer))
	require.Equal(t, http.StatusAccepted, r.Status, "the oldest has not waited that long yet: %s", r.Body)
	young := mustUUID(t, r.json(t)["id"].(string))
	t.Cleanup(func() { _ = db.Unqueue(context.Background(), []uuid.UUID{young}) })
	time.Sleep(maxWait + time.Second)

	r = s.pay(m, "behind", payBody("inv-behind", "1.00", "TRY", payer))
	requireProblem(t, r, http.StatusServiceUnavailable, "unavailable")
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	_, err = db.Record(ctx, mustUUID(t, m.ID), "behind")
	require.ErrorIs(t, err, payment.ErrNotFound, "nothing was written for the refused payment")

	r = s.pay(idle, "other", payBody("inv-other", "1.00", "TRY", idlePayer))
	require.Equal(t, http.StatusCreated, r.Status, "a merchant with nothing queued runs at once: %s", r.Body)
	require.Equal(t, "99.00", s.account(idle, idlePayer)["balance"])
}
