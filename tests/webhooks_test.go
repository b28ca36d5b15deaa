package tests

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// merchantVerifies checks a webhook as docs/webhooks.md tells a merchant to, with nothing of
// kasa's: the HMAC-SHA256 of "<t>.<raw body>" under the secret, hex, in one of the v1 values of
// Kasa-Signature, and t within 5 minutes of the merchant's clock.
func merchantVerifies(t *testing.T, secret string, r testkit.HookRequest) {
	t.Helper()
	var ts string
	var sigs []string
	for part := range strings.SplitSeq(r.Header.Get("Kasa-Signature"), ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	require.NoError(t, err, "Kasa-Signature %q", r.Header.Get("Kasa-Signature"))
	require.Less(t, r.At.Sub(time.Unix(unix, 0)).Abs(), 5*time.Minute, "signed when sent")
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(r.Body)
	require.Contains(t, sigs, hex.EncodeToString(mac.Sum(nil)), "the merchant's own HMAC verifies the raw body")
}

// snapshots are the GET answers of payments and refunds in each state they reached, in order: a
// webhook's data is the resource exactly as GET answered it at the time of the event.
type snapshots map[string][][]byte

// take waits until GET path reads status and records that answer for the resource id.
func (sn snapshots) take(t *testing.T, s *stack, m merchant, path, status string) {
	t.Helper()
	var body []byte
	var id string
	require.Eventually(t, func() bool {
		r := s.do("GET", path, m.APIKey, "")
		var res struct{ ID, Status string }
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &res) != nil {
			return false
		}
		body, id = bytes.TrimSpace(r.Body), res.ID
		return res.Status == status
	}, 30*time.Second, 20*time.Millisecond, "%s becomes %s", path, status)
	sn[id] = append(sn[id], body)
}

// A merchant's endpoint sees every outcome the docs list, each as the docs show it: one event
// per state change, of the type the docs name, with data exactly as GET answered at the time,
// the headers the docs show, a signature the merchant's own HMAC verifies, an id no other event
// shares, and each payment's and refund's events in the order they happened.
// Not parallel: the event pipeline publishes every outbox row of the shared database.
func TestWebhooksOfEveryOutcomeAsAMerchantSeesThem(t *testing.T) {
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	hook := newSink(t)
	startEventPipeline(t)
	m := s.newHookedMerchant(hook.URL)
	mid := mustUUID(t, m.ID)
	settler := workflows.Starter{Client: tc, TaskQueue: s.queue}
	payer := s.newAccount(m, "TRY", "1000.00")
	sn := snapshots{}
	paid := func(id, status string) { t.Helper(); sn.take(t, s, m, "/v1/payments/"+id, status) }
	refunded := func(id, status string) { t.Helper(); sn.take(t, s, m, "/v1/refunds/"+id, status) }
	settle := func(workflowID, outcome string) {
		t.Helper()
		_, err := settler.Settle(ctx, workflowID, workflows.Settlement{Outcome: outcome, ProviderReference: "ch_by_hand_" + outcome, Note: "test"})
		require.NoError(t, err)
	}
	want := map[string][]string{} // resource id -> event types in order

	// Automatic payments: succeeded; failed (declined, insufficient funds); unknown, then
	// charged or not charged.
	r := s.pay(m, "ok", payBody("inv-ok", "100.00", "TRY", payer))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	ok := r.json(t)["id"].(string)
	paid(ok, "succeeded")
	want[ok] = []string{"payment.succeeded"}

	s.setFaults(`{"rules":[{"on":"charge","action":"decline","count":1}]}`)
	r = s.pay(m, "declined", payBody("inv-declined", "10.00", "TRY", payer))
	require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
	declined := r.json(t)["id"].(string)
	paid(declined, "failed")
	want[declined] = []string{"payment.failed"}

	r = s.pay(m, "poor", payBody("inv-poor", "5000.00", "TRY", payer))
	require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
	require.Equal(t, "insufficient_funds", r.json(t)["failure_code"])
	poor := r.json(t)["id"].(string)
	paid(poor, "failed")
	want[poor] = []string{"payment.failed"}

	for _, outcome := range []string{workflows.OutcomeCharged, workflows.OutcomeNotCharged} {
		key := "lost-" + outcome
		p := s.payUnknown(m, key, payBody("inv-"+key, "20.00", "TRY", payer), "drop_response")
		id := p.ID.String()
		paid(id, "unknown")
		settle(workflows.PaymentWorkflowID(mid, key), outcome)
		if outcome == workflows.OutcomeCharged {
			paid(id, "succeeded")
			want[id] = []string{"payment.unknown", "payment.succeeded"}
		} else {
			paid(id, "failed")
			want[id] = []string{"payment.unknown", "payment.failed"}
		}
	}

	// Refunds of the first payment: succeeded; failed; unknown, then paid back. The payment's
	// amount_refunded moves without an event of its own.
	r = s.refund(m, ok, "ref-ok", `{"amount":"30.00","reason":"one item returned"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	refundOK := r.json(t)["id"].(string)
	refunded(refundOK, "succeeded")
	want[refundOK] = []string{"refund.succeeded"}

	s.setFaults(`{"rules":[{"on":"refund","action":"decline","count":1}]}`)
	r = s.refund(m, ok, "ref-declined", `{"amount":"10.00"}`)
	require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Body)
	refundDeclined := r.json(t)["id"].(string)
	refunded(refundDeclined, "failed")
	want[refundDeclined] = []string{"refund.failed"}

	s.setFaults(`{"rules":[{"on":"refund","action":"drop_response","count":1}]}`)
	r = s.refund(m, ok, "ref-lost", `{"amount":"20.00"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	refundLost := r.json(t)["id"].(string)
	refunded(refundLost, "unknown")
	settle(workflows.RefundWorkflowID(mid, "ref-lost"), workflows.OutcomeCharged)
	refunded(refundLost, "succeeded")
	want[refundLost] = []string{"refund.unknown", "refund.succeeded"}

	// Manual payments: authorized, then captured in part; authorized, then canceled;
	// authorized, its capture's answer lost, then settled as captured.
	captured, _, _ := s.authorize(m, "man-cap", "40.00", "100.00")
	paid(captured, "requires_capture")
	require.Equal(t, http.StatusCreated, s.command(m, captured, "capture", "man-cap-1", `{"amount":"25.00"}`).Status)
	paid(captured, "succeeded")
	want[captured] = []string{"payment.requires_capture", "payment.captured"}

	canceled, _, _ := s.authorize(m, "man-cancel", "15.00", "100.00")
	paid(canceled, "requires_capture")
	require.Equal(t, http.StatusOK, s.command(m, canceled, "cancel", "man-cancel-1", "").Status)
	paid(canceled, "canceled")
	want[canceled] = []string{"payment.requires_capture", "payment.canceled"}

	lostCapture, _, _ := s.authorize(m, "man-lost", "30.00", "100.00")
	paid(lostCapture, "requires_capture")
	s.setFaults(`{"rules":[{"on":"capture","action":"drop_response","count":1}]}`)
	r = s.command(m, lostCapture, "capture", "man-lost-1", "")
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	paid(lostCapture, "unknown")
	settle(workflows.PaymentWorkflowID(mid, "man-lost"), workflows.OutcomeCharged)
	paid(lostCapture, "succeeded")
	want[lostCapture] = []string{"payment.requires_capture", "payment.unknown", "payment.captured"}

	events := 0
	for _, types := range want {
		events += len(types)
	}
	require.Eventually(t, func() bool { return hook.Count() >= events }, 30*time.Second, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond) // nothing more comes

	got := map[string][]string{}
	data := map[string][][]byte{}
	ids := map[string]bool{}
	for _, req := range hook.Requests() {
		merchantVerifies(t, m.WebhookSecret, req)
		require.Equal(t, "application/json", req.ContentType)
		require.Equal(t, "kasa-webhooks/1", req.Header.Get("User-Agent"))
		var w struct {
			ID        string          `json:"id"`
			Type      string          `json:"type"`
			CreatedAt string          `json:"created_at"`
			Data      json.RawMessage `json:"data"`
		}
		dec := json.NewDecoder(bytes.NewReader(req.Body))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&w), "%s", req.Body)
		require.False(t, ids[w.ID], "event id %s sent for two events", w.ID)
		ids[w.ID] = true
		require.Equal(t, w.ID, req.Header.Get("Kasa-Event-Id"))
		require.Equal(t, w.Type, req.Header.Get("Kasa-Event-Type"))
		var res struct {
			ID, Status string
			UpdatedAt  string `json:"updated_at"`
		}
		require.NoError(t, json.Unmarshal(w.Data, &res))
		_, err := time.Parse(time.RFC3339Nano, w.CreatedAt)
		require.NoError(t, err, "created_at %q", w.CreatedAt)
		require.Equal(t, res.UpdatedAt, w.CreatedAt, "%s: created_at is when the change was committed, as the resource's updated_at", w.Type)
		got[res.ID] = append(got[res.ID], w.Type)
		data[res.ID] = append(data[res.ID], w.Data)
	}
	require.Equal(t, want, got, "each state change once, in the order it happened")
	require.Len(t, ids, events)
	for id, bodies := range data {
		require.Len(t, bodies, len(sn[id]), "resource %s", id)
		for i := range bodies {
			require.Equal(t, string(sn[id][i]), string(bodies[i]), "resource %s, event %d: data is the resource as GET answered it then", id, i+1)
		}
	}

	// The operators' view lists every one of them, delivered on its first attempt; a merchant
	// that does not exist has no deliveries to list.
	list := s.do("GET", "/admin/v1/merchants/"+m.ID+"/deliveries?limit=200", adminToken, "")
	require.Equal(t, http.StatusOK, list.Status, "%s", list.Body)
	var listed struct {
		Deliveries []struct {
			ID, Status string
			Attempts   []json.RawMessage
		}
	}
	require.NoError(t, json.Unmarshal(list.Body, &listed))
	require.Len(t, listed.Deliveries, events)
	for _, d := range listed.Deliveries {
		require.True(t, ids[d.ID], "delivery %s is an event the merchant got", d.ID)
		require.Equal(t, "delivered", d.Status)
		require.Len(t, d.Attempts, 1)
	}
	requireProblem(t, s.do("GET", "/admin/v1/merchants/"+uuid.NewString()+"/deliveries", adminToken, ""), http.StatusNotFound, "not_found")
	requireVerified(t)
}

// `kasa relay` with the documented defaults, as a merchant's endpoints see it: a 500 is sent
// again 5–10 s later, a connection closed without an answer too; an endpoint that hangs is given
// up on after 10 s and sent again 5–10 s after that; a slow 2xx within the 10 s is delivered once;
// every attempt carries the same event id and the same bytes; a hanging merchant does not hold up
// another's webhook; a merchant without a webhook_url gets nothing and leaves nothing pending; and
// SIGTERM stops the relay cleanly.
func TestWebhookRetriesAndTimeoutsOfAKasaRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newCrashStack(t, crashConfig{capability: "idempotent"})
	s.start()
	relay, _, _ := s.startRelay()

	var gaveUp time.Time // when kasa gave up the hanging endpoint's first request
	firstOnly := func(first func(w http.ResponseWriter, r *http.Request)) func(int, http.ResponseWriter, *http.Request) {
		return func(n int, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				first(w, r)
			}
		}
	}
	hooks := map[string]*testkit.Hook{
		"flaky": newHookAnswering(t, firstOnly(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) })),
		"closer": newHookAnswering(t, firstOnly(func(w http.ResponseWriter, _ *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		})),
		"hang": newHookAnswering(t, firstOnly(func(_ http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
			gaveUp = time.Now()
		})),
		"slow": newHookAnswering(t, firstOnly(func(http.ResponseWriter, *http.Request) { time.Sleep(3 * time.Second) })),
		"fast": newHookAnswering(t, nil),
	}
	merchants := map[string]merchant{}
	create := func(name, body string) {
		r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, body)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		merchants[name] = merchant{ID: r.json(t)["id"].(string), APIKey: r.json(t)["api_key"].(string), WebhookSecret: r.json(t)["webhook_secret"].(string)}
	}
	for name, h := range hooks {
		create(name, `{"name":"`+name+`","webhook_url":"`+h.URL+`"}`)
	}
	create("quiet", `{"name":"quiet","webhook_url":""}`)
	paymentOf := map[string]string{}
	pay := func(name string) time.Time {
		m := merchants[name]
		acct := s.account(m, "TRY", "100.00")
		r, err := s.pay(m, "p-"+name, payBody("inv-"+name, "10.00", "TRY", acct))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		paymentOf[name] = r.json(t)["id"].(string)
		return time.Now()
	}
	for _, name := range []string{"hang", "flaky", "closer", "slow", "quiet"} {
		pay(name)
	}
	require.Eventually(t, func() bool { return hooks["hang"].Count() == 1 }, 20*time.Second, 20*time.Millisecond)
	paidFast := pay("fast")
	require.Eventually(t, func() bool { return hooks["fast"].Count() == 1 }, 5*time.Second, 20*time.Millisecond,
		"another merchant's webhook does not wait for the hanging endpoint")
	require.Less(t, hooks["fast"].Requests()[0].At.Sub(paidFast), 5*time.Second)

	require.Eventually(t, func() bool {
		return hooks["flaky"].Count() == 2 && hooks["closer"].Count() == 2 && hooks["hang"].Count() == 2
	}, 45*time.Second, 50*time.Millisecond, "flaky %d, closer %d, hang %d", hooks["flaky"].Count(), hooks["closer"].Count(), hooks["hang"].Count())
	time.Sleep(2 * time.Second) // nothing more comes

	within := func(what string, d, lo, hi time.Duration) {
		t.Helper()
		require.True(t, d >= lo && d <= hi, "%s: %s, want %s–%s", what, d, lo, hi)
	}
	const slack = 1500 * time.Millisecond // a poll, a loaded machine
	for name, h := range hooks {
		reqs := h.Requests()
		switch name {
		case "flaky", "closer":
			require.Len(t, reqs, 2, name)
			within(name+": the retry after the first failure", reqs[1].At.Sub(reqs[0].At), 5*time.Second, 10*time.Second+slack)
		case "hang":
			require.Len(t, reqs, 2, name)
			require.False(t, gaveUp.IsZero())
			within("hang: given up after the timeout", gaveUp.Sub(reqs[0].At), 10*time.Second-slack, 10*time.Second+slack)
			within("hang: the retry after the timeout", reqs[1].At.Sub(gaveUp), 5*time.Second-slack, 10*time.Second+slack)
		default:
			require.Len(t, reqs, 1, "%s: acknowledged on its first attempt", name)
		}
		for _, r := range reqs {
			merchantVerifies(t, merchants[name].WebhookSecret, r)
			require.Equal(t, reqs[0].EventID, r.EventID, "%s: the same event id on every attempt", name)
			require.Equal(t, string(reqs[0].Body), string(r.Body), "%s: the same bytes on every attempt", name)
		}
		ds, err := s.st.PaymentDeliveries(ctx, mustUUID(t, paymentOf[name]))
		require.NoError(t, err)
		require.Len(t, ds, 1)
		require.Equal(t, reqs[0].EventID, ds[0].ID.String())
		require.Eventually(t, func() bool {
			d, err := s.st.Delivery(ctx, ds[0].ID)
			return err == nil && d.Status == "delivered" && len(d.Attempts) == len(reqs)
		}, 5*time.Second, 20*time.Millisecond, name)
	}
	d, err := s.st.PaymentDeliveries(ctx, mustUUID(t, paymentOf["hang"]))
	require.NoError(t, err)
	require.Equal(t, "no answer within 10s", d[0].Attempts[0].Error)
	quiet, err := s.st.PaymentDeliveries(ctx, mustUUID(t, paymentOf["quiet"]))
	require.NoError(t, err)
	require.Len(t, quiet, 1)
	require.Equal(t, "skipped", string(quiet[0].Status))
	require.Empty(t, quiet[0].Attempts)

	relay.stopCleanly(15 * time.Second)
	s.verify()
}

// newHookAnswering is a merchant's endpoint recording every request; respond (nil: 200) answers
// the n-th request, from 1, and answers 200 when it writes nothing.
func newHookAnswering(t *testing.T, respond func(n int, w http.ResponseWriter, r *http.Request)) *testkit.Hook {
	t.Helper()
	return testkit.NewHook(t, testkit.HookOptions{EventIDHeader: "Kasa-Event-Id", SignatureHeader: "Kasa-Signature", Respond: respond})
}

// Secret rotation as the merchant's endpoint sees it: after two rotations within the overlap,
// a webhook carries the newest secret's signature and the one it replaced, never the first
// secret's; after a rotation with revoke_previous=true it carries the new secret's alone.
// Not parallel: the event pipeline publishes every outbox row of the shared database.
func TestWebhookSignaturesThroughRotationsAndARevocation(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	hook := newSink(t)
	startEventPipeline(t)
	m := s.newHookedMerchant(hook.URL)
	acct := s.newAccount(m, "TRY", "50.00")
	rotate := func(query string) string {
		t.Helper()
		r := s.do("POST", "/admin/v1/merchants/"+m.ID+"/webhook-secret"+query, adminToken, "")
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		return r.json(t)["webhook_secret"].(string)
	}
	payAndHear := func(key string) testkit.HookRequest {
		t.Helper()
		n := hook.Count()
		r := s.pay(m, key, payBody("inv-"+key, "1.00", "TRY", acct))
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Eventually(t, func() bool { return hook.Count() == n+1 }, 30*time.Second, 20*time.Millisecond)
		return hook.Requests()[n]
	}

	first := m.WebhookSecret
	second := rotate("")
	third := rotate("")
	got := payAndHear("after-two")
	kasaSignatures(t, got.Signature, got.Body, third, second)
	merchantVerifies(t, third, got)
	merchantVerifies(t, second, got)
	require.NotContains(t, got.Signature, hex.EncodeToString(hmacOf(first, got)), "the first secret signs no more")

	fourth := rotate("?revoke_previous=true")
	got = payAndHear("after-revoke")
	kasaSignatures(t, got.Signature, got.Body, fourth)
	require.NotContains(t, got.Signature, hex.EncodeToString(hmacOf(third, got)), "a revoked secret signs nothing")
}

// hmacOf is the signature a secret would give a webhook request.
func hmacOf(secret string, r testkit.HookRequest) []byte {
	ts, _, _ := strings.Cut(strings.TrimPrefix(r.Signature, "t="), ",")
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(r.Body)
	return mac.Sum(nil)
}

// `kasa relay` with an external NATS that is SIGKILLed around payments' commits, once keeping
// its store and then losing all of it (a power loss): every payment's event still reaches the
// merchant, exactly once (by event id), wherever the kill fell between the commit, the broker's
// acknowledgement and the webhook consumer.
func TestWebhooksSurviveABrokerKilledAndItsStoreLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newCrashStack(t, crashConfig{capability: "idempotent"})
	s.start()
	natsPort, err := devenv.FreePort()
	require.NoError(t, err)
	monitor, err := devenv.FreePort()
	require.NoError(t, err)
	bin, err := devenv.FindTool("nats-server", "nats-server")
	require.NoError(t, err)
	natsDir := filepath.Join(s.dir, "nats")
	nats, err := devenv.StartNATS(ctx, devenv.NewSupervisor(s.dir, nil), bin, natsDir, natsPort, monitor)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nats.Stop(5 * time.Second) })
	relay, _, metricsAddr := s.startRelay("KASA_NATS_URL", fmt.Sprintf("nats://127.0.0.1:%d", natsPort), "KASA_EVENTS_REDELIVER_AFTER", "30s")
	c, err := pgx.Connect(ctx, s.dbURL)
	require.NoError(t, err)
	defer c.Close(ctx)

	hook := newHookAnswering(t, nil)
	r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":"Broker","webhook_url":%q}`, hook.URL))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	m := merchant{ID: r.json(t)["id"].(string), APIKey: r.json(t)["api_key"].(string), WebhookSecret: r.json(t)["webhook_secret"].(string)}
	acct := s.account(m, "TRY", "100.00")
	var payments []string
	pay := func() {
		t.Helper()
		i := len(payments)
		r, err := s.pay(m, fmt.Sprint("b-", i), payBody(fmt.Sprint("inv-b-", i), "1.00", "TRY", acct))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		payments = append(payments, r.json(t)["id"].(string))
	}
	restart := func(loseStore bool) {
		t.Helper()
		require.NoError(t, nats.Kill())
		if loseStore {
			require.NoError(t, os.RemoveAll(filepath.Join(natsDir, "jetstream")))
		}
		require.NoError(t, nats.Resume())
	}
	received := func() map[string][]string { // payment id -> event ids received
		out := map[string][]string{}
		for _, req := range hook.Requests() {
			w := testkit.DecodeWebhook(t, req.Body)
			out[w.Data.ID] = append(out[w.Data.ID], w.ID)
		}
		return out
	}

	pay()
	require.Eventually(t, func() bool { return hook.Count() == 1 }, 30*time.Second, 20*time.Millisecond)
	// Kills at different points after a commit: before the relay published, between its publish
	// and the consumer, after the delivery; and a payment made while the broker is down.
	for i, loseStore := range []bool{false, false, true, true, true} {
		pay()
		time.Sleep(time.Duration(i*15) * time.Millisecond)
		restart(loseStore)
		if i%2 == 1 {
			pay()
		}
	}
	lostAt := time.Now()
	// Acknowledged, then lost: the webhook consumer is paused while the broker takes two events,
	// then the broker loses its whole store before the consumer had them.
	require.Eventually(t, func() bool {
		nc, js, err := outbox.Connect(fmt.Sprintf("nats://127.0.0.1:%d", natsPort), "test", outbox.BrokerAuth{})
		if err != nil {
			return false
		}
		defer nc.Close()
		_, err = js.PauseConsumer(ctx, outbox.StreamName, outbox.WebhooksConsumer, time.Now().Add(time.Hour))
		return err == nil
	}, 2*time.Minute, 100*time.Millisecond, "the broker and the webhook consumer are back")
	t.Logf("consumer back after %s", time.Since(lostAt))
	pay()
	pay()
	require.Eventually(t, func() bool {
		var unpublished int
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregate_id = ANY($1) AND published_at IS NULL`, payments[len(payments)-2:]).Scan(&unpublished))
		return unpublished == 0
	}, 30*time.Second, 20*time.Millisecond, "the broker acknowledged both")
	time.Sleep(500 * time.Millisecond)
	// The events of the payments before may still be on their way to the merchant (the broker's
	// restarts held them up): only these two's are looked for.
	for _, id := range payments[len(payments)-2:] {
		require.NotContains(t, received(), id, "the paused consumer took nothing")
		ds, err := s.st.PaymentDeliveries(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Empty(t, ds, "the paused consumer took nothing")
	}
	restart(true)
	pay()
	require.Eventually(t, func() bool { return len(received()) == len(payments) }, 3*time.Minute, 100*time.Millisecond,
		"every payment's event arrives: %d of %d\n%s", len(received()), len(payments), testkit.Tail(relay.log, 30))
	time.Sleep(2 * time.Second)
	for _, id := range payments {
		ids := received()[id]
		require.Len(t, ids, 1, "payment %s: once", id)
		ds, err := s.st.PaymentDeliveries(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Len(t, ds, 1)
		require.Equal(t, ids[0], ds[0].ID.String())
	}
	for _, req := range hook.Requests() {
		merchantVerifies(t, m.WebhookSecret, req)
	}
	metrics := s.mustCall("GET", "http://"+metricsAddr+"/metrics", "", "")
	require.GreaterOrEqual(t, metricSum(string(metrics.Body), "kasa_outbox_republished_total"), 2.0, "the two lost events were published again")
	relay.stopCleanly(15 * time.Second)
	s.verify()
}

// hungAttempt is a stack with a `kasa relay` whose merchant's endpoint hangs on its first
// request: a payment's first webhook attempt is at the merchant.
type hungAttempt struct {
	s         *crashStack
	relay     *proc
	relayEnv  []string
	hook      *testkit.Hook
	m         merchant
	paymentID uuid.UUID
}

// startHungAttempt makes that stack, the payment's key named key, and returns once the attempt
// hangs. Later requests are answered by then when given (else 200).
func startHungAttempt(t *testing.T, key string, then ...func(n int, w http.ResponseWriter)) hungAttempt {
	t.Helper()
	s := newCrashStack(t, crashConfig{capability: "idempotent"})
	s.start()
	relay, relayEnv, _ := s.startRelay()
	hook := newHookAnswering(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch {
		case n == 1:
			<-r.Context().Done()
		case len(then) > 0:
			then[0](n, w)
		}
	})
	r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":%q,"webhook_url":%q}`, key, hook.URL))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	m := merchant{ID: r.json(t)["id"].(string), APIKey: r.json(t)["api_key"].(string), WebhookSecret: r.json(t)["webhook_secret"].(string)}
	acct := s.account(m, "TRY", "100.00")
	r, err := s.pay(m, key, payBody("inv-"+key, "1.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	paymentID := mustUUID(t, r.json(t)["id"].(string))
	require.Eventually(t, func() bool { return hook.Count() == 1 }, 30*time.Second, 20*time.Millisecond)
	return hungAttempt{s: s, relay: relay, relayEnv: relayEnv, hook: hook, m: m, paymentID: paymentID}
}

// SIGTERM to `kasa relay` while a webhook attempt hangs at the merchant: the relay stops at once
// and cleanly, the attempt is logged as cut short, and the next relay sends the same event (same
// id, same bytes) right away, not after the attempt's lease.
func TestRelaySIGTERMMidAttemptHandsTheDeliveryOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := startHungAttempt(t, "drain")
	s, relay, relayEnv, hook, m, paymentID := h.s, h.relay, h.relayEnv, h.hook, h.m, h.paymentID

	stopped := time.Now()
	relay.stopCleanly(5 * time.Second)
	ds, err := s.st.PaymentDeliveries(ctx, paymentID)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, "pending", string(ds[0].Status))
	require.Len(t, ds[0].Attempts, 1)
	require.Contains(t, ds[0].Attempts[0].Error, "aborted")

	relay = startProc(t, s.dir, s.bin, "relay", relayEnv, "relay")
	require.Eventually(t, func() bool { return hook.Count() == 2 }, 20*time.Second, 20*time.Millisecond,
		"the next relay sends it again\n%s", testkit.Tail(relay.log, 20))
	reqs := hook.Requests()
	require.Less(t, reqs[1].At.Sub(stopped), 20*time.Second, "not after the 40 s lease")
	require.Equal(t, reqs[0].EventID, reqs[1].EventID)
	require.Equal(t, string(reqs[0].Body), string(reqs[1].Body))
	merchantVerifies(t, m.WebhookSecret, reqs[1])
	require.Eventually(t, func() bool {
		d, err := s.st.Delivery(ctx, ds[0].ID)
		return err == nil && d.Status == "delivered"
	}, 10*time.Second, 20*time.Millisecond)
	relay.stopCleanly(15 * time.Second)
}

// An attempt SIGTERM cut is kasa's stop, not the merchant's failure: it is logged as aborted,
// but the delivery's attempt count and backoff step stay as they were. The merchant's 500 to the
// next relay's send is its first failure (5-10 s to the next attempt, not the 10-20 s of a
// second), and the delivery ends delivered after two attempts, numbered 1 and 2.
func TestRelaySIGTERMMidAttemptIsNotCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := startHungAttempt(t, "uncounted", func(n int, w http.ResponseWriter) {
		if n == 2 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	s, relay, relayEnv, hook, paymentID := h.s, h.relay, h.relayEnv, h.hook, h.paymentID

	relay.stopCleanly(5 * time.Second)
	ds, err := s.st.PaymentDeliveries(ctx, paymentID)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	d := ds[0]
	require.Equal(t, "pending", string(d.Status))
	require.Zero(t, d.AttemptCount, "the cut attempt is not counted")
	require.Nil(t, d.ClaimedUntil)
	require.False(t, d.NextAttemptAt.After(time.Now()), "due again at once")
	require.Len(t, d.Attempts, 1)
	require.Contains(t, d.Attempts[0].Error, "aborted")

	relay = startProc(t, s.dir, s.bin, "relay", relayEnv, "relay")
	require.Eventually(t, func() bool {
		d, err := s.st.Delivery(ctx, ds[0].ID)
		return err == nil && d.Status == "delivered"
	}, 40*time.Second, 50*time.Millisecond, "sent again, refused once, then delivered\n%s", testkit.Tail(relay.log, 20))
	reqs := hook.Requests()
	require.Len(t, reqs, 3)
	for _, r := range reqs[1:] {
		require.Equal(t, reqs[0].EventID, r.EventID)
		require.Equal(t, string(reqs[0].Body), string(r.Body))
	}
	wait := reqs[2].At.Sub(reqs[1].At)
	require.True(t, wait >= 4*time.Second && wait <= 10500*time.Millisecond, "the first failure's backoff (5-10 s), got %s", wait)
	d, err = s.st.Delivery(ctx, ds[0].ID)
	require.NoError(t, err)
	require.Equal(t, 2, d.AttemptCount, "the merchant's two answers")
	var numbers []int
	for _, a := range d.Attempts {
		numbers = append(numbers, a.Attempt)
	}
	require.Equal(t, []int{1, 1, 2}, numbers, "the aborted attempt, then the merchant's 500 and 2xx")
	require.Contains(t, d.Attempts[0].Error, "aborted")
	require.Equal(t, 500, d.Attempts[1].StatusCode)
	relay.stopCleanly(15 * time.Second)
}

// SIGTERM to `kasa relay` while its sender's claim is in flight: the claim has committed at the
// database (the delivery leased, its attempt counted) and the relay has not read its rows yet
// (here a proxy holds the database's answers that carry the merchant's URL). The stop is kasa's, as one mid-attempt: the
// delivery is due again at once, its attempt uncounted, and the next relay sends it right away,
// not after the 40 s lease.
func TestRelaySIGTERMMidClaimHandsTheDeliveryOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newCrashStack(t, crashConfig{capability: "idempotent"})
	s.start()
	u, err := url.Parse(s.dbURL)
	require.NoError(t, err)
	db := newTCPProxy(t, u.Host)
	u.Host = db.addr()
	relay, relayEnv, _ := s.startRelay("KASA_DATABASE_URL", u.String())
	hook := newHookAnswering(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError) // the next attempt is 5-10 s away
		}
	})
	r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":"claim","webhook_url":%q}`, hook.URL))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	m := merchant{ID: r.json(t)["id"].(string), APIKey: r.json(t)["api_key"].(string), WebhookSecret: r.json(t)["webhook_secret"].(string)}
	acct := s.account(m, "TRY", "100.00")
	r, err = s.pay(m, "claim", payBody("inv-claim", "1.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	paymentID := mustUUID(t, r.json(t)["id"].(string))
	var id uuid.UUID
	require.Eventually(t, func() bool {
		ds, err := s.st.PaymentDeliveries(ctx, paymentID)
		if err != nil || len(ds) != 1 || len(ds[0].Attempts) != 1 {
			return false
		}
		id = ds[0].ID
		return ds[0].AttemptCount == 1 && ds[0].ClaimedUntil == nil && ds[0].NextAttemptAt.After(time.Now())
	}, 30*time.Second, 20*time.Millisecond, "the merchant's 500 is recorded")

	db.holdAnswers(hook.URL)
	require.Eventually(t, func() bool {
		d, err := s.st.Delivery(ctx, id)
		return err == nil && d.AttemptCount == 2 && d.ClaimedUntil != nil
	}, 20*time.Second, 20*time.Millisecond, "the second attempt's claim commits")
	require.NoError(t, syscall.Kill(relay.pid(), syscall.SIGTERM))
	time.Sleep(time.Second)
	db.release()
	select {
	case <-relay.c.Done():
	case <-time.After(15 * time.Second):
		t.Fatalf("kasa relay did not stop within 15s of SIGTERM\n%s", testkit.Tail(relay.log, 30))
	}
	require.NoError(t, relay.c.Err(), "kasa relay exits 0 on SIGTERM\n%s", testkit.Tail(relay.log, 30))

	d, err := s.st.Delivery(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "pending", string(d.Status))
	require.Equal(t, 1, d.AttemptCount, "the claim the stop cut is not counted")
	require.Len(t, d.Attempts, 2)
	require.Contains(t, d.Attempts[1].Error, "aborted")
	require.Nil(t, d.ClaimedUntil, "no lease left to wait out")
	require.False(t, d.NextAttemptAt.After(time.Now()), "due again at once")
	require.Equal(t, 1, hook.Count())

	stopped := time.Now()
	relay = startProc(t, s.dir, s.bin, "relay", relayEnv, "relay")
	require.Eventually(t, func() bool {
		d, err := s.st.Delivery(ctx, id)
		return err == nil && d.Status == "delivered"
	}, 30*time.Second, 50*time.Millisecond, "the next relay sends it\n%s", testkit.Tail(relay.log, 20))
	reqs := hook.Requests()
	require.Len(t, reqs, 2)
	require.Less(t, reqs[1].At.Sub(stopped), 20*time.Second, "not after the 40 s lease")
	require.Equal(t, reqs[0].EventID, reqs[1].EventID)
	require.Equal(t, string(reqs[0].Body), string(reqs[1].Body))
	merchantVerifies(t, m.WebhookSecret, reqs[1])
	d, err = s.st.Delivery(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 2, d.AttemptCount, "the merchant's two answers")
	relay.stopCleanly(15 * time.Second)
}

// A payment's events reach a failing endpoint in order: payment.succeeded, committed while the
// merchant still refuses payment.unknown, is sent only once payment.unknown was acknowledged.
// Not parallel: the event pipeline publishes every outbox row of the shared database.
func TestWebhookOrderHoldsWhileTheEarlierEventIsRetried(t *testing.T) {
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	hook := newHookAnswering(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= 4 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	startEventPipeline(t)
	m := s.newHookedMerchant(hook.URL)
	acct := s.newAccount(m, "TRY", "100.00")
	p := s.payUnknown(m, "ordered", payBody("inv-ordered", "10.00", "TRY", acct), "drop_response")
	require.Eventually(t, func() bool { return hook.Count() >= 1 }, 30*time.Second, 20*time.Millisecond)
	_, err := workflows.Starter{Client: tc, TaskQueue: s.queue}.Settle(ctx, workflows.PaymentWorkflowID(mustUUID(t, m.ID), "ordered"),
		workflows.Settlement{Outcome: workflows.OutcomeCharged, Note: "test"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ds, err := db.PaymentDeliveries(ctx, p.ID)
		return err == nil && len(ds) == 2 && ds[0].Status == "delivered" && ds[1].Status == "delivered"
	}, 30*time.Second, 20*time.Millisecond)
	var types []string
	for _, r := range hook.Requests() {
		types = append(types, testkit.DecodeWebhook(t, r.Body).Type)
	}
	require.Equal(t, []string{"payment.unknown", "payment.unknown", "payment.unknown", "payment.unknown", "payment.unknown", "payment.succeeded"}, types)
}

// Retention as `kasa relay` applies it (KASA_EVENTS_RETENTION): finished deliveries (delivered,
// skipped) older than it go with their attempts, the outbox and inbox rows of their events too;
// a delivery still owed to its merchant stays however old, and is still sent; nothing purged
// reaches a merchant again.
func TestRelayRetentionOfWebhookRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newCrashStack(t, crashConfig{capability: "idempotent"})
	s.start()
	relay, relayEnv, _ := s.startRelay("KASA_EVENTS_RETENTION", "1h")

	var failing atomic.Bool
	failing.Store(true)
	ok := newHookAnswering(t, nil)
	down := newHookAnswering(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusBadGateway)
		}
	})
	merchants := map[string]merchant{}
	for name, body := range map[string]string{
		"ok": `{"name":"ok","webhook_url":"` + ok.URL + `"}`, "down": `{"name":"down","webhook_url":"` + down.URL + `"}`, "quiet": `{"name":"quiet"}`,
	} {
		r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, body)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		merchants[name] = merchant{ID: r.json(t)["id"].(string), APIKey: r.json(t)["api_key"].(string)}
	}
	pay := func(name, key string) uuid.UUID {
		t.Helper()
		m := merchants[name]
		r, err := s.pay(m, key, payBody("inv-"+key, "1.00", "TRY", s.account(m, "TRY", "10.00")))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		return mustUUID(t, r.json(t)["id"].(string))
	}
	status := func(id uuid.UUID) string {
		ds, err := s.st.PaymentDeliveries(ctx, id)
		require.NoError(t, err)
		if len(ds) == 0 {
			return "gone"
		}
		return string(ds[0].Status)
	}
	old := map[string]uuid.UUID{"ok": pay("ok", "old-ok"), "down": pay("down", "old-down"), "quiet": pay("quiet", "old-quiet")}
	require.Eventually(t, func() bool {
		return status(old["ok"]) == "delivered" && status(old["quiet"]) == "skipped" && down.Count() >= 1
	}, 30*time.Second, 50*time.Millisecond)
	relay.stopCleanly(15 * time.Second)

	// Two hours pass for these rows.
	c, err := pgx.Connect(ctx, s.dbURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	ids := []uuid.UUID{old["ok"], old["down"], old["quiet"]}
	for _, q := range []string{
		`UPDATE outbox SET created_at = created_at - interval '2 hours', published_at = published_at - interval '2 hours' WHERE aggregate_id = ANY($1)`,
		`UPDATE inbox SET processed_at = processed_at - interval '2 hours' WHERE message_id IN (SELECT id FROM outbox WHERE aggregate_id = ANY($1))`,
		`UPDATE webhook_deliveries SET created_at = created_at - interval '2 hours', updated_at = updated_at - interval '2 hours' WHERE aggregate_id = ANY($1)`,
	} {
		_, err := c.Exec(ctx, q, ids)
		require.NoError(t, err)
	}
	young := pay("ok", "young-ok")
	rowsOf := func(id uuid.UUID) (outbox, inbox int) {
		require.NoError(t, c.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox WHERE aggregate_id = $1),
			(SELECT count(*) FROM inbox WHERE message_id IN (SELECT id FROM webhook_deliveries WHERE aggregate_id = $1))`, id).Scan(&outbox, &inbox))
		return outbox, inbox
	}

	relay = startProc(t, s.dir, s.bin, "relay", relayEnv, "relay")
	require.Eventually(t, func() bool { return status(old["ok"]) == "gone" && status(old["quiet"]) == "gone" }, 30*time.Second, 100*time.Millisecond,
		"finished deliveries older than the retention are deleted\n%s", testkit.Tail(relay.log, 20))
	var attempts int
	require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM webhook_attempts a LEFT JOIN webhook_deliveries d ON d.id = a.delivery_id WHERE d.id IS NULL`).Scan(&attempts))
	require.Zero(t, attempts, "their attempts go with them")
	require.Eventually(t, func() bool { o, i := rowsOf(old["ok"]); return o == 0 && i == 0 }, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, "pending", status(old["down"]), "a delivery still owed is kept however old")
	require.Eventually(t, func() bool { return status(young) == "delivered" }, 30*time.Second, 50*time.Millisecond)
	o, i := rowsOf(young)
	require.Equal(t, []int{1, 1}, []int{o, i}, "a young event's outbox and inbox rows stay")

	failing.Store(false)
	require.Eventually(t, func() bool { return status(old["down"]) == "delivered" }, 90*time.Second, 100*time.Millisecond,
		"the old pending delivery is still sent")
	time.Sleep(2 * time.Second)
	require.Equal(t, 2, ok.Count(), "nothing purged reaches the merchant again")
	relay.stopCleanly(15 * time.Second)
}

// `kasa relay` SIGKILLed while a webhook attempt is at the merchant: the attempt is never
// recorded, its lease (the 10 s timeout + 30 s) runs out, and the next relay sends the same event
// (same id, same bytes) as the next attempt, numbered on.
func TestRelaySIGKILLMidAttemptIsSentAgainAfterTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := startHungAttempt(t, "killed")
	s, relay, relayEnv, hook, m, paymentID := h.s, h.relay, h.relayEnv, h.hook, h.m, h.paymentID
	relay.kill()
	relay = startProc(t, s.dir, s.bin, "relay", relayEnv, "relay")

	require.Eventually(t, func() bool { return hook.Count() == 2 }, 60*time.Second, 100*time.Millisecond,
		"sent again once the lease ran out\n%s", testkit.Tail(relay.log, 20))
	reqs := hook.Requests()
	within := reqs[1].At.Sub(reqs[0].At)
	require.True(t, within >= 39*time.Second && within <= 45*time.Second, "sent again %s after the first attempt, want ~40 s", within)
	require.Equal(t, reqs[0].EventID, reqs[1].EventID)
	require.Equal(t, string(reqs[0].Body), string(reqs[1].Body))
	merchantVerifies(t, m.WebhookSecret, reqs[1])
	ds, err := s.st.PaymentDeliveries(ctx, paymentID)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Eventually(t, func() bool {
		d, err := s.st.Delivery(ctx, ds[0].ID)
		return err == nil && d.Status == "delivered" && d.AttemptCount == 2 && len(d.Attempts) == 1 && d.Attempts[0].Attempt == 2
	}, 10*time.Second, 20*time.Millisecond, "the killed attempt is not logged; the next is attempt 2")
	relay.stopCleanly(15 * time.Second)
}
