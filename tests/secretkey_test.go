package tests

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// A master key rotation as docs/deployment.md tells it: the relay and the API restart with the
// new KASA_SECRET_KEY and the old one as KASA_SECRET_KEY_PREVIOUS and keep signing webhooks with
// the merchant's secret; `kasa rotate-secret-key` re-seals the secrets under the new key; then the
// new key alone signs them, and a process still on the old key is refused at start.
func TestMasterKeyRotation(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "idempotent"})
	s.start()
	oldKey, newKey := testkit.SecretKeyHex, hex.EncodeToString([]byte(strings.Repeat("n", 32)))
	startRelay := func(keys ...string) *proc {
		p, _, _ := s.startRelay(keys...)
		return p
	}
	relay := startRelay()

	hook := newSink(t)
	r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":"Rotated","webhook_url":%q}`, hook.URL))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	m := merchant{ID: r.json(t)["id"].(string), APIKey: r.json(t)["api_key"].(string)}
	secret := r.json(t)["webhook_secret"].(string)
	acct := s.account(m, "TRY", "100.00")
	paySigned := func(key string) {
		t.Helper()
		before := hook.Count()
		r, err := s.pay(m, key, payBody("inv-"+key, "1.00", "TRY", acct))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Eventually(t, func() bool { return hook.Count() > before }, 30*time.Second, 50*time.Millisecond,
			"the webhook of %s\n%s", key, testkit.Tail(relay.log, 20))
		got := hook.Requests()[hook.Count()-1]
		require.NoError(t, outbox.Verify(secret, got.Signature, got.Body, time.Minute), "signed with the merchant's secret")
	}
	paySigned("before-rotation")

	// Step 1: the new key, the old one as previous.
	both := []string{"KASA_SECRET_KEY", newKey, "KASA_SECRET_KEY_PREVIOUS", oldKey}
	relay.stopCleanly(30 * time.Second)
	s.api.stopCleanly(30 * time.Second)
	relay = startRelay(both...)
	s.startAPI(both...)
	paySigned("during-rotation")

	// Step 2: re-seal.
	out, code := runKasa(t, s.dir, s.bin, s.env(both...), "rotate-secret-key")
	require.Zero(t, code, "%s", out)
	require.Contains(t, out, "re-sealed the webhook secrets of")

	// Step 3: the new key alone.
	relay.stopCleanly(30 * time.Second)
	relay = startRelay("KASA_SECRET_KEY", newKey)
	paySigned("after-rotation")

	out, code = runKasa(t, s.dir, s.bin, s.env("KASA_RELAY_METRICS_ADDR", testkit.FreeAddr(t)), "relay")
	require.NotZero(t, code, "a relay on the old key must not start:\n%s", out)
	require.Contains(t, out, "KASA_SECRET_KEY differs")
}

// A bank that wants HTTP basic authentication gets it from the credentials in
// KASA_PROVIDER_URL, and the password stays out of the worker's log.
func TestProviderPasswordStaysOutOfTheWorkerLog(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{})
	const password = "pw-in-the-url"
	sim, err := url.Parse(s.simURL())
	require.NoError(t, err)
	forward := httputil.NewSingleHostReverseProxy(sim)
	var authorized atomic.Int64
	bank := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user, pw, ok := r.BasicAuth(); !ok || user != "kasa" || pw != password {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		authorized.Add(1)
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(bank.Close)
	s.providerURL = "http://kasa:" + password + "@" + strings.TrimPrefix(bank.URL, "http://")
	s.start()
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	s.paySucceeds(m, "basic-auth", acct)
	require.Positive(t, authorized.Load(), "the bank saw the URL's credentials")
	s.worker.waitLog("worker polling", 5*time.Second)
	log, err := os.ReadFile(s.worker.log)
	require.NoError(t, err)
	require.NotContains(t, string(log), password)
	require.Contains(t, string(log), "kasa:xxxxx@")
}
