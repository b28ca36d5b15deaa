package tests

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/testkit"
)

// What an attacker holding the processes' logs (at debug level) or a dump of the database learns
// of the credentials (docs/security.md): no API key, revoked or not, no webhook secret, current,
// previous or wiped, no admin token, no wrong credential a client sent, no KASA_SECRET_KEY; and
// no webhook URL's query string outside what the merchant registered (its delivery errors are
// redacted).
func TestNoCredentialReachesTheLogsOrTheDatabase(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{})
	debug := []string{"KASA_LOG_LEVEL", "debug"}
	s.sim = startProc(t, s.dir, s.bin, "banksim", s.env(debug...), "banksim")
	s.sim.waitHTTP(s.simURL() + "/_sim/healthz")
	s.worker = startProc(t, s.dir, s.bin, "worker", s.env(debug...), "worker")
	s.startAPI(debug...)
	relay, _, _ := s.startRelay(debug...)

	const hookToken = "hook-token-in-the-query-7f3a9c"
	const wrongKey, wrongAdmin = "sk_wrong_guess_0123456789abcdef", "adm_wrong_guess_0123456789abcdef0123"
	hook := newSink(t)
	create := func(url string) (id, apiKey, keyID, secret string) {
		t.Helper()
		r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":"Audited","webhook_url":%q}`, url))
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		m := r.json(t)
		return m["id"].(string), m["api_key"].(string), m["api_key_id"].(string), m["webhook_secret"].(string)
	}
	id, key1, key1ID, secret1 := create(hook.URL)
	// Nothing listens here: the delivery's error names the URL, which must come out redacted.
	downID, downKey, _, downSecret := create("http://" + testkit.FreeAddr(t) + "/hook?token=" + hookToken)

	r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants/"+id+"/api-keys", adminToken, "")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	key2 := r.json(t)["api_key"].(string)
	m := merchant{ID: id, APIKey: key1}
	acct := s.account(m, "TRY", "100.00")
	payOK := func(m merchant, key, acct string) string {
		t.Helper()
		r, err := s.pay(m, key, payBody("inv-"+key, "10.00", "TRY", acct))
		require.NoError(t, err)
		require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, r.Status, "%s", r.Body)
		p := s.waitPayment(m, r.json(t)["id"].(string), time.Now().Add(30*time.Second))
		require.Equal(t, "succeeded", p["status"], "%v", p)
		return p["id"].(string)
	}
	payOK(m, "leak-1", acct)
	r = s.mustCall("DELETE", s.apiURL()+"/admin/v1/merchants/"+id+"/api-keys/"+key1ID, adminToken, "")
	require.Equal(t, http.StatusNoContent, r.Status, "%s", r.Body)
	requireProblem(t, s.mustCall("GET", s.apiURL()+"/v1/accounts/"+acct, key1, ""), http.StatusUnauthorized, "unauthorized")

	var secrets []string
	for _, q := range []string{"", "?revoke_previous=true", ""} {
		r = s.mustCall("POST", s.apiURL()+"/admin/v1/merchants/"+id+"/webhook-secret"+q, adminToken, "")
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		secrets = append(secrets, r.json(t)["webhook_secret"].(string))
	}
	m.APIKey = key2
	paid := payOK(m, "leak-2", acct)
	r = s.mustCall("POST", s.apiURL()+"/v1/payments/"+paid+"/refunds", key2, `{"amount":"0.50"}`, "Idempotency-Key", "leak-refund")
	require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, r.Status, "%s", r.Body)
	down := merchant{ID: downID, APIKey: downKey}
	payOK(down, "leak-down", s.account(down, "TRY", "10.00"))

	requireProblem(t, s.mustCall("GET", s.apiURL()+"/v1/accounts/"+acct, wrongKey, ""), http.StatusUnauthorized, "unauthorized")
	requireProblem(t, s.mustCall("GET", s.apiURL()+"/admin/v1/audit", wrongAdmin, ""), http.StatusUnauthorized, "unauthorized")
	require.Equal(t, http.StatusOK, s.mustCall("GET", s.apiURL()+"/admin/v1/audit", adminToken, "").Status)

	// Both merchants' webhooks were tried: the signed ones arrived, the other failed on its URL.
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.dbURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	require.Eventually(t, func() bool { return hook.Count() >= 2 }, 30*time.Second, 50*time.Millisecond, "%s", testkit.Tail(relay.log, 20))
	require.Eventually(t, func() bool {
		var n int
		err := c.QueryRow(ctx, `SELECT count(*) FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id
			WHERE d.merchant_id = $1 AND a.error IS NOT NULL`, downID).Scan(&n)
		return err == nil && n > 0
	}, 30*time.Second, 50*time.Millisecond, "%s", testkit.Tail(relay.log, 20))

	credentials := map[string]string{
		"revoked API key": key1, "API key": key2, "other merchant's API key": downKey, "wrong API key": wrongKey,
		"first webhook secret": secret1, "wiped webhook secret": secrets[0], "previous webhook secret": secrets[1],
		"webhook secret": secrets[2], "other merchant's webhook secret": downSecret,
		"admin token": adminToken, "wrong admin token": wrongAdmin, "KASA_SECRET_KEY": testkit.SecretKeyHex,
	}

	var logs strings.Builder
	for _, p := range []*proc{s.api, s.worker, relay, s.sim} {
		b, err := os.ReadFile(p.log)
		require.NoError(t, err)
		logs.Write(b)
	}
	require.Contains(t, logs.String(), "level=DEBUG", "the processes logged at debug level")
	for what, secret := range credentials {
		require.NotContains(t, logs.String(), secret, "the %s is in a log", what)
	}
	require.NotContains(t, logs.String(), hookToken, "a webhook URL's query string is in a log")
	require.NotContains(t, strings.ToLower(logs.String()), "bearer ", "an Authorization header is in a log")

	// The dump: every row of every table as text (bytea as hex).
	rows, err := c.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, tables, "merchants")
	dump := map[string]string{}
	for _, table := range tables {
		var text string
		require.NoError(t, c.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(string_agg(t::text, E'\n'), '') FROM %s t`, pgx.Identifier{table}.Sanitize())).Scan(&text))
		dump[table] = text
	}
	require.Contains(t, dump["webhook_attempts"], "?…", "the failed attempt named its URL, redacted")
	for table, text := range dump {
		for what, secret := range credentials {
			require.NotContains(t, text, secret, "the %s is in table %s", what, table)
			require.NotContains(t, text, hex.EncodeToString([]byte(secret)), "the %s is in table %s, as bytes", what, table)
		}
		if table != "merchants" && table != "webhook_deliveries" { // the URL as registered
			require.NotContains(t, text, hookToken, "a webhook URL's query string is in table %s", table)
		}
	}
}
