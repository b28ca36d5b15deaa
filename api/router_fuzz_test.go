package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/store"
)

// These fuzz targets send arbitrary bodies, headers and query strings through the whole router
// (authentication, decoding, validation, the one error mapping) and check what holds for any
// input: no 5xx (a panic is recovered into a 500, so it fails too), every 4xx a problem+json
// body whose code and status agree, and a 2xx only for input valid by the documented rules,
// decided here independently of the handlers.

// errPGText is what PostgreSQL answers for text it cannot store: invalid UTF-8 or a NUL byte
// (SQLSTATE 22021). The store passes it through, so it reaches the API as an unclassified error.
var errPGText = errors.New(`ERROR: invalid byte sequence for encoding "UTF8" (SQLSTATE 22021)`)

// pgTextStore is the fake store refusing, like PostgreSQL, every string argument its text
// columns could not hold; the fake alone would accept what the database refuses.
type pgTextStore struct{ *fakeStore }

func pgText(ss ...string) error {
	for _, s := range ss {
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return errPGText
		}
	}
	return nil
}

func (s pgTextStore) CreateMerchantWithKey(ctx context.Context, m payment.Merchant, keyID uuid.UUID, apiKey, webhookSecret string) error {
	if err := pgText(m.Name, m.WebhookURL, apiKey, webhookSecret); err != nil {
		return err
	}
	return s.fakeStore.CreateMerchantWithKey(ctx, m, keyID, apiKey, webhookSecret)
}

func (s pgTextStore) CreateMerchantOnce(ctx context.Context, key string, requestHash []byte, m payment.Merchant, c store.MerchantCreated) (store.MerchantCreated, bool, error) {
	if err := pgText(key, m.Name, m.WebhookURL); err != nil {
		return c, false, err
	}
	return s.fakeStore.CreateMerchantOnce(ctx, key, requestHash, m, c)
}

func (s pgTextStore) CreateAccountOnce(ctx context.Context, key string, merchantID uuid.UUID, currency string) (payment.Account, bool, error) {
	if err := pgText(key, currency); err != nil {
		return payment.Account{}, false, err
	}
	return s.fakeStore.CreateAccountOnce(ctx, key, merchantID, currency)
}

func (s pgTextStore) MerchantByAPIKey(ctx context.Context, apiKey string) (payment.Merchant, error) {
	if err := pgText(apiKey); err != nil {
		return payment.Merchant{}, err
	}
	return s.fakeStore.MerchantByAPIKey(ctx, apiKey)
}

func (s pgTextStore) CreateAccount(ctx context.Context, merchantID uuid.UUID, currency string) (payment.Account, error) {
	if err := pgText(currency); err != nil {
		return payment.Account{}, err
	}
	return s.fakeStore.CreateAccount(ctx, merchantID, currency)
}

func (s pgTextStore) Deposit(ctx context.Context, accountID uuid.UUID, key string, amount int64) (store.Deposit, bool, error) {
	if err := pgText(key); err != nil {
		return store.Deposit{}, false, err
	}
	return s.fakeStore.Deposit(ctx, accountID, key, amount)
}

func (s pgTextStore) Begin(ctx context.Context, in store.BeginInput) (store.Record, payment.Payment, store.Began, error) {
	if err := pgText(in.Key, in.Request.InvoiceID, in.Request.Currency, in.Request.PaymentType); err != nil {
		return store.Record{}, payment.Payment{}, 0, err
	}
	return s.fakeStore.Begin(ctx, in)
}

func (s pgTextStore) Record(ctx context.Context, merchantID uuid.UUID, key string) (store.Record, error) {
	if err := pgText(key); err != nil {
		return store.Record{}, err
	}
	return s.fakeStore.Record(ctx, merchantID, key)
}

func (s pgTextStore) PaymentByKey(ctx context.Context, merchantID uuid.UUID, key string) (payment.Payment, error) {
	if err := pgText(key); err != nil {
		return payment.Payment{}, err
	}
	return s.fakeStore.PaymentByKey(ctx, merchantID, key)
}

func (s pgTextStore) BeginRefund(ctx context.Context, in store.BeginRefundInput) (store.Record, payment.Refund, store.Began, error) {
	if err := pgText(in.Key, in.Request.Amount, in.Request.Reason); err != nil {
		return store.Record{}, payment.Refund{}, 0, err
	}
	return s.fakeStore.BeginRefund(ctx, in)
}

func (s pgTextStore) RefundRecord(ctx context.Context, merchantID uuid.UUID, key string) (store.Record, error) {
	if err := pgText(key); err != nil {
		return store.Record{}, err
	}
	return s.fakeStore.RefundRecord(ctx, merchantID, key)
}

// trailerReconciler parses like the real reconciler and reports the file's trailers as the
// days it proves complete, as the real report does.
type trailerReconciler struct{}

func (trailerReconciler) Import(_ context.Context, r io.Reader, o reconcile.Options) (*reconcile.Report, error) {
	f, err := reconcile.ParseFile(r)
	if err != nil {
		return nil, err
	}
	rep := &reconcile.Report{DryRun: o.DryRun, Days: o.Days, Lines: len(f.Lines)}
	for _, t := range f.Trailers {
		rep.Complete = append(rep.Complete, reconcile.Completeness{Day: t.Day, AsOf: t.AsOf})
	}
	rep.Counts.Matched = len(f.Lines)
	return rep, nil
}

// fuzzHandler is a fresh router over fresh fakes (one per input, so inputs never interact),
// with merchant A's payment "k1" already succeeded.
func fuzzHandler(t *testing.T) http.Handler {
	st := newFakeStore()
	wf := &fakeWorkflows{st: st, outcome: payment.StatusSucceeded}
	f := &fixture{st: st, wf: wf}
	f.seed("k1", payBody, payment.StatusSucceeded, time.Time{})
	return New(Options{
		Store: pgTextStore{st}, Workflows: wf, AdminToken: "adm", Reconciler: trailerReconciler{},
		SyncWait: 50 * time.Millisecond, PollAfter: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}).Handler()
}

// fuzzRequest builds a request as a client could send it; ok is false for what no HTTP/1.1
// request line or header could carry (the server's parser refuses it before any handler).
func fuzzRequest(method, target string, header map[string]string, body []byte) (*http.Request, bool) {
	req, err := http.NewRequest(method, "http://kasa.test"+target, bytes.NewReader(body))
	if err != nil {
		return nil, false
	}
	for k, v := range header {
		for i := 0; i < len(v); i++ {
			if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
				return nil, false
			}
		}
		req.Header.Set(k, v)
	}
	return req, true
}

// serve sends req and checks the properties every answer has; it returns the answer's body
// decoded as a JSON object for 2xx answers (nil otherwise).
func serve(t *testing.T, h http.Handler, req *http.Request) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	ct := rec.Header().Get("Content-Type")
	switch {
	case rec.Code >= 500:
		t.Fatalf("%s %s answered %d: %s", req.Method, req.URL.RequestURI(), rec.Code, rec.Body)
	case rec.Code >= 400:
		if ct != "application/problem+json" {
			t.Fatalf("%d with Content-Type %q, want application/problem+json: %s", rec.Code, ct, rec.Body)
		}
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
			Code   string `json:"code"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("%d problem body is not JSON (%v): %s", rec.Code, err, rec.Body)
		}
		if p.Code == "" || p.Status != rec.Code || p.Type != "https://kasa.dev/problems/"+p.Code {
			t.Fatalf("%d problem body without a matching code, status and type: %s", rec.Code, rec.Body)
		}
		return rec.Code, nil
	case rec.Code >= 200 && rec.Code < 300:
		var m map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil || !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("%d body is not a JSON object (%q, %v): %s", rec.Code, ct, err, rec.Body)
		}
		return rec.Code, m
	case rec.Code >= 300 && rec.Code < 400:
		// The router's trailing-slash redirects: they carry nothing and run no handler.
	default:
		t.Fatalf("unexpected status %d: %s", rec.Code, rec.Body)
	}
	return rec.Code, nil
}

// strictObject decodes body the way the documented rules read it: exactly one JSON object,
// only the named fields, each at most once, spelled exactly, nothing after it.
func strictObject(body []byte, fields ...string) (map[string]json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		k, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		known := false
		for _, f := range fields {
			known = known || f == k
		}
		if _, dup := out[k]; dup || !known {
			return nil, false
		}
		out[k] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return out, true
}

// jsonString is a field's string value ("" for an absent field or null).
func jsonString(raw json.RawMessage) (string, bool) {
	if raw == nil || string(raw) == "null" {
		return "", true
	}
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

const depositPath = "/admin/v1/accounts/0192f1f0-0000-7000-8000-0000000000a1/deposits"

func FuzzCreatePayment(f *testing.F) {
	for _, s := range []struct{ key, body string }{
		{"k2", payBody},
		{"k1", payBody}, // a replay
		{"k1", otherPayBody},
		{"k2", `{"account_id":"0192f1f0-0000-7000-8000-0000000000a1","currency":"try","amount":10,"invoice_id":7,"payment_type":"purchase"}`},
		{"k2", `{"invoice_id":"inv 1","amount":"10.001","currency":"XXX","extra":1}`},
		{"k2", `{"invoice_id":"inv-2","amount":"1","currency":"TRY","account_id":"0192f1f0-0000-7000-8000-0000000000b1"}`},
		{"k2", `{"invoice_id":"inv-2","amount":"1","amount":"2","currency":"TRY","account_id":"0192f1f0-0000-7000-8000-0000000000a1"}`},
		{"has space", payBody},
		{"", `[1,2]`},
	} {
		f.Add(s.key, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, key string, body []byte) {
		req, ok := fuzzRequest("POST", "/v1/payments", map[string]string{
			"Authorization": "Bearer sk_a", "Content-Type": "application/json", "Idempotency-Key": key,
		}, body)
		if !ok {
			t.Skip()
		}
		code, res := serve(t, fuzzHandler(t), req)
		if res == nil {
			return
		}
		p, err := payment.ParseRequest(body)
		switch {
		case !payment.ValidKey(key) || err != nil:
			t.Fatalf("%d for key %q and an invalid body (%v)", code, key, err)
		case p.AccountID != accountA || p.Currency != "TRY":
			t.Fatalf("%d for a payment from account %s in %s", code, p.AccountID, p.Currency)
		case res["amount"] != payment.FormatAmount(p.AmountMinor, p.Currency):
			t.Fatalf("%d answers amount %v for %d minor units", code, res["amount"], p.AmountMinor)
		}
	})
}

// FuzzCreateRefund refunds merchant A's succeeded payment of 10.00 (fakeID(1)).
func FuzzCreateRefund(f *testing.F) {
	for _, s := range []struct{ key, body string }{
		{"r1", refundBody},
		{"r1", `{}`},
		{"r1", `{"amount":10}`},
		{"r1", `{"amount":"10.01"}`},
		{"r1", `{"amount":"0.001","reason":null}`},
		{"r1", `{"amount":"1","amount":"2"}`},
		{"r1", `{"Amount":"1"}`},
		{"r1", `{"reason":"a\u0000b"}`},
		{"r1", "{\"reason\":\"a\xffb\"}"},
		{"r1", `{"reason":"` + strings.Repeat("é", 201) + `"}`},
		{"r1", `{} []`},
		{"k1", refundBody}, // a payment's key
		{"has space", refundBody},
	} {
		f.Add(s.key, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, key string, body []byte) {
		req, ok := fuzzRequest("POST", refundsPath, map[string]string{
			"Authorization": "Bearer sk_a", "Content-Type": "application/json", "Idempotency-Key": key,
		}, body)
		if !ok {
			t.Skip()
		}
		code, res := serve(t, fuzzHandler(t), req)
		if res == nil {
			return
		}
		obj, strict := strictObject(body, "amount", "reason")
		r, err := payment.ParseRefundRequest(body)
		switch {
		case !payment.ValidKey(key) || !strict || err != nil:
			t.Fatalf("%d for key %q and an invalid body (%v)", code, key, err)
		case res["payment_id"] != fakeID(1).String():
			t.Fatalf("%d refunds payment %v", code, res["payment_id"])
		case obj["amount"] == nil && res["amount"] != "10.00":
			t.Fatalf("%d refunds %v of 10.00 for a request without an amount", code, res["amount"])
		case r.Amount != "" && res["amount"] != mustFormat(t, r):
			t.Fatalf("%d refunds %v for %q", code, res["amount"], r.Amount)
		}
	})
}

// mustFormat is a refund request's amount as the API answers it, in TRY.
func mustFormat(t *testing.T, r payment.RefundRequest) string {
	minor, err := r.AmountMinor("TRY")
	if err != nil {
		t.Fatalf("a refund of %q was answered: %v", r.Amount, err)
	}
	return payment.FormatAmount(minor, "TRY")
}

func FuzzAdminMerchantBody(f *testing.F) {
	for _, s := range []string{
		`{"name":" Cafe ","webhook_url":"https://cafe.example/hooks"}`,
		`{"name":"Acme"}`,
		`{"name":"","webhook_url":"ftp://x"}`,
		`{"name":"Cafe","plan":"gold"}`,
		`{"name":"Cafe"} {}`,
		`{"name":null,"webhook_url":null}`,
		`{"name":"` + strings.Repeat("é", 200) + `"}`, // 200 characters, 400 bytes
		`{"name":"` + strings.Repeat("é", 201) + `"}`,
		`{"name":"a\u0000b"}`,
		`{"name":"Cafe","webhook_url":"https://cafe.example/\u0000"}`,
		"{\"name\":\"a\xffb\"}",
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, _ := fuzzRequest("POST", "/admin/v1/merchants", map[string]string{
			"Authorization": "Bearer adm", "Content-Type": "application/json",
		}, body)
		code, res := serve(t, fuzzHandler(t), req)
		if res == nil {
			return
		}
		obj, ok := strictObject(body, "name", "webhook_url")
		if !ok {
			t.Fatalf("%d for a body that is not one object of name and webhook_url, each once: %q", code, body)
		}
		name, ok1 := jsonString(obj["name"])
		hook, ok2 := jsonString(obj["webhook_url"])
		name = strings.TrimSpace(name)
		if !ok1 || !ok2 || name == "" || utf8.RuneCountInString(name) > 200 {
			t.Fatalf("%d for name %q", code, name)
		}
		if hook != "" {
			u, err := url.Parse(hook)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				t.Fatalf("%d for webhook_url %q", code, hook)
			}
		}
		if res["name"] != name || res["api_key"] == "" || res["webhook_secret"] == "" {
			t.Fatalf("%d answers %v for name %q", code, res, name)
		}
	})
}

func FuzzAdminAccountBody(f *testing.F) {
	for _, s := range []string{
		`{"merchant_id":"0192f1f0-0000-7000-8000-00000000000b","currency":"kwd"}`,
		`{"merchant_id":"0192f1f0-0000-7000-8000-0000000000ff","currency":"TRY"}`,
		`{"merchant_id":"0192f1f0000070008000000000000000a","currency":"JPY"}`,
		`{"merchant_id":"acme","currency":"XXX"}`,
		`{"merchant_id":"0192f1f0-0000-7000-8000-00000000000a","currency":"TRY","kind":"system"}`,
		`{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, _ := fuzzRequest("POST", "/admin/v1/accounts", map[string]string{
			"Authorization": "Bearer adm", "Content-Type": "application/json",
		}, body)
		code, res := serve(t, fuzzHandler(t), req)
		if res == nil {
			return
		}
		obj, ok := strictObject(body, "merchant_id", "currency")
		if !ok {
			t.Fatalf("%d for a body that is not one object of merchant_id and currency, each once: %q", code, body)
		}
		mid, ok1 := jsonString(obj["merchant_id"])
		cur, ok2 := jsonString(obj["currency"])
		id, err := uuid.Parse(mid)
		want, cerr := payment.ParseCurrency(cur)
		if !ok1 || !ok2 || err != nil || (id != merchantA && id != merchantB) || cerr != nil {
			t.Fatalf("%d for merchant_id %q currency %q", code, mid, cur)
		}
		if res["currency"] != want || res["merchant_id"] != id.String() || res["balance"] != payment.FormatAmount(0, want) {
			t.Fatalf("%d answers %v", code, res)
		}
	})
}

func FuzzAdminDepositBody(f *testing.F) {
	for _, s := range []struct{ key, body string }{
		{"d1", `{"amount":"5.50"}`},
		{"d1", `{"amount":5.5}`},
		{"d1", `{"amount":"-1"}`},
		{"d1", `{"amount":"1e3"}`},
		{"d1", `{"amount":"0.001"}`},
		{"d1", `{"amount":"99999999999999999"}`},
		{"d1", `{"amount":null}`},
		{"d1", `{}`},
		{"", `{"amount":"1"}`},
		{"has space", `{"amount":"1"}`},
	} {
		f.Add(s.key, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, key string, body []byte) {
		req, ok := fuzzRequest("POST", depositPath, map[string]string{
			"Authorization": "Bearer adm", "Content-Type": "application/json", "Idempotency-Key": key,
		}, body)
		if !ok {
			t.Skip()
		}
		code, res := serve(t, fuzzHandler(t), req)
		if res == nil {
			return
		}
		obj, ok := strictObject(body, "amount")
		if !ok || !payment.ValidKey(key) {
			t.Fatalf("%d for key %q and a body that is not one object of amount: %q", code, key, body)
		}
		minor, err := payment.ParseAmountJSON(obj["amount"], "TRY")
		if err != nil {
			t.Fatalf("%d for amount %s: %v", code, obj["amount"], err)
		}
		if res["amount"] != payment.FormatAmount(minor, "TRY") || res["currency"] != "TRY" {
			t.Fatalf("%d answers %v for %d minor units", code, res, minor)
		}
	})
}

const fuzzSettlementCSV = "settlement_date,provider_charge_id,reference,amount,currency,status\n" +
	"2025-03-01,ch_1,0192f1f0-7d0c-7a39-9c5e-8f6a8b0a1c01,10.00,TRY,settled\n"

func FuzzSettlementUpload(f *testing.F) {
	for _, s := range []struct{ query, body string }{
		{"date=2025-03-01", fuzzSettlementCSV},
		{"dry_run=true&merchant_id=0192f1f0-0000-7000-8000-00000000000a", fuzzSettlementCSV},
		{"date=yesterday&merchant_id=acme&dry_run=maybe", fuzzSettlementCSV},
		{"", fuzzSettlementCSV + "trailer,2025-03-01,1,2025-03-02T00:00:00Z,,\n"},
		{"", fuzzSettlementCSV + "2025-03-01,ch_3,nope,1,TRY,paid\n"},
		{"dry_run=1", "\xEF\xBB\xBF" + fuzzSettlementCSV},
		{"dry_run=&dry_run=true", fuzzSettlementCSV},
		{"dry_run=false&dry_run=true", fuzzSettlementCSV},
		{"dry_run=true&dry_run=maybe", fuzzSettlementCSV},
		{"", "a,b\n\"unterminated"},
		{"", ""},
	} {
		f.Add(s.query, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, query string, body []byte) {
		req, ok := fuzzRequest("POST", "/admin/v1/settlements?"+query, map[string]string{
			"Authorization": "Bearer adm", "Content-Type": "text/csv",
		}, body)
		if !ok {
			t.Skip()
		}
		code, res := serve(t, fuzzHandler(t), req)
		if res == nil {
			return
		}
		q, _ := url.ParseQuery(req.URL.RawQuery)
		for _, d := range q["date"] {
			if _, err := reconcile.ParseDay(d); err != nil {
				t.Fatalf("%d for date=%q", code, d)
			}
		}
		for _, m := range q["merchant_id"] {
			if _, err := uuid.Parse(m); err != nil {
				t.Fatalf("%d for merchant_id=%q", code, m)
			}
		}
		// An operator who asked for a dry run anywhere in the query must never get a real import.
		dryRun := false
		for _, v := range q["dry_run"] {
			b, err := strconv.ParseBool(v)
			if err != nil && v != "" {
				t.Fatalf("%d for dry_run=%q", code, v)
			}
			dryRun = dryRun || b
		}
		if dryRun && res["dry_run"] != true {
			t.Fatalf("%d imported for real with dry_run values %q", code, q["dry_run"])
		}
		file, err := reconcile.ParseFile(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%d for a file ParseFile refuses: %v", code, err)
		}
		if res["lines"] != float64(len(file.Lines)) {
			t.Fatalf("%d reports %v lines, the file has %d", code, res["lines"], len(file.Lines))
		}
	})
}

func FuzzPaymentByKeyQuery(f *testing.F) {
	for _, q := range []string{
		"idempotency_key=k1", "idempotency_key=k9", "", "idempotency_key=", "idempotency_key=k1&idempotency_key=k2",
		"idempotency_key=has%20space", "idempotency_key=" + strings.Repeat("k", 256), "idempotency_key=%zz", "IDEMPOTENCY_KEY=k1",
		"limit=1&status=succeeded", "limit=0", "starting_after=" + fakeID(1).String(), "created_gte=2025-03-01T00:00:00Z&created_lt=2025-03-01T00:00:00Z",
		"idempotency_key=k1&limit=5",
	} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, query string) {
		req, ok := fuzzRequest("GET", "/v1/payments?"+query, map[string]string{"Authorization": "Bearer sk_a"}, nil)
		if !ok {
			t.Skip()
		}
		code, res := serve(t, fuzzHandler(t), req)
		if res == nil {
			return
		}
		q, _ := url.ParseQuery(req.URL.RawQuery)
		if _, lookup := q["idempotency_key"]; !lookup {
			// Without a key it lists the merchant's payments: at most k1's, and nothing after.
			data, isList := res["data"].([]any)
			if more, _ := res["has_more"].(bool); !isList || more || len(data) > 1 {
				t.Fatalf("%d answers %v", code, res)
			}
			for _, p := range data {
				if p, _ := p.(map[string]any); p["invoice_id"] != "inv-1" {
					t.Fatalf("%d lists %v", code, p)
				}
			}
			return
		}
		if len(q["idempotency_key"]) == 0 || q["idempotency_key"][0] != "k1" {
			t.Fatalf("%d for idempotency_key %q: only k1 exists", code, q["idempotency_key"])
		}
		if res["invoice_id"] != "inv-1" {
			t.Fatalf("%d answers %v", code, res)
		}
	})
}

func FuzzDeliveriesQuery(f *testing.F) {
	for _, s := range []struct{ id, query string }{
		{merchantA.String(), ""},
		{merchantA.String(), "limit=1"},
		{merchantA.String(), "limit=200"},
		{merchantA.String(), "limit=0"},
		{merchantA.String(), "limit=201"},
		{merchantA.String(), "limit=-1"},
		{merchantA.String(), "limit=1e2"},
		{merchantA.String(), "limit=9223372036854775808"},
		{merchantB.String(), "limit=5&limit=6"},
		{"acme", "limit=5"},
		{"", ""},
	} {
		f.Add(s.id, s.query)
	}
	f.Fuzz(func(t *testing.T, id, query string) {
		req, ok := fuzzRequest("GET", "/admin/v1/merchants/"+url.PathEscape(id)+"/deliveries?"+query,
			map[string]string{"Authorization": "Bearer adm"}, nil)
		if !ok {
			t.Skip()
		}
		code, res := serve(t, fuzzHandler(t), req)
		if res == nil {
			return
		}
		mid, err := uuid.Parse(id)
		if err != nil {
			t.Fatalf("%d for merchant id %q", code, id)
		}
		q, _ := url.ParseQuery(req.URL.RawQuery)
		limit := defaultDeliveryLimit
		if vs := q["limit"]; len(vs) > 0 {
			n, err := strconv.Atoi(vs[0])
			if err != nil || n < 1 || n > maxDeliveryLimit {
				t.Fatalf("%d for limit=%q", code, vs[0])
			}
			limit = n
		}
		list, _ := res["deliveries"].([]any)
		if res["merchant_id"] != mid.String() || len(list) > limit {
			t.Fatalf("%d answers %d deliveries of %v for limit %d", code, len(list), res["merchant_id"], limit)
		}
	})
}
