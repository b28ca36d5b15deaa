package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/sweeper"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// Same key, 100 sequential requests -> one financial effect, 99 identical answers.
func TestSameKeySequential(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "2000.00")
	body := payBody("45982", "1000.00", "TRY", acct)

	first := s.pay(m, "seq-key", body)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	require.Empty(t, first.Header.Get("Idempotent-Replayed"))
	for range 99 {
		r := s.pay(m, "seq-key", body)
		require.Equal(t, http.StatusCreated, r.Status)
		require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
		require.Equal(t, string(first.Body), string(r.Body), "replays are byte-identical")
	}
	id := first.json(t)["id"].(string)
	require.Equal(t, 1, s.simCount(id))
	entries, err := db.LedgerEntries(context.Background(), id)
	require.NoError(t, err)
	require.Len(t, entries, 2, "one posting")
	require.Equal(t, "1000.00", s.account(m, acct)["balance"])
	metrics := string(s.do("GET", "/metrics", "", "").Body)
	require.Contains(t, metrics, `kasa_idempotency_requests_total{outcome="new"} 1`)
	require.Contains(t, metrics, `kasa_idempotency_requests_total{outcome="replayed"} 99`)
	require.Contains(t, metrics, `kasa_http_request_duration_seconds_count{method="POST",route="/v1/payments",status="201"} 100`)
	require.Contains(t, metrics, "kasa_workflow_start_duration_seconds_count 1\n", "one workflow started")
	require.Contains(t, metrics, "kasa_unknown_payments ")
	requireVerified(t)
}

// Same key, 100 parallel requests -> one financial effect; the others are
// 409 with Retry-After or an identical replay.
func TestSameKeyParallel(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "2000.00")
	body := payBody("45982", "1000.00", "TRY", acct)

	results := make([]response, 100)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = s.pay(m, "par-key", body) }()
	}
	wg.Wait()

	var created []response
	for _, r := range results {
		switch r.Status {
		case http.StatusCreated:
			created = append(created, r)
		case http.StatusConflict:
			require.Equal(t, "idempotency_key_in_use", r.json(t)["code"])
			require.NotEmpty(t, r.Header.Get("Retry-After"))
		default:
			t.Fatalf("unexpected answer %d: %s", r.Status, r.Body)
		}
	}
	require.NotEmpty(t, created)
	for _, r := range created {
		require.Equal(t, string(created[0].Body), string(r.Body))
	}
	id := created[0].json(t)["id"].(string)
	require.Equal(t, 1, s.simCount(id), "one charge at the bank")
	entries, err := db.LedgerEntries(context.Background(), id)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.Equal(t, "1000.00", s.account(m, acct)["balance"])
	requireVerified(t)
}

// Same key, different payload -> 422; the first payment is unaffected.
func TestSameKeyDifferentRequest(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "2000.00")
	first := s.pay(m, "k", payBody("inv-1", "1000.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, first.Status)

	for _, body := range []string{
		payBody("inv-1", "999.99", "TRY", acct),
		payBody("inv-2", "1000.00", "TRY", acct),
		`{"invoice_id":"inv-1","amount":"1000.00","currency":"TRY","account_id":"` + acct + `","payment_type":"refund_fee"}`,
	} {
		r := s.pay(m, "k", body)
		require.Equal(t, http.StatusUnprocessableEntity, r.Status, "%s", r.Body)
		require.Equal(t, "idempotency_key_reused", r.json(t)["code"])
	}
	// Equivalent forms of the first request are the same request.
	for _, body := range []string{
		`{"invoice_id":"inv-1","amount":1000,"currency":"try","account_id":"` + acct + `"}`,
		`{"invoice_id":"inv-1","amount":1000.0,"currency":"Try","account_id":"` + acct + `","payment_type":"purchase"}`,
	} {
		r := s.pay(m, "k", body)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Equal(t, string(first.Body), string(r.Body))
	}
	got := s.do("GET", "/v1/payments/"+first.json(t)["id"].(string), m.APIKey, "")
	require.Equal(t, "succeeded", got.json(t)["status"])
	require.Equal(t, "1000.00", got.json(t)["amount"])
	require.Equal(t, "1000.00", s.account(m, acct)["balance"])
	requireVerified(t)
}

// Four different keys x 1,000.00 on a 2,000.00 account -> at most two succeed.
func TestConcurrentPaymentsNeverOverdraw(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "2000.00")
	results := make([]response, 4)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = s.pay(m, fmt.Sprint("k", i), payBody(fmt.Sprint("inv", i), "1000.00", "TRY", acct))
		}()
	}
	wg.Wait()
	ok := 0
	for _, r := range results {
		p := r.json(t)
		switch r.Status {
		case http.StatusCreated:
			ok++
			require.Equal(t, 1, s.simCount(p["id"].(string)))
		case http.StatusPaymentRequired:
			require.Equal(t, "insufficient_funds", p["failure_code"])
			require.Equal(t, 0, s.simCount(p["id"].(string)), "a payment without funds never reaches the bank")
		default:
			t.Fatalf("unexpected %d: %s", r.Status, r.Body)
		}
	}
	require.Equal(t, 2, ok)
	a := s.account(m, acct)
	require.Equal(t, "0.00", a["balance"])
	require.Equal(t, "0.00", a["reserved"])
	requireVerified(t)
}

// 50 parallel payments of random amounts on one account: the books balance to the cent.
func TestManyRandomPaymentsBalance(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "3000.00")
	amounts := make([]int64, 50)
	for i := range amounts {
		amounts[i] = 1 + rand.Int64N(15_000) // up to 150.00 TRY: some will run out of funds
	}
	results := make([]response, len(amounts))
	var wg sync.WaitGroup
	for i, a := range amounts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = s.pay(m, fmt.Sprint("r", i), payBody(fmt.Sprint("inv", i), payment.FormatAmount(a, "TRY"), "TRY", acct))
		}()
	}
	wg.Wait()
	var succeeded int64
	for i, r := range results {
		switch r.Status {
		case http.StatusCreated:
			succeeded += amounts[i]
		case http.StatusPaymentRequired:
			require.Equal(t, "insufficient_funds", r.json(t)["failure_code"])
		default:
			t.Fatalf("unexpected %d: %s", r.Status, r.Body)
		}
	}
	a := s.account(m, acct)
	require.Equal(t, payment.FormatAmount(300_000-succeeded, "TRY"), a["balance"], "sum of succeeded = balance drop")
	require.Equal(t, "0.00", a["reserved"])
	requireVerified(t)
}

// The same key used by two merchants names two independent payments.
func TestKeysAreScopedToTheMerchant(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m1, m2 := s.newMerchant(), s.newMerchant()
	a1, a2 := s.newAccount(m1, "TRY", "100.00"), s.newAccount(m2, "TRY", "100.00")
	r1 := s.pay(m1, "shared-key", payBody("inv-1", "10.00", "TRY", a1))
	r2 := s.pay(m2, "shared-key", payBody("inv-1", "20.00", "TRY", a2))
	require.Equal(t, http.StatusCreated, r1.Status, "%s", r1.Body)
	require.Equal(t, http.StatusCreated, r2.Status, "%s", r2.Body)
	require.NotEqual(t, r1.json(t)["id"], r2.json(t)["id"])
	require.Equal(t, "90.00", s.account(m1, a1)["balance"])
	require.Equal(t, "80.00", s.account(m2, a2)["balance"])
	requireVerified(t)
}

// The business key: one live payment per (merchant, invoice, type), whatever key the client sends.
func TestDuplicateInvoice(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")

	// While the first payment is unknown (the bank's answer was lost), a new key is refused.
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	first := s.pay(m, "k1", payBody("inv-7", "10.00", "TRY", acct))
	require.Equal(t, http.StatusAccepted, first.Status, "%s", first.Body)
	firstID := first.json(t)["id"].(string)
	dup := s.pay(m, "k2", payBody("inv-7", "10.00", "TRY", acct))
	require.Equal(t, http.StatusConflict, dup.Status, "%s", dup.Body)
	require.Equal(t, "duplicate_payment", dup.json(t)["code"])
	require.Equal(t, firstID, dup.json(t)["payment_id"])
	require.Equal(t, http.StatusNotFound, s.do("GET", "/v1/payments?idempotency_key=k2", m.APIKey, "").Status, "nothing written")

	// A different payment type is a different business operation.
	other := s.pay(m, "k3", `{"invoice_id":"inv-7","amount":"5.00","currency":"TRY","account_id":"`+acct+`","payment_type":"tip"}`)
	require.Equal(t, http.StatusCreated, other.Status, "%s", other.Body)

	// Succeeded blocks too.
	ok := s.pay(m, "k4", payBody("inv-8", "10.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, ok.Status)
	dup = s.pay(m, "k5", payBody("inv-8", "10.00", "TRY", acct))
	require.Equal(t, http.StatusConflict, dup.Status)
	require.Equal(t, ok.json(t)["id"], dup.json(t)["payment_id"])

	// After a decline a new key may pay the invoice.
	s.setFaults(`{"rules":[{"on":"charge","action":"decline","count":1}]}`)
	declined := s.pay(m, "k6", payBody("inv-9", "10.00", "TRY", acct))
	require.Equal(t, http.StatusPaymentRequired, declined.Status, "%s", declined.Body)
	retry := s.pay(m, "k7", payBody("inv-9", "10.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, retry.Status, "%s", retry.Body)
	requireVerified(t)
}

// Bad input gets the documented error (docs/api.md) and writes nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	try := s.newAccount(m, "TRY", "100.00")
	jpy := s.newAccount(m, "JPY", "")
	kwd := s.newAccount(m, "KWD", "")
	body := func(amount any, currency, acct string) string {
		return fmt.Sprintf(`{"invoice_id":"inv","amount":%v,"currency":%q,"account_id":%q}`, amount, currency, acct)
	}
	tests := []struct {
		name, key, contentType, body string
		status                       int
		code, field                  string
	}{
		{"negative amount", "b1", "application/json", body(`"-5.00"`, "TRY", try), 400, "invalid_request", "amount"},
		{"zero amount", "b2", "application/json", body(`0`, "TRY", try), 400, "invalid_request", "amount"},
		{"TRY 3 decimals", "b3", "application/json", body(`"1.001"`, "TRY", try), 400, "invalid_request", "amount"},
		{"JPY decimals", "b4", "application/json", body(`"1.5"`, "JPY", jpy), 400, "invalid_request", "amount"},
		{"KWD 4 decimals", "b5", "application/json", body(`"1.0001"`, "KWD", kwd), 400, "invalid_request", "amount"},
		{"unknown currency", "b6", "application/json", body(`"1.00"`, "ABC", try), 400, "invalid_request", "currency"},
		{"currency differs from account", "b7", "application/json", body(`"1.00"`, "USD", try), 400, "invalid_request", "currency"},
		{"20-digit amount", "b8", "application/json", body(`"12345678901234567890"`, "TRY", try), 400, "invalid_request", "amount"},
		{"malformed JSON", "b9", "application/json", `{"invoice_id":`, 400, "invalid_request", "body"},
		{"unknown field", "b10", "application/json", `{"invoice_id":"i","amount":"1","currency":"TRY","account_id":"` + try + `","x":1}`, 400, "invalid_request", "x"},
		{"duplicate field", "b11", "application/json", `{"invoice_id":"i","amount":"1","amount":"2","currency":"TRY","account_id":"` + try + `"}`, 400, "invalid_request", "body"},
		{"trailing data", "b12", "application/json", body(`"1.00"`, "TRY", try) + ` {}`, 400, "invalid_request", "body"},
		{"empty body", "b13", "application/json", ``, 400, "invalid_request", "body"},
		{"64 KiB+ body", "b14", "application/json", `{"invoice_id":"` + strings.Repeat("a", 70_000) + `"}`, 413, "body_too_large", ""},
		{"wrong content type", "b15", "text/plain", body(`"1.00"`, "TRY", try), 415, "unsupported_media_type", ""},
		{"256-character key", strings.Repeat("k", 256), "application/json", body(`"1.00"`, "TRY", try), 400, "idempotency_key_invalid", ""},
		{"key with spaces", "has space", "application/json", body(`"1.00"`, "TRY", try), 400, "idempotency_key_invalid", ""},
		{"missing key", "", "application/json", body(`"1.00"`, "TRY", try), 400, "idempotency_key_missing", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest("POST", s.api.URL+"/v1/payments", strings.NewReader(tt.body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+m.APIKey)
			req.Header.Set("Content-Type", tt.contentType)
			if tt.key != "" {
				req.Header.Set("Idempotency-Key", tt.key)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, tt.status, resp.StatusCode)
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
			var p struct {
				Code   string                   `json:"code"`
				Type   string                   `json:"type"`
				Status int                      `json:"status"`
				Errors []struct{ Field string } `json:"errors"`
			}
			require.NoError(t, jsonDecode(resp, &p))
			require.Equal(t, tt.code, p.Code)
			require.Equal(t, tt.status, p.Status)
			require.NotEmpty(t, p.Type)
			if tt.field != "" {
				var fields []string
				for _, e := range p.Errors {
					fields = append(fields, e.Field)
				}
				require.Contains(t, fields, tt.field)
			}
			if tt.key != "" && len(tt.key) <= 255 && !strings.Contains(tt.key, " ") {
				_, err := db.Record(context.Background(), mustUUID(t, m.ID), tt.key)
				require.ErrorIs(t, err, payment.ErrNotFound, "bad input writes nothing")
			}
		})
	}
	a := s.account(m, try)
	require.Equal(t, "100.00", a["balance"])
	require.Equal(t, "0.00", a["reserved"])
	requireVerified(t)
}

// Temporal down: 503 with Retry-After, and the record left behind never blocks the retry.
func TestTemporalUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	port, err := devenv.FreePort()
	require.NoError(t, err)
	tmp, err := devenv.StartTemporal(ctx, devenv.TemporalOptions{Port: port})
	require.NoError(t, err)
	own, err := client.Dial(client.Options{HostPort: tmp.Address, Logger: testkit.QuietTemporalLogger()})
	require.NoError(t, err)
	t.Cleanup(own.Close)
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: own})
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	require.Equal(t, http.StatusCreated, s.pay(m, "before", payBody("inv-0", "1.00", "TRY", acct)).Status)

	require.NoError(t, tmp.Stop())
	r := s.pay(m, "k", payBody("inv-1", "10.00", "TRY", acct))
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	require.Equal(t, "unavailable", r.json(t)["code"])
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	require.Equal(t, http.StatusServiceUnavailable, s.do("GET", "/readyz", "", "").Status)
	rec, err := db.Record(ctx, mustUUID(t, m.ID), "k")
	require.NoError(t, err, "the record stays, so the retry runs the same operation")
	require.False(t, rec.WorkflowStarted)

	tmp, err = devenv.StartTemporal(ctx, devenv.TemporalOptions{Port: port})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tmp.Stop() })
	var again response
	require.Eventually(t, func() bool {
		again = s.pay(m, "k", payBody("inv-1", "10.00", "TRY", acct))
		return again.Status == http.StatusCreated
	}, 60*time.Second, 500*time.Millisecond, "the retry completes once Temporal is back: %s", again.Body)
	id := again.json(t)["id"].(string)
	require.Equal(t, rec.OperationID.String(), id, "the retry completed the same operation")
	require.Equal(t, 1, s.simCount(id))
	require.Equal(t, "89.00", s.account(m, acct)["balance"])
	requireVerified(t)
}

// An API process that dies between the record's commit and the workflow start: a key nobody
// retries is completed by the sweeper, exactly once.
func TestSweeperStartsStrandedPayments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityIdempotent)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	// What the API commits before it would start the workflow; then it "dies".
	p := beginPayment(t, m, acct, "stranded", "25.00", 10*time.Millisecond, false)
	time.Sleep(50 * time.Millisecond)

	mid := mustUUID(t, m.ID) // the shared database holds other tests' stranded keys
	sw := &sweeper.Sweeper{Store: db, Starter: workflows.Starter{Client: tc, TaskQueue: s.queue}, Merchant: &mid}
	require.Eventually(t, func() bool {
		_, err := sw.Sweep(ctx)
		require.NoError(t, err)
		got, err := db.Payment(ctx, p.ID)
		require.NoError(t, err)
		return got.Status == payment.StatusSucceeded
	}, 30*time.Second, 200*time.Millisecond)
	n, err := sw.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a started operation is not started again")
	require.Equal(t, 1, s.simCount(p.ID.String()))
	replay := s.pay(m, "stranded", payBody("inv-stranded", "25.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, replay.Status)
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	require.Equal(t, "75.00", s.account(m, acct)["balance"])
	requireVerified(t)
}
