package tests

import (
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
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// The merchant's list of payments over the running system: newest first, keyset pages that
// neither skip nor repeat, the status and creation-time filters, another merchant's payments
// never shown nor usable as a cursor, and bad parameters refused with the documented problem.
func TestPaymentListEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m, other := s.newMerchant(), s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	otherAcct := s.newAccount(other, "TRY", "10.00")

	// p0, p1 succeed; the bank's answer to p2 is lost (unknown); p3 has no funds (failed); p4 succeeds.
	var ids []string
	for i, c := range []struct{ amount, fault string }{{"10.00", ""}, {"11.00", ""}, {"12.00", "drop_response"}, {"500.00", ""}, {"13.00", ""}} {
		if c.fault != "" {
			s.setFaults(fmt.Sprintf(`{"rules":[{"on":"charge","action":%q,"count":1}]}`, c.fault))
		}
		r := s.pay(m, fmt.Sprint("list-", i), payBody(fmt.Sprint("inv-list-", i), c.amount, "TRY", acct))
		require.Contains(t, []int{http.StatusCreated, http.StatusAccepted, http.StatusPaymentRequired}, r.Status, "%s", r.Body)
		ids = append(ids, r.json(t)["id"].(string))
	}
	r := s.pay(other, "list-other", payBody("inv-list-other", "1.00", "TRY", otherAcct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	otherID := r.json(t)["id"].(string)

	type page struct {
		Data []struct {
			ID, Status, Amount, Currency string
			CreatedAt                    string `json:"created_at"`
		} `json:"data"`
		HasMore *bool `json:"has_more"`
	}
	list := func(query string) ([]string, bool) {
		t.Helper()
		r := s.do("GET", "/v1/payments?"+query, m.APIKey, "")
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", query, r.Body)
		require.Equal(t, "application/json", r.Header.Get("Content-Type"))
		var p page
		require.NoError(t, json.Unmarshal(r.Body, &p))
		require.NotNil(t, p.HasMore, "has_more is always there: %s", r.Body)
		got := []string{}
		for _, d := range p.Data {
			_, err := time.Parse(time.RFC3339Nano, d.CreatedAt)
			require.NoError(t, err, "created_at is RFC 3339")
			require.Equal(t, "TRY", d.Currency)
			require.Regexp(t, `^[0-9]+\.[0-9]{2}$`, d.Amount, "a decimal string with the currency's exponent")
			got = append(got, d.ID)
		}
		return got, *p.HasMore
	}
	created := func(id string) string {
		t.Helper()
		r := s.do("GET", "/v1/payments/"+id, m.APIKey, "")
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		return r.json(t)["created_at"].(string)
	}

	got, more := list("")
	require.Equal(t, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}, got, "newest first, only the merchant's own")
	require.False(t, more)

	// Pages of two, each starting after the last one's last payment.
	var paged []string
	cursor := ""
	for _, wantMore := range []bool{true, true, false} {
		q := "limit=2"
		if cursor != "" {
			q += "&starting_after=" + cursor
		}
		got, more := list(q)
		require.Equal(t, wantMore, more, "page after %q", cursor)
		paged = append(paged, got...)
		cursor = got[len(got)-1]
	}
	require.Equal(t, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}, paged)

	for _, c := range []struct {
		query string
		want  []string
	}{
		{"status=succeeded", []string{ids[4], ids[1], ids[0]}},
		{"status=failed", []string{ids[3]}},
		{"status=unknown", []string{ids[2]}},
		{"status=processing", []string{}},
		{"created_gte=" + url.QueryEscape(created(ids[2])), []string{ids[4], ids[3], ids[2]}},
		{"created_lt=" + url.QueryEscape(created(ids[2])), []string{ids[1], ids[0]}},
		{"status=succeeded&limit=1&starting_after=" + ids[4], []string{ids[1]}},
	} {
		got, _ := list(c.query)
		require.Equal(t, c.want, got, c.query)
	}

	for _, q := range []string{"limit=0", "limit=101", "limit=x", "status=paid", "created_gte=2025-03-01",
		"created_lt=yesterday", "starting_after=nope", "starting_after=" + otherID, "colour=red"} {
		r := s.do("GET", "/v1/payments?"+q, m.APIKey, "")
		requireProblem(t, r, http.StatusBadRequest, "invalid_request")
		require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"), q)
		require.NotEmpty(t, r.json(t)["errors"], "%s: %s", q, r.Body)
	}
}

// An admin deposit over the running system: one balanced posting from outside, the balance
// grows once however often the request is repeated, the replay is byte-identical, and a key
// reused for another amount changes nothing.
func TestDepositEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "")
	jpy := s.newAccount(m, "JPY", "")
	path := "/admin/v1/accounts/" + acct + "/deposits"

	first := s.do("POST", path, adminToken, `{"amount":"12.34"}`, "Idempotency-Key", "dep-1")
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	require.Empty(t, first.Header.Get("Idempotent-Replayed"))
	d := first.json(t)
	require.Equal(t, acct, d["account_id"])
	require.Equal(t, "12.34", d["amount"])
	require.Equal(t, "TRY", d["currency"])
	_, err := time.Parse(time.RFC3339Nano, d["created_at"].(string))
	require.NoError(t, err)

	entries, err := db.LedgerEntries(ctx, d["id"].(string))
	require.NoError(t, err)
	require.Len(t, entries, 2, "one posting of two entries")
	require.Equal(t, entries[0].PostingID, entries[1].PostingID)
	require.Equal(t, "deposit", entries[0].Kind)
	require.Equal(t, int64(0), entries[0].AmountMinor+entries[1].AmountMinor, "balanced")

	for _, body := range []string{`{"amount":"12.34"}`, `{"amount":12.34}`} {
		again := s.do("POST", path, adminToken, body, "Idempotency-Key", "dep-1")
		require.Equal(t, http.StatusCreated, again.Status, "%s", again.Body)
		require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
		require.Equal(t, string(first.Body), string(again.Body))
	}
	requireProblem(t, s.do("POST", path, adminToken, `{"amount":"12.35"}`, "Idempotency-Key", "dep-1"), http.StatusUnprocessableEntity, "idempotency_key_reused")
	requireProblem(t, s.do("POST", path, adminToken, `{"amount":"1.00"}`), http.StatusBadRequest, "idempotency_key_missing")
	requireProblem(t, s.do("POST", "/admin/v1/accounts/"+jpy+"/deposits", adminToken, `{"amount":"1.5"}`, "Idempotency-Key", "dep-jpy"), http.StatusBadRequest, "invalid_request")
	requireProblem(t, s.do("POST", path, m.APIKey, `{"amount":"1.00"}`, "Idempotency-Key", "dep-merchant"), http.StatusUnauthorized, "unauthorized")

	entries, err = db.LedgerEntries(ctx, d["id"].(string))
	require.NoError(t, err)
	require.Len(t, entries, 2, "replays post nothing")
	a := s.account(m, acct)
	require.Equal(t, "12.34", a["balance"])
	require.Equal(t, "0.00", a["reserved"])
	require.Equal(t, "12.34", a["available"])
	require.Equal(t, "0", s.account(m, jpy)["balance"])
	requireVerified(t)
}

// Key rotation over the running system: a new API key works beside the old one, a revoked key
// answers 401 within a second while the others keep working, and a new webhook secret is shown
// once.
func TestMerchantKeyRotationEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.createMerchant(`{"name":"Rotating"}`)
	firstKeyID := m.KeyID
	acct := s.newAccount(m, "TRY", "10.00")

	r := s.do("POST", "/admin/v1/merchants/"+m.ID+"/api-keys", adminToken, "")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	k := r.json(t)
	second := k["api_key"].(string)
	require.NotEmpty(t, k["id"])
	require.NotEqual(t, m.APIKey, second)
	for _, key := range []string{m.APIKey, second} {
		require.Equal(t, http.StatusOK, s.do("GET", "/v1/accounts/"+acct, key, "").Status)
	}

	r = s.do("DELETE", "/admin/v1/merchants/"+m.ID+"/api-keys/"+firstKeyID, adminToken, "")
	require.Equal(t, http.StatusNoContent, r.Status, "%s", r.Body)
	require.Empty(t, r.Body)
	// A request sent a second after the revocation answers 401, however long a loaded machine
	// takes to answer it.
	for revoked := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		sent := time.Now()
		if s.do("GET", "/v1/accounts/"+acct, m.APIKey, "").Status == http.StatusUnauthorized {
			break
		}
		require.Less(t, sent.Sub(revoked), time.Second, "a revoked key answers 401 within a second")
	}
	requireProblem(t, s.pay(m, "after-revoke", payBody("inv-revoked", "1.00", "TRY", acct)), http.StatusUnauthorized, "unauthorized")
	require.Equal(t, http.StatusOK, s.do("GET", "/v1/accounts/"+acct, second, "").Status, "the other key keeps working")

	r = s.do("POST", "/admin/v1/merchants/"+m.ID+"/webhook-secret", adminToken, "")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	secret := r.json(t)["webhook_secret"].(string)
	require.True(t, strings.HasPrefix(secret, "whsec_"), secret)
	require.NotEqual(t, m.WebhookSecret, secret)
}

// kasaSignatures checks a Kasa-Signature header as a merchant would, with nothing of kasa's:
// t=<unix seconds> first, then one v1=<hex HMAC-SHA256(secret, "<t>.<body>")> per secret, in
// the order given.
func kasaSignatures(t *testing.T, header string, body []byte, secrets ...string) {
	t.Helper()
	parts := strings.Split(header, ",")
	require.Len(t, parts, 1+len(secrets), header)
	ts, ok := strings.CutPrefix(parts[0], "t=")
	require.True(t, ok, header)
	unix, err := strconv.ParseInt(ts, 10, 64)
	require.NoError(t, err, header)
	require.WithinDuration(t, time.Now(), time.Unix(unix, 0), time.Minute)
	for i, secret := range secrets {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(ts + "." + string(body)))
		require.Equal(t, "v1="+hex.EncodeToString(mac.Sum(nil)), parts[1+i], "signature %d of %s", i+1, header)
	}
}

// A webhook secret rotated through the admin API: the merchant's next events carry the new
// secret's signature and then the old one's; an event the merchant failed to take is sent
// again with the same id and body, signed anew. Not parallel: the event pipeline publishes
// every outbox row of the shared database.
func TestWebhookSecretRotationEndToEnd(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	hook := testkit.NewHook(t, testkit.HookOptions{EventIDHeader: outbox.HeaderEventID, SignatureHeader: outbox.HeaderSignature,
		Respond: func(n int, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				w.WriteHeader(http.StatusInternalServerError)
			}
		}})
	startEventPipeline(t)

	m := s.newHookedMerchant(hook.URL)
	old := m.WebhookSecret
	acct := s.newAccount(m, "TRY", "50.00")

	r := s.do("POST", "/admin/v1/merchants/"+m.ID+"/webhook-secret", adminToken, "")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	secret := r.json(t)["webhook_secret"].(string)

	r = s.pay(m, "rotated-1", payBody("inv-rotated-1", "5.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	paymentID := r.json(t)["id"].(string)

	require.Eventually(t, func() bool { return hook.Count() >= 2 }, 30*time.Second, 20*time.Millisecond)
	reqs := hook.Requests()
	for _, got := range reqs[:2] {
		w := testkit.DecodeWebhook(t, got.Body)
		require.Equal(t, got.EventID, w.ID)
		require.Equal(t, "payment.succeeded", w.Type)
		require.Equal(t, paymentID, w.Data.ID)
		kasaSignatures(t, got.Signature, got.Body, secret, old)
	}
	require.Equal(t, reqs[0].EventID, reqs[1].EventID, "the retry is the same event")
	require.Equal(t, reqs[0].Body, reqs[1].Body, "byte for byte")
}

// One invoice paid under many keys at once: one payment exists and moves money once; every other
// request answers 409 duplicate_payment naming it, and writes nothing.
func TestDuplicateInvoiceUnderConcurrentKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")

	results := make([]response, 20)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() { results[i] = s.pay(m, fmt.Sprint("dup-", i), payBody("inv-dup", "30.00", "TRY", acct)) })
	}
	wg.Wait()

	var winner string
	for _, r := range results {
		if r.Status == http.StatusCreated {
			require.Empty(t, winner, "one payment only")
			winner = r.json(t)["id"].(string)
		}
	}
	require.NotEmpty(t, winner)
	for i, r := range results {
		if r.Status == http.StatusCreated {
			continue
		}
		requireProblem(t, r, http.StatusConflict, "duplicate_payment")
		require.Equal(t, winner, r.json(t)["payment_id"])
		_, err := db.Record(ctx, mustUUID(t, m.ID), fmt.Sprint("dup-", i))
		require.ErrorIs(t, err, payment.ErrNotFound, "a refused key writes nothing")
	}
	require.Equal(t, 1, s.simCount(winner))
	a := s.account(m, acct)
	require.Equal(t, "70.00", a["balance"])
	require.Equal(t, "0.00", a["reserved"])
	requireVerified(t)
}

// kasa verify as an operator runs it: on a clean database it says so and exits 0; on a broken
// one it exits 1 and names every violated invariant. The breakage is what an operator with
// superuser rights could do behind kasa's back; each case is put right before the next.
func TestVerifyCommandOnACleanAndABrokenDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	bin := kasaBinary(t, dir)
	dbURL := env.OwnDatabase(t)
	vars := []string{"KASA_DATABASE_URL=" + dbURL, "KASA_DATA_DIR=" + filepath.Join(dir, "data"), "PATH=" + os.Getenv("PATH")}
	out, code := runKasa(t, dir, bin, vars, "migrate")
	require.Equal(t, 0, code, "%s", out)

	st := openStore(t, dbURL)
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 10_000})
	paid, err := testkit.Settle(ctx, st, m, false)
	require.NoError(t, err)

	out, code = runKasa(t, dir, bin, vars, "verify")
	require.Equal(t, 0, code, "%s", out)
	require.Contains(t, out, "verify: ok")

	super := connect(t, dbURL)
	acct := m.Account.String()
	for _, c := range []struct {
		name, breakSQL, fixSQL string
		want                   []string
	}{
		{"balance edited", "UPDATE accounts SET balance = balance + 1 WHERE id = '" + acct + "'",
			"UPDATE accounts SET balance = balance - 1 WHERE id = '" + acct + "'",
			[]string{"balance equals the ledger sum: account " + acct}},
		{"reserved edited", "UPDATE accounts SET reserved = reserved + 5 WHERE id = '" + acct + "'",
			"UPDATE accounts SET reserved = reserved - 5 WHERE id = '" + acct + "'",
			[]string{"reserved equals active reservations: account " + acct}},
		{"payment forgotten", "UPDATE payments SET status = 'failed', failure_code = 'declined' WHERE id = '" + paid.String() + "'",
			"UPDATE payments SET status = 'succeeded', failure_code = NULL WHERE id = '" + paid.String() + "'",
			[]string{"no other payment has a posting: payment posting", "reservations match payment outcomes: failed payment " + paid.String()}},
	} {
		_, err := super.Exec(ctx, c.breakSQL)
		require.NoError(t, err, c.name)
		out, code := runKasa(t, dir, bin, vars, "verify")
		require.Equal(t, 1, code, "%s: %s", c.name, out)
		for _, w := range c.want {
			require.Contains(t, out, w, c.name)
		}
		require.NotContains(t, out, "verify: ok", c.name)
		_, err = super.Exec(ctx, c.fixSQL)
		require.NoError(t, err, c.name)
	}
	out, code = runKasa(t, dir, bin, vars, "verify")
	require.Equal(t, 0, code, "put right again: %s", out)
}

// /readyz answers 200 only when the database, Temporal and a worker are reachable: `kasa api`
// with no worker polling its task queue serves /healthz but is not ready.
func TestReadyzWaitsForAWorker(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{})
	s.startBanksim()
	s.api = startProc(t, s.dir, s.bin, "api", s.env(), "api")
	s.api.waitHTTP(s.apiURL() + "/healthz")

	// Every answer is 503. A check that outlived its 3 s on a loaded machine says down; the next
	// one that completes names what is missing.
	var ready response
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		ready = s.mustCall("GET", s.apiURL()+"/readyz", "", "")
		require.Equal(t, http.StatusServiceUnavailable, ready.Status, "%s", ready.Body)
		if (ready.json(t)["database"] == "ok" && ready.json(t)["temporal"] != "down") || time.Now().After(deadline) {
			break
		}
	}
	require.Equal(t, "ok", ready.json(t)["database"], "%s", ready.Body)
	require.Equal(t, "no_worker", ready.json(t)["temporal"], "Temporal answers; what is missing is a worker: %s", ready.Body)

	s.startWorker()
	s.api.waitHTTP(s.apiURL() + "/readyz")
	require.Equal(t, http.StatusOK, s.mustCall("GET", s.apiURL()+"/readyz", "", "").Status)
}
