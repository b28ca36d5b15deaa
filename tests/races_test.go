package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// doAt sends a request to the stack's API instance i (0: stack.api).
func (s *stack) doAt(i int, method, path, bearer, body string, headers ...string) response {
	s.t.Helper()
	url := s.api.URL
	if i > 0 {
		url = s.others[i-1].URL
	}
	return httpDo(s.t, method, url+path, bearer, body, headers...)
}

// commandAt is stack.command sent to API instance i.
func (s *stack) commandAt(i int, m merchant, paymentID, command, key, body string) response {
	s.t.Helper()
	headers := []string{"Idempotency-Key", key}
	if body != "" {
		headers = append(headers, "Content-Type", "application/json")
	}
	return s.doAt(i, "POST", "/v1/payments/"+paymentID+"/"+command, m.APIKey, body, headers...)
}

// refundAt is stack.refund sent to API instance i.
func (s *stack) refundAt(i int, m merchant, paymentID, key, body string) response {
	s.t.Helper()
	return s.doAt(i, "POST", "/v1/payments/"+paymentID+"/refunds", m.APIKey, body, "Idempotency-Key", key)
}

// Two captures whose amounts together exceed what was authorized, and a cancel, each under its
// own key and sent at once to two API instances, each retried with its key: one command wins,
// the others are refused and stay refused, and the bank, the payer's balance and hold, the
// payment and its events all say the winner's effect, once.
func TestManualCommandsRaceOnTwoAPIs(t *testing.T) {
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, apis: 2})
	m := s.newMerchant()
	for round := range 3 {
		auth := fmt.Sprintf("auth-two-%d", round)
		paymentID, payer, _ := s.authorize(m, auth, "90.00", "100.00")
		s.setFaults(`{"rules":[{"on":"capture","action":"delay","delay_ms":300,"count":1},{"on":"void","action":"delay","delay_ms":300,"count":1}]}`)
		type cmd struct {
			api                int
			command, key, body string
		}
		cmds := []cmd{
			{0, "capture", auth + "-cap-60", `{"amount":"60.00"}`},
			{1, "capture", auth + "-cap-50", `{"amount":"50.00"}`},
			{(round + 1) % 2, "cancel", auth + "-cancel", ""},
		}
		answers := make([]response, 2*len(cmds))
		var wg sync.WaitGroup
		for i, c := range cmds {
			for retry := range 2 { // the same key at both instances
				wg.Go(func() { answers[2*i+retry] = s.commandAt((c.api+retry)%2, m, paymentID, c.command, c.key, c.body) })
			}
		}
		wg.Wait()
		p := s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)
		held := s.held(paymentID)
		won := map[string]bool{}
		for i, a := range answers {
			c := cmds[i/2]
			switch a.Status {
			case http.StatusCreated, http.StatusOK:
				won[c.key] = true
				require.Equal(t, p["status"], a.json(t)["status"], "%s", a.Body)
			case http.StatusConflict:
				code := a.json(t)["code"]
				require.Contains(t, []any{"payment_not_capturable", "payment_not_cancelable", "idempotency_key_in_use"}, code, "%s", a.Body)
			default:
				t.Fatalf("round %d: %s %s answered %d: %s", round, c.command, c.key, a.Status, a.Body)
			}
		}
		require.Len(t, won, 1, "round %d: exactly one command wins: %v", round, won)
		for _, c := range cmds { // retried once all is decided, each key answers as its command did
			r := s.commandAt(round%2, m, paymentID, c.command, c.key, c.body)
			if won[c.key] {
				require.Contains(t, []int{http.StatusCreated, http.StatusOK}, r.Status, "%s", r.Body)
				require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
			} else {
				require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
			}
		}
		require.Zero(t, reserved(t, payer), "the hold is gone either way")
		switch {
		case won[auth+"-cancel"]:
			require.Equal(t, "canceled", p["status"])
			require.True(t, held.Voided)
			require.Zero(t, held.CapturedMinor)
			require.Equal(t, int64(10000), balance(t, payer))
			require.Equal(t, []string{"payment.requires_capture", "payment.canceled"}, outboxOf(t, env.DatabaseURL, paymentID))
		default:
			want := int64(6000)
			if won[auth+"-cap-50"] {
				want = 5000
			}
			require.Equal(t, "succeeded", p["status"])
			require.Equal(t, want, held.CapturedMinor, "captured once, the winner's amount")
			require.False(t, held.Voided)
			require.Equal(t, fmt.Sprintf("%d.00", want/100), p["amount_captured"])
			require.Equal(t, int64(10000)-want, balance(t, payer))
			require.Equal(t, []string{"payment.requires_capture", "payment.captured"}, outboxOf(t, env.DatabaseURL, paymentID))
		}
	}
	requireVerified(t)
}

// Captures sent around capture_before, as the workflow's timer voids the authorization: each
// payment ends one way, and its capture's answer, the bank, the hold and the ledger agree on it.
func TestManualCaptureRacesTheExpiry(t *testing.T) {
	const window = 3 * time.Second
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, captureWindow: window, apis: 2})
	m := s.newMerchant()
	offsets := []time.Duration{-300 * time.Millisecond, -100 * time.Millisecond, -30 * time.Millisecond, 0, 30 * time.Millisecond, 100 * time.Millisecond}
	type run struct {
		id, payer string
		answer    response
	}
	runs := make([]run, len(offsets))
	var wg sync.WaitGroup
	for i, off := range offsets {
		key := fmt.Sprintf("auth-exp-%d", i)
		id, payer, first := s.authorize(m, key, "40.00", "100.00")
		before := mustTime(t, first.json(t)["capture_before"].(string))
		runs[i] = run{id: id, payer: payer}
		wg.Go(func() {
			time.Sleep(time.Until(before.Add(off)))
			runs[i].answer = s.commandAt(i%2, m, id, "capture", key+"-cap", `{"amount":"25.00"}`)
		})
	}
	wg.Wait()
	for i, r := range runs {
		var p map[string]any
		require.Eventually(t, func() bool {
			p = s.do("GET", "/v1/payments/"+r.id, m.APIKey, "").json(t)
			return p["status"] == "succeeded" || p["status"] == "canceled"
		}, 30*time.Second, 100*time.Millisecond, "offset %s", offsets[i])
		held := s.held(r.id)
		require.Zero(t, reserved(t, r.payer))
		switch r.answer.Status {
		case http.StatusCreated:
			require.Equal(t, "succeeded", p["status"], "offset %s", offsets[i])
			require.Equal(t, int64(2500), held.CapturedMinor)
			require.False(t, held.Voided)
			require.Equal(t, int64(7500), balance(t, r.payer))
		case http.StatusConflict:
			require.Equal(t, "payment_not_capturable", r.answer.json(t)["code"], "%s", r.answer.Body)
			require.Equal(t, "canceled", p["status"], "offset %s", offsets[i])
			require.Equal(t, "authorization_expired", p["failure_code"])
			require.Zero(t, held.CapturedMinor)
			require.True(t, held.Voided)
			require.Equal(t, int64(10000), balance(t, r.payer))
		default:
			t.Fatalf("offset %s: the capture answered %d: %s", offsets[i], r.answer.Status, r.answer.Body)
		}
	}
	requireVerified(t)
}

// A manual payment captured in part, then refunded from two API instances at once by refunds
// whose sum exceeds what was captured: the database lets through at most what was captured,
// the refused one says what is left, and refunds of exactly that remainder then go through.
func TestRefundsOfAPartialCaptureOnTwoAPIs(t *testing.T) {
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, apis: 2})
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-rf2", "100.00", "100.00")
	r := s.command(m, paymentID, "capture", "cap-rf2", `{"amount":"60.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)

	answers := make([]response, 4)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = s.refundAt(i%2, m, paymentID, fmt.Sprintf("rf2-%d", i), `{"amount":"40.00"}`) })
	}
	wg.Wait()
	ok := 0
	for _, a := range answers {
		switch a.Status {
		case http.StatusCreated:
			ok++
		case http.StatusConflict:
			require.Equal(t, "refund_exceeds_refundable", a.json(t)["code"], "%s", a.Body)
			require.Equal(t, "20.00", a.json(t)["refundable"])
		default:
			t.Fatalf("a refund answered %d: %s", a.Status, a.Body)
		}
	}
	require.Equal(t, 1, ok, "one refund of 40.00 fits in 60.00 captured")
	// The remainder, exactly: all of it once, from both instances at once.
	for i := range 2 {
		wg.Go(func() { answers[i] = s.refundAt(i, m, paymentID, fmt.Sprintf("rf2-rest-%d", i), `{}`) })
	}
	wg.Wait()
	require.ElementsMatch(t, []int{http.StatusCreated, http.StatusConflict}, []int{answers[0].Status, answers[1].Status},
		"%s / %s", answers[0].Body, answers[1].Body)
	p := s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)
	require.Equal(t, "60.00", p["amount_captured"])
	require.Equal(t, "60.00", p["amount_refunded"])
	require.Equal(t, int64(10000), balance(t, payer), "what was captured came back, no more")
	require.Zero(t, reserved(t, payer))
	require.Equal(t, refundState{Refunded: 6000, Refunds: 2, Settled: 2, Postings: 2, Succeeded: 2},
		readRefundState(t, env.DatabaseURL, paymentID))
	requireVerified(t)
}

// Refunds sent, from two API instances, while the payment's capture is at the bank and being
// recorded: none is taken before the capture is posted, and those taken after it give back at
// most what was captured.
func TestRefundsRaceTheCapturesRecord(t *testing.T) {
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, apis: 2})
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-rfr", "80.00", "100.00")
	s.setFaults(`{"rules":[{"on":"capture","action":"delay","delay_ms":1000,"count":1}]}`)
	captured := make(chan response, 1)
	go func() { captured <- s.command(m, paymentID, "capture", "cap-rfr", `{"amount":"30.00"}`) }()
	var mu sync.Mutex
	var taken []string
	var wg sync.WaitGroup
	for api := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				before := paymentByKey(t, m, "auth-rfr").Status
				r := s.refundAt(api, m, paymentID, fmt.Sprintf("rfr-%d-%d", api, i), `{"amount":"7.00"}`)
				switch r.Status {
				case http.StatusCreated:
					mu.Lock()
					taken = append(taken, r.json(t)["id"].(string))
					mu.Unlock()
				case http.StatusConflict:
					code := r.json(t)["code"]
					if code == "refund_exceeds_refundable" {
						return
					}
					require.Equal(t, "payment_not_refundable", code, "%s", r.Body)
					require.NotEqual(t, payment.StatusSucceeded, before, "refused as not refundable once captured: %s", r.Body)
				default:
					t.Errorf("a refund answered %d: %s", r.Status, r.Body)
					return
				}
			}
		})
	}
	wg.Wait()
	r := <-captured
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Len(t, taken, 4, "4 × 7.00 fit in 30.00, a fifth does not")
	p := s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)
	require.Equal(t, "30.00", p["amount_captured"])
	require.Equal(t, "28.00", p["amount_refunded"])
	require.Equal(t, int64(10000-3000+2800), balance(t, payer))
	require.Zero(t, reserved(t, payer))
	require.Equal(t, int64(3000), s.held(paymentID).CapturedMinor)
	for _, id := range taken {
		require.Equal(t, 1, s.simRefunds(id))
	}
	requireVerified(t)
}

// A capture whose answer never comes (the bank books it late, and cannot be asked), then a cancel
// while it is unknown, then the bank's files: one made before the capture booked, which does not
// list it, then one that does. The cancel is refused and changes nothing; the first file sends
// the void, which the bank refuses (the capture is on its way), so the hold stays; the second
// posts the capture once, and the capture's key answers for it.
func TestLostCaptureThenCancelThenFiles(t *testing.T) {
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityNone, temporal: tc, apis: 2})
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-lcf", "70.00", "100.00")
	// Booked 8 s after it arrived: the first file, made a booking window after the capture went
	// unknown, and its import come before that even on a loaded machine.
	s.setFaults(`{"rules":[{"on":"capture","action":"late_booking","delay_ms":8000,"count":1}]}`)
	r := s.command(m, paymentID, "capture", "cap-lcf", `{"amount":"25.00"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Equal(t, "unknown", r.json(t)["status"])
	unknownAt := time.Now()

	x := s.commandAt(1, m, paymentID, "cancel", "x-lcf", "")
	requireProblem(t, x, http.StatusConflict, "payment_not_cancelable")
	require.Equal(t, int64(7000), reserved(t, payer))

	time.Sleep(time.Until(unknownAt.Add(bookingWindow + 200*time.Millisecond)))
	file := s.settlementFile(today())
	require.NotContains(t, file, paymentID, "booked late: not listed yet")
	rep, _ := decodeReport(t, s.importSettlements(m, complete(t, file, today(), time.Now())))
	require.Empty(t, rep.Mismatches, "%+v", rep)
	p := paymentByKey(t, m, "auth-lcf")
	require.Equal(t, payment.StatusUnknown, p.Status, "the bank refused the void: the capture is on its way")
	require.Equal(t, int64(7000), reserved(t, payer), "the hold is kept")
	require.Equal(t, int64(10000), balance(t, payer))
	require.False(t, s.held(paymentID).Voided)

	require.Eventually(t, func() bool { return s.held(paymentID).CapturedMinor == 2500 }, 30*time.Second, 100*time.Millisecond)
	rep, ok := decodeReport(t, s.importSettlements(m, complete(t, s.settlementFile(today()), today(), time.Now())))
	require.True(t, ok, "%+v", rep)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "auth-lcf").Status == payment.StatusSucceeded }, 20*time.Second, 100*time.Millisecond)
	p = paymentByKey(t, m, "auth-lcf")
	require.Equal(t, int64(2500), p.CapturedMinor)
	require.Equal(t, int64(7500), balance(t, payer))
	require.Zero(t, reserved(t, payer))
	held := s.held(paymentID)
	require.Equal(t, int64(2500), held.CapturedMinor)
	require.False(t, held.Voided)

	r = s.commandAt(1, m, paymentID, "capture", "cap-lcf", `{"amount":"25.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "25.00", r.json(t)["amount_captured"])
	x = s.command(m, paymentID, "cancel", "x-lcf", "")
	requireProblem(t, x, http.StatusConflict, "payment_not_cancelable")
	require.Equal(t, []string{"payment.requires_capture", "payment.unknown", "payment.captured"}, outboxOf(t, env.DatabaseURL, paymentID))
	requireVerified(t)
}

// An operator terminates a manual payment's run (by mistake) while its capture is at the bank,
// and the bank captures all the same. The capture was taken: its request, and every retry with
// its key, answers 202 with the payment as it is (its hold kept, nothing capturable), never a
// 500 nor a refusal that would free its key; other commands are refused and change nothing.
func TestCaptureAtTheBankWhenItsRunIsTerminated(t *testing.T) {
	for _, c := range []struct{ command, body, path string }{
		{"capture", `{"amount":"25.00"}`, "capture"},
		{"cancel", "", "void"},
	} {
		t.Run(c.command, func(t *testing.T) {
			gate := newBankGate("/" + c.path)
			s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, apis: 2, bank: gate.wrap})
			t.Cleanup(gate.release)
			m := s.newMerchant()
			paymentID, payer, _ := s.authorize(m, "auth-term", "70.00", "100.00")
			first := make(chan response, 1)
			go func() { first <- s.command(m, paymentID, c.command, "term", c.body) }()
			gate.waitArrived(t) // the command is at the bank
			require.NoError(t, tc.TerminateWorkflow(context.Background(), workflows.PaymentWorkflowID(mustUUID(t, m.ID), "auth-term"), "",
				"test: terminated by mistake"))
			gate.release()
			held := func() bool { h := s.held(paymentID); return h.CapturedMinor == 2500 || h.Voided }
			require.Eventually(t, held, 30*time.Second, 100*time.Millisecond, "the bank did it all the same")

			for i, r := range []response{<-first, s.commandAt(1, m, paymentID, c.command, "term", c.body), s.command(m, paymentID, c.command, "term", c.body)} {
				require.Equal(t, http.StatusAccepted, r.Status, "answer %d: %s", i, r.Body)
				require.NotEmpty(t, r.Header.Get("Retry-After"))
				p := r.json(t)
				require.Equal(t, "requires_capture", p["status"])
				require.Equal(t, "0.00", p["capturable"], "a command is under way")
			}
			_, err := db.Command(context.Background(), mustUUID(t, m.ID), "term")
			require.NoError(t, err, "the key names the command that reached the bank")
			requireProblem(t, s.command(m, paymentID, "capture", "term-other", `{"amount":"10.00"}`), http.StatusConflict, "payment_not_capturable")
			requireProblem(t, s.commandAt(1, m, paymentID, "cancel", "term-x", ""), http.StatusConflict, "payment_not_cancelable")
			h := s.held(paymentID)
			require.Equal(t, c.command == "cancel", h.Voided)
			if c.command == "capture" {
				require.Equal(t, int64(2500), h.CapturedMinor, "captured once")
			}
			require.Equal(t, int64(7000), reserved(t, payer), "the hold is kept for a person to settle")
			require.Equal(t, int64(10000), balance(t, payer))
			requireVerified(t)
		})
	}
}

// bankGate holds the bank's POSTs whose path ends in suffix until it is released, and says when
// the first arrived: a test acts while a call is at the bank, however slow the machine.
type bankGate struct {
	suffix  string
	arrived chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newBankGate(suffix string) *bankGate {
	return &bankGate{suffix: suffix, arrived: make(chan struct{}, 1), open: make(chan struct{})}
}

// wrap is stackOptions.bank.
func (g *bankGate) wrap(sim http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, g.suffix) {
			select {
			case g.arrived <- struct{}{}:
			default:
			}
			<-g.open // the bank has the request: it acts on it even if the caller gave up
		}
		sim.ServeHTTP(w, r)
	})
}

func (g *bankGate) waitArrived(t *testing.T) {
	t.Helper()
	select {
	case <-g.arrived:
	case <-time.After(30 * time.Second):
		t.Fatalf("no POST ending in %s reached the bank", g.suffix)
	}
}

// release lets the held calls through; a test releases at its end too (t.Cleanup, registered
// after the stack's, so that it runs before the bank's server waits for its calls to end).
func (g *bankGate) release() { g.once.Do(func() { close(g.open) }) }

// stalledCaptured is a worker's store whose Captured step waits for release before it records
// the capture: the bank has captured, and kasa has not yet written it (a worker stalled, or
// dead and its workflow task not yet taken over).
type stalledCaptured struct {
	activities.Store
	stalled chan struct{}
	release chan struct{}
}

func (s *stalledCaptured) Captured(ctx context.Context, operationID uuid.UUID, amount int64, providerRef string, command uuid.UUID) (payment.Payment, error) {
	select {
	case s.stalled <- struct{}{}:
	default:
	}
	select {
	case <-s.release:
	case <-ctx.Done():
		return payment.Payment{}, ctx.Err()
	}
	return s.Store.Captured(ctx, operationID, amount, providerRef, command)
}

// Between the bank's answer to a capture and its record nothing that reaches the payment from two
// API instances changes it: refunds are refused, nothing reads as capturable, and a settlement
// file that already lists the capture leaves it pending. Once recorded, the capture is posted
// once, its key answers 201, and other captures and cancels are refused.
func TestEverythingWaitsForTheCapturesRecord(t *testing.T) {
	steps := &stalledCaptured{stalled: make(chan struct{}, 1), release: make(chan struct{})}
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, apis: 2,
		steps: func(st activities.Store) activities.Store { steps.Store = st; return steps }})
	m := s.newMerchant()
	paymentID, payer, _ := s.authorize(m, "auth-rec", "70.00", "100.00")
	first := make(chan response, 1)
	go func() { first <- s.command(m, paymentID, "capture", "cap-rec", `{"amount":"25.00"}`) }()
	select {
	case <-steps.stalled:
	case <-time.After(20 * time.Second):
		t.Fatal("the capture was never recorded")
	}
	require.Equal(t, int64(2500), s.held(paymentID).CapturedMinor, "the bank captured")

	for api := range 2 {
		requireProblem(t, s.refundAt(api, m, paymentID, fmt.Sprintf("rec-refund-%d", api), `{"amount":"5.00"}`), http.StatusConflict, "payment_not_refundable")
		p := s.doAt(api, "GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)
		require.Equal(t, "requires_capture", p["status"])
		require.Equal(t, "0.00", p["capturable"])
	}
	rep, _ := decodeReport(t, s.importSettlements(m, complete(t, s.settlementFile(today()), today(), time.Now())))
	require.Empty(t, rep.Mismatches, "%+v", rep)
	require.Len(t, rep.Pending, 1, "%+v", rep)
	require.Equal(t, paymentID, rep.Pending[0].PaymentID)
	require.Equal(t, int64(7000), reserved(t, payer), "the hold is whole until the capture is recorded")
	require.Equal(t, int64(10000), balance(t, payer))

	close(steps.release)
	r := <-first
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "25.00", r.json(t)["amount_captured"])
	again := s.commandAt(1, m, paymentID, "capture", "cap-rec", `{"amount":"25.00"}`)
	require.Equal(t, string(r.Body), string(again.Body))
	for api := range 2 {
		requireProblem(t, s.commandAt(api, m, paymentID, "capture", fmt.Sprintf("rec-cap-%d", api), `{"amount":"10.00"}`), http.StatusConflict, "payment_not_capturable")
		requireProblem(t, s.commandAt(api, m, paymentID, "cancel", fmt.Sprintf("rec-x-%d", api), ""), http.StatusConflict, "payment_not_cancelable")
	}
	require.Equal(t, int64(7500), balance(t, payer))
	require.Zero(t, reserved(t, payer))
	require.Equal(t, int64(2500), s.held(paymentID).CapturedMinor, "captured once")
	require.Equal(t, []string{"payment.requires_capture", "payment.captured"}, outboxOf(t, env.DatabaseURL, paymentID))
	rep, ok := decodeReport(t, s.importSettlements(m, complete(t, s.settlementFile(today()), today(), time.Now())))
	require.True(t, ok, "%+v", rep)
	requireVerified(t)
}
