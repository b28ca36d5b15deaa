package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
)

// parseOnly parses like the real reconciler and reports every line as matched.
type parseOnly struct {
	got   reconcile.Options
	calls int
	err   error
}

func (p *parseOnly) Import(_ context.Context, f io.Reader, o reconcile.Options) (*reconcile.Report, error) {
	p.calls++
	p.got = o
	if p.err != nil {
		return nil, p.err
	}
	lines, err := reconcile.Parse(f)
	if err != nil {
		return nil, err
	}
	r := &reconcile.Report{DryRun: o.DryRun, Days: o.Days, Lines: len(lines)}
	r.Counts.Matched = len(lines)
	return r, nil
}

const settlementCSV = "settlement_date,provider_charge_id,reference,amount,currency,status\n" +
	"2025-03-01,ch_1,0192f1f0-7d0c-7a39-9c5e-8f6a8b0a1c01,10.00,TRY,settled\n"

func postSettlement(t *testing.T, h http.Handler, query, contentType, body string) (*httptest.ResponseRecorder, map[string]any) {
	t.Helper()
	req := httptest.NewRequest("POST", "/admin/v1/settlements"+query, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer adm")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var m map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &m), "%s", rec.Body)
	return rec, m
}

func TestSettlementsEndpoint(t *testing.T) {
	t.Parallel()
	rc := &parseOnly{}
	h := New(Options{Store: newFakeStore(), AdminToken: "adm", Reconciler: rc, Logger: slog.New(slog.DiscardHandler)}).Handler()

	rec, body := postSettlement(t, h, "?date=2025-03-01&merchant_id=0192f1f0-0000-7000-8000-00000000000a", "text/csv; charset=utf-8", settlementCSV)
	require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.Equal(t, true, body["ok"])
	require.Equal(t, float64(1), body["lines"])
	require.Equal(t, []reconcile.Day{"2025-03-01"}, rc.got.Days)
	require.Equal(t, "0192f1f0-0000-7000-8000-00000000000a", rc.got.Merchants[0].String())
	require.False(t, rc.got.DryRun)
	require.Equal(t, false, body["dry_run"])

	rec, body = postSettlement(t, h, "?dry_run=true", "text/csv", settlementCSV)
	require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
	require.True(t, rc.got.DryRun)
	require.Equal(t, true, body["dry_run"], "the report says it was a dry run")

	rec, _ = postSettlement(t, h, "?scope=all", "text/csv", settlementCSV)
	require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
	require.True(t, rc.got.AllMerchants)
	require.Empty(t, rc.got.Merchants)
	rec, _ = postSettlement(t, h, "", "text/csv", settlementCSV)
	require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
	require.False(t, rc.got.AllMerchants, "no scope declared")
	require.Empty(t, rc.got.Merchants)
	for _, q := range []string{"?scope=merchants", "?scope=", "?scope=all&merchant_id=0192f1f0-0000-7000-8000-00000000000a"} {
		rec, body = postSettlement(t, h, q, "text/csv", settlementCSV)
		require.Equal(t, http.StatusBadRequest, rec.Code, q)
		require.Equal(t, "scope", body["errors"].([]any)[0].(map[string]any)["field"], q)
	}

	bad := settlementCSV + "2025-03-01,ch_2,0192f1f0-7d0c-7a39-9c5e-8f6a8b0a1c02,10.001,TRY,settled\n2025-03-01,ch_3,nope,1,TRY,paid\n"
	rec, body = postSettlement(t, h, "", "text/csv", bad)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	require.Equal(t, "invalid_settlement_file", body["code"])
	errs := body["errors"].([]any)
	require.Len(t, errs, 3)
	require.Equal(t, map[string]any{"field": "line 3", "message": `amount: "10.001": ` + payment.ErrTooManyDecimals.Error()}, errs[0])
	require.Equal(t, "line 4", errs[1].(map[string]any)["field"])
	require.Contains(t, body["detail"], "line 3: amount:")

	calls := rc.calls
	rec, body = postSettlement(t, h, "", "application/json", settlementCSV)
	require.Equal(t, http.StatusUnsupportedMediaType, rec.Code)
	require.Equal(t, "unsupported_media_type", body["code"])
	require.Equal(t, "content type must be text/csv", body["detail"])
	rec, _ = postSettlement(t, h, "", "", settlementCSV)
	require.Equal(t, http.StatusUnsupportedMediaType, rec.Code)

	rec, body = postSettlement(t, h, "?date=yesterday&merchant_id=acme&dry_run=maybe", "text/csv", settlementCSV)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Equal(t, "invalid_request", body["code"])
	require.Len(t, body["errors"], 3)
	require.Equal(t, map[string]any{"field": "dry_run", "message": "must be true or false"}, body["errors"].([]any)[2])

	big := settlementCSV + strings.Repeat("x", MaxSettlementBytes)
	rec, body = postSettlement(t, h, "", "text/csv", big)
	require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
	require.Equal(t, "request body exceeds 16 MiB", body["detail"])
	require.Equal(t, calls, rc.calls, "rejected requests never reach the reconciler")

	rc.err = payment.ErrUnavailable
	rec, body = postSettlement(t, h, "", "text/csv", settlementCSV)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "unavailable", body["code"])
}

func TestSettlementsNeedsAdmin(t *testing.T) {
	t.Parallel()
	h := New(Options{Store: newFakeStore(), AdminToken: "adm", Reconciler: &parseOnly{}}).Handler()
	req := httptest.NewRequest("POST", "/admin/v1/settlements", strings.NewReader(settlementCSV))
	req.Header.Set("Content-Type", "text/csv")
	req.Header.Set("Authorization", "Bearer sk_merchant")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusUnauthorized, rec.Code)
}
