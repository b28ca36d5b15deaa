package tests

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// A master key rotation's first step half done, as docs/deployment.md has it run: the relay and
// one API restarted with the new KASA_SECRET_KEY (the old one as KASA_SECRET_KEY_PREVIOUS), the
// other API still on the old key alone. A merchant created under an Idempotency-Key on either
// API is answered again, byte for byte, by the other: the creation's answer is the key's, and a
// retry may land on any instance. Each merchant's webhooks are signed with its secret, and
// `kasa rotate-secret-key` then finds everything sealed under a key it opens.
func TestMerchantCreationKeysAnswerOnEveryAPIMidRotation(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "idempotent"})
	oldKey, newKey := testkit.SecretKeyHex, hex.EncodeToString([]byte(strings.Repeat("r", 32)))
	both := []string{"KASA_SECRET_KEY", newKey, "KASA_SECRET_KEY_PREVIOUS", oldKey}
	s.startBanksim()
	s.startWorker()
	oldAddr := testkit.FreeAddr(t)
	oldAPI := startProc(t, s.dir, s.bin, "api-old", s.env("KASA_API_ADDR", oldAddr), "api")
	oldAPI.waitHTTP("http://" + oldAddr + "/readyz")
	relay, _, _ := s.startRelay(both...)
	s.startAPI(both...) // the API already on the new key
	newURL, oldURL := s.apiURL(), "http://"+oldAddr

	hook := newSink(t)
	for _, c := range []struct{ name, first, again string }{
		{"made on the new key", newURL, oldURL},
		{"made on the old key", oldURL, newURL},
	} {
		key := "mid-rotation-" + strings.ReplaceAll(c.name, " ", "-")
		body := fmt.Sprintf(`{"name":%q,"webhook_url":%q}`, c.name, hook.URL)
		first := s.mustCall("POST", c.first+"/admin/v1/merchants", adminToken, body, "Idempotency-Key", key)
		require.Equal(t, http.StatusCreated, first.Status, "%s: %s", c.name, first.Body)
		again := s.mustCall("POST", c.again+"/admin/v1/merchants", adminToken, body, "Idempotency-Key", key)
		require.Equal(t, http.StatusCreated, again.Status, "%s, answered by the other API: %s", c.name, again.Body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), c.name)
		require.Equal(t, string(first.Body), string(again.Body), c.name)

		m := merchant{ID: first.json(t)["id"].(string), APIKey: first.json(t)["api_key"].(string)}
		secret := first.json(t)["webhook_secret"].(string)
		acct := s.account(m, "TRY", "10.00")
		before := hook.Count()
		r, err := s.pay(m, key, payBody("inv-"+key, "1.00", "TRY", acct))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Eventually(t, func() bool { return hook.Count() > before }, 30*time.Second, 50*time.Millisecond,
			"%s: the webhook\n%s", c.name, testkit.Tail(relay.log, 20))
		got := hook.Requests()[hook.Count()-1]
		require.NoError(t, outbox.Verify(secret, got.Signature, got.Body, time.Minute), "%s: signed with the merchant's secret", c.name)
	}

	out, code := runKasa(t, s.dir, s.bin, s.env(both...), "rotate-secret-key")
	require.Zero(t, code, "%s", out)
	s.verify()
}

// KASA_WEBHOOK_ALLOW_PRIVATE set on the API and not yet on the relay (docs/deployment.md,
// "Settings the processes share"): the API registers a private webhook URL, and the relay,
// whose own setting refuses it, fails the delivery at once, naming the setting, without calling
// it or trying again. Redelivered once the relay agrees, the event reaches the merchant once.
func TestWebhookURLTheAPIAcceptsAndTheRelayRefuses(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "idempotent"})
	s.start() // the API allows private webhook URLs, as the tests' endpoints are on 127.0.0.1
	refusing, _, _ := s.startRelay("KASA_WEBHOOK_ALLOW_PRIVATE", "false")

	hook := newSink(t)
	r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":"Private","webhook_url":%q}`, hook.URL))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	m := merchant{ID: r.json(t)["id"].(string), APIKey: r.json(t)["api_key"].(string)}
	acct := s.account(m, "TRY", "10.00")
	paid, err := s.pay(m, "private-hook", payBody("private-hook", "1.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, paid.Status, "%s", paid.Body)

	delivery := func() map[string]any {
		t.Helper()
		list := s.mustCall("GET", s.apiURL()+"/admin/v1/merchants/"+m.ID+"/deliveries", adminToken, "")
		require.Equal(t, http.StatusOK, list.Status, "%s", list.Body)
		ds := list.json(t)["deliveries"].([]any)
		require.LessOrEqual(t, len(ds), 1, "%s", list.Body)
		if len(ds) == 0 { // not yet consumed from the broker
			return map[string]any{}
		}
		return ds[0].(map[string]any)
	}
	require.Eventually(t, func() bool { return delivery()["status"] == "failed" }, 30*time.Second, 50*time.Millisecond,
		"%v\n%s", delivery(), testkit.Tail(refusing.log, 20))
	d := delivery()
	require.Contains(t, d["last_error"], "KASA_WEBHOOK_ALLOW_PRIVATE", "%v", d)
	require.EqualValues(t, 1, d["attempt_count"], "not retried: %v", d)
	time.Sleep(time.Second)
	require.Zero(t, hook.Count(), "nothing reached the endpoint")
	require.EqualValues(t, 1, delivery()["attempt_count"])

	refusing.stopCleanly(30 * time.Second)
	s.startRelay()
	re := s.mustCall("POST", s.apiURL()+"/admin/v1/deliveries/"+d["id"].(string)+"/redeliver", adminToken, "")
	require.Less(t, re.Status, 300, "%s", re.Body)
	require.Eventually(t, func() bool { return delivery()["status"] == "delivered" }, 30*time.Second, 50*time.Millisecond, "%v", delivery())
	time.Sleep(time.Second)
	require.Equal(t, 1, hook.Count(), "delivered once")
	require.Equal(t, d["id"], hook.Requests()[0].EventID)
}

// The charge budget is the workers' (docs/deployment.md, "Money settings"): an API configured
// with a budget of ten minutes starts a payment that a worker with a budget of five seconds
// runs. A bank that keeps refusing the charge parks it unknown once the worker's budget is
// spent, its hold kept and no money moved at the bank.
func TestTheWorkersChargeBudgetGovernsAPaymentTheAPIStarted(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "idempotent", syncWait: "300ms"})
	s.startBanksim()
	s.worker = startProc(t, s.dir, s.bin, "worker", s.env("KASA_PROVIDER_CHARGE_BUDGET", "5s"), "worker")
	s.startAPI("KASA_PROVIDER_CHARGE_BUDGET", "10m")
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")

	s.setFaults(`{"rules":[{"on":"charge","action":"error_429"}]}`)
	start := time.Now()
	r, err := s.pay(m, "budget", payBody("budget", "10.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	id := r.json(t)["id"].(string)
	p := s.waitPayment(m, id, time.Now().Add(45*time.Second))
	require.Equal(t, "unknown", p["status"], "%v", p)
	require.Less(t, time.Since(start), 45*time.Second)
	require.Zero(t, s.simCount(id), "the bank moved no money")
	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{"100.00", "10.00"}, []string{balance, reserved}, "the unknown payment keeps its hold")
	s.verify()
}
