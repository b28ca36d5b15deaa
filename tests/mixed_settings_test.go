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
