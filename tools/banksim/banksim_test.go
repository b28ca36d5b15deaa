package banksim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

type env struct {
	sim *Sim
	srv *httptest.Server
	dir string
}

func start(t *testing.T, dir string, c Capability) *env {
	t.Helper()
	s, err := New(Options{DataDir: dir, Capability: c})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); _ = s.Close() })
	return &env{sim: s, srv: srv, dir: dir}
}

func newEnv(t *testing.T, c Capability) *env { return start(t, t.TempDir(), c) }

func chargeReq(ref string) chargeRequest {
	return chargeRequest{Reference: ref, AmountMinor: 12345, Currency: "TRY", AccountID: "acc_1"}
}

// do sends a request and returns status and body; it fails the test on transport errors.
func (e *env) do(t *testing.T, method, path string, header map[string]string, body any) (int, []byte) {
	t.Helper()
	resp, err := e.send(http.DefaultClient, method, path, header, body)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

func (e *env) send(c *http.Client, method, path string, header map[string]string, body any) (*http.Response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return c.Do(req)
}

func (e *env) charge(t *testing.T, key string, req any) (int, charge) {
	t.Helper()
	return posted[charge](t, e, "/v1/charges", key, req)
}

// posted sends req with key to path and returns the status and, if created, what was.
func posted[V any](t *testing.T, e *env, path, key string, req any) (int, V) {
	t.Helper()
	code, b := e.do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": key}, req)
	var v V
	if code == http.StatusCreated {
		require.NoError(t, json.Unmarshal(b, &v))
	}
	return code, v
}

type simCharges struct {
	Count   int      `json:"count"`
	Charges []record `json:"charges"`
	Pending int      `json:"pending"`
}

func (e *env) moved(t *testing.T, ref string) simCharges {
	t.Helper()
	return kept[simCharges](t, e, "/_sim/charges", ref)
}

// kept is what the control API at path shows of ref ("" for everything).
func kept[V any](t *testing.T, e *env, path, ref string) V {
	t.Helper()
	if ref != "" {
		path += "?reference=" + ref
	}
	code, b := e.do(t, http.MethodGet, path, nil, nil)
	require.Equal(t, http.StatusOK, code)
	var out V
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func (e *env) faults(t *testing.T, rules string) {
	t.Helper()
	code, b := e.do(t, http.MethodPut, "/_sim/faults", nil, `{"rules":`+rules+`}`)
	require.Equal(t, http.StatusOK, code, string(b))
}

func TestChargeValidation(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	tests := []struct {
		name string
		key  string
		body string
		want int
	}{
		{"ok", "k", `{"reference":"r","amount_minor":1,"currency":"TRY","account_id":"a"}`, 201},
		{"missing key", "", `{"reference":"r","amount_minor":1,"currency":"TRY","account_id":"a"}`, 400},
		{"unknown field", "k1", `{"reference":"r","amount_minor":1,"currency":"TRY","account_id":"a","x":1}`, 400},
		{"zero amount", "k2", `{"reference":"r","amount_minor":0,"currency":"TRY","account_id":"a"}`, 400},
		{"negative amount", "k3", `{"reference":"r","amount_minor":-5,"currency":"TRY","account_id":"a"}`, 400},
		{"fractional amount", "k4", `{"reference":"r","amount_minor":1.5,"currency":"TRY","account_id":"a"}`, 400},
		{"bad currency", "k5", `{"reference":"r","amount_minor":1,"currency":"try","account_id":"a"}`, 400},
		{"withdrawn currency", "k5a", `{"reference":"r","amount_minor":1,"currency":"DEM","account_id":"a"}`, 400},
		{"metal", "k5b", `{"reference":"r","amount_minor":1,"currency":"XAU","account_id":"a"}`, 400},
		{"no such currency", "k5c", `{"reference":"r","amount_minor":1,"currency":"ABC","account_id":"a"}`, 400},
		{"no reference", "k6", `{"amount_minor":1,"currency":"TRY","account_id":"a"}`, 400},
		{"no account", "k7", `{"reference":"r","amount_minor":1,"currency":"TRY"}`, 400},
		{"malformed", "k8", `{"reference":`, 400},
		{"trailing data", "k9", `{"reference":"r","amount_minor":1,"currency":"TRY","account_id":"a"} {}`, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := e.do(t, http.MethodPost, "/v1/charges", map[string]string{"Idempotency-Key": tt.key}, tt.body)
			require.Equal(t, tt.want, code, string(b))
			if code == http.StatusBadRequest {
				var out map[string]string
				require.NoError(t, json.Unmarshal(b, &out))
				require.NotEmpty(t, out["error"])
			}
		})
	}
	require.Equal(t, 1, e.moved(t, "").Count)
}

func TestIdempotentReplayMovesMoneyOnce(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	code, first := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, http.StatusCreated, code)
	require.True(t, strings.HasPrefix(first.ID, "ch_"))
	require.Equal(t, statusSucceeded, first.Status)
	require.Equal(t, time.UTC, first.CreatedAt.Location())

	code, again := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, first, again)
	require.Equal(t, 1, e.moved(t, "op-1").Count)

	// A repeated key returns the first result whatever the request says, and moves no money
	// again (docs/tools.md).
	other := chargeReq("op-1")
	other.AmountMinor++
	code, again = e.charge(t, "op-1", other)
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, first, again)
	require.Equal(t, 1, e.moved(t, "op-1").Count)
}

func TestIdempotentParallelSameKey(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	const n = 50
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			code, c := e.charge(t, "op-par", chargeReq("op-par"))
			if code == http.StatusCreated {
				ids[i] = c.ID
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		require.Equal(t, ids[0], id)
	}
	got := e.moved(t, "op-par")
	require.Equal(t, 1, got.Count)
	require.Len(t, got.Charges, 1)
	require.Equal(t, "op-par", got.Charges[0].IdempotencyKey)
}

func TestNoIdempotency(t *testing.T) {
	for _, c := range []Capability{CapabilityNone, CapabilityInquiry} {
		t.Run(string(c), func(t *testing.T) {
			e := newEnv(t, c)
			_, a := e.charge(t, "op-1", chargeReq("op-1"))
			_, b := e.charge(t, "op-1", chargeReq("op-1"))
			require.NotEqual(t, a.ID, b.ID)
			require.Equal(t, 2, e.moved(t, "op-1").Count)

			code, _ := e.do(t, http.MethodGet, "/v1/charges?reference=op-1", nil, nil)
			if c == CapabilityNone {
				require.Equal(t, http.StatusNotImplemented, code)
			} else {
				require.Equal(t, http.StatusOK, code)
			}
		})
	}
}

func TestInquiry(t *testing.T) {
	e := newEnv(t, CapabilityInquiry)
	e.faults(t, `[{"on":"charge","action":"decline","count":1}]`)
	_, declined := e.charge(t, "op-1", chargeReq("op-1"))
	_, ok := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, statusDeclined, declined.Status)

	code, b := e.do(t, http.MethodGet, "/v1/charges?reference=op-1", nil, nil)
	require.Equal(t, http.StatusOK, code)
	var got charge
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, ok, got, "the succeeded charge is preferred")

	code, b = e.do(t, http.MethodGet, "/v1/charges?reference=nope", nil, nil)
	require.Equal(t, http.StatusNotFound, code)
	require.JSONEq(t, `{"error":"not found"}`, string(b))

	e.faults(t, `[{"on":"inquiry","action":"error_500","count":1}]`)
	code, _ = e.do(t, http.MethodGet, "/v1/charges?reference=op-1", nil, nil)
	require.Equal(t, http.StatusInternalServerError, code)
	code, _ = e.do(t, http.MethodGet, "/v1/charges?reference=op-1", nil, nil)
	require.Equal(t, http.StatusOK, code)
}

func TestRestartRemembersChargesAndKeys(t *testing.T) {
	dir := t.TempDir()
	s, err := New(Options{DataDir: dir})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	e := &env{sim: s, srv: srv, dir: dir}
	_, first := e.charge(t, "op-1", chargeReq("op-1"))
	srv.Close()
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")

	e = start(t, dir, CapabilityIdempotent)
	code, again := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, first, again)
	other := chargeReq("op-1")
	other.AccountID = "acc_2"
	code, again = e.charge(t, "op-1", other)
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, first, again, "another request under the key: the first result")
	require.Equal(t, 1, e.moved(t, "op-1").Count)
}

func TestTornLastLineTolerated(t *testing.T) {
	dir := t.TempDir()
	good := `{"id":"ch_1","reference":"op-1","amount_minor":100,"currency":"TRY","account_id":"a","status":"succeeded","created_at":"2025-03-14T10:00:00Z","idempotency_key":"op-1"}` + "\n"
	torn := `{"id":"ch_2","reference":"op-2","amou`
	require.NoError(t, os.WriteFile(filepath.Join(dir, logFile), []byte(good+torn), 0o644))

	e := start(t, dir, CapabilityIdempotent)
	require.Equal(t, 1, e.moved(t, "").Count)
	code, c := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, "ch_1", c.ID, "key op-1 is remembered: its first result")
	code, _ = e.charge(t, "op-3", chargeReq("op-3"))
	require.Equal(t, http.StatusCreated, code)
	require.NoError(t, e.sim.Close())

	// The torn bytes were cut, so the new record is a clean line of its own.
	s, err := New(Options{DataDir: dir})
	require.NoError(t, err)
	defer s.Close()
	require.Len(t, s.charges.records, 2)
	require.Equal(t, "op-3", s.charges.records[1].Reference)
}

func TestCorruptMiddleLineRejected(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, logFile), []byte("garbage\n{}\n"), 0o644))
	_, err := New(Options{DataDir: dir})
	require.Error(t, err)
}

func TestDropResponse(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.faults(t, `[{"on":"charge","action":"drop_response","count":1}]`)
	// A fresh connection per request: on a reused keep-alive connection Go's
	// transport silently re-sends requests carrying an Idempotency-Key.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	_, err := e.send(client, http.MethodPost, "/v1/charges", map[string]string{"Idempotency-Key": "op-1"}, chargeReq("op-1"))
	require.Error(t, err)
	require.ErrorIs(t, err, io.EOF)
	got := e.moved(t, "op-1")
	require.Equal(t, 1, got.Count, "money moved although the client got no answer")

	// The retry with the same key gets the stored result and moves nothing.
	code, c := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, got.Charges[0].ID, c.ID)
	require.Equal(t, 1, e.moved(t, "op-1").Count)
}

func TestError500ThenSuccess(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.faults(t, `[{"on":"charge","action":"error_500","count":2}]`)
	for range 2 {
		code, _ := e.charge(t, "op-1", chargeReq("op-1"))
		require.Equal(t, http.StatusInternalServerError, code)
		require.Equal(t, 0, e.moved(t, "op-1").Count)
	}
	code, _ := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, 1, e.moved(t, "op-1").Count)

	code, b := e.do(t, http.MethodGet, "/_sim/faults", nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"rules":[{"on":"charge","action":"error_500","count":2,"remaining":0}]}`, string(b))
}

func TestDecline(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.faults(t, `[{"on":"charge","action":"decline"}]`)
	code, c := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, statusDeclined, c.Status)
	got := e.moved(t, "op-1")
	require.Equal(t, 0, got.Count)
	require.Len(t, got.Charges, 1, "declines are recorded")

	// Clearing the faults does not change the stored answer for the key.
	code, _ = e.do(t, http.MethodDelete, "/_sim/faults", nil, nil)
	require.Equal(t, http.StatusNoContent, code)
	_, again := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, c, again)
}

func TestHang(t *testing.T) {
	e := newEnv(t, CapabilityNone)
	e.faults(t, `[{"on":"charge","action":"hang"}]`)
	client := &http.Client{Timeout: 200 * time.Millisecond}
	_, err := e.send(client, http.MethodPost, "/v1/charges", map[string]string{"Idempotency-Key": "op-1"}, chargeReq("op-1"))
	require.Error(t, err)
	var ue interface{ Timeout() bool }
	require.True(t, errors.As(err, &ue) && ue.Timeout(), err)

	// httptest.Server.Close waits for running handlers: the hung one must end.
	closed := make(chan struct{})
	go func() { e.srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("hanging handler did not end after the client gave up")
	}
	rec := httptest.NewRecorder() // the server is closed: ask the handler directly
	e.sim.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/_sim/charges", nil))
	var got simCharges
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	require.Equal(t, 0, got.Count)
	require.Empty(t, got.Charges)
}

func TestHangReleasedByClose(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.faults(t, `[{"on":"inquiry","action":"hang"}]`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.URL+"/v1/charges?reference=x", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, e.sim.Close())
	err := <-errc
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "released by Close, not by the client timeout")
}

// Release (a shutdown's first step) ends hanging requests and nothing else: the bank still books.
func TestHangReleasedByRelease(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.faults(t, `[{"on":"charge","action":"hang","count":1}]`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	answers := make(chan answer, 1)
	go func() { answers <- e.tryCharge(t, "op-1") }()
	time.Sleep(100 * time.Millisecond)
	e.sim.Release()
	select {
	case a := <-answers:
		require.True(t, a.dropped, "the hanging request's connection is dropped: %d %s", a.code, a.body)
	case <-ctx.Done():
		t.Fatal("Release did not end the hanging request")
	}
	code, _ := e.charge(t, "op-2", chargeReq("op-2"))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, 1, e.moved(t, "op-2").Count)
}

// Release ends a request a delay rule holds as it ends a hanging one: a shutdown need not wait
// out the delay.
func TestDelayReleasedByRelease(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.faults(t, `[{"on":"charge","action":"delay","delay_ms":30000,"count":1}]`)
	answers := make(chan answer, 1)
	go func() { answers <- e.tryCharge(t, "op-1") }()
	time.Sleep(100 * time.Millisecond)
	e.sim.Release()
	select {
	case a := <-answers:
		require.True(t, a.dropped, "the delayed request's connection is dropped: %d %s", a.code, a.body)
	case <-time.After(5 * time.Second):
		t.Fatal("Release did not end the delayed request")
	}
	require.Zero(t, e.moved(t, "op-1").Count, "a request the bank went down before serving moved nothing")
}

// One data directory is one bank: a second simulator on it is refused, or it would answer a key
// the first one charged by charging it again.
func TestSecondSimulatorOnOneDataDirIsRefused(t *testing.T) {
	dir := t.TempDir()
	first := start(t, dir, CapabilityIdempotent)
	_, err := New(Options{DataDir: dir, Capability: CapabilityIdempotent})
	require.ErrorContains(t, err, "another bank simulator runs on "+dir)
	require.NoError(t, first.sim.Close())
	again, err := New(Options{DataDir: dir, Capability: CapabilityIdempotent})
	require.NoError(t, err, "free once the first is closed")
	require.NoError(t, again.Close())
}

func TestDelay(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.faults(t, `[{"on":"charge","action":"delay","delay_ms":150,"count":1}]`)
	start := time.Now()
	code, _ := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, http.StatusCreated, code)
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
	require.Equal(t, 1, e.moved(t, "op-1").Count)
}

func TestProbabilityZeroNeverFires(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.faults(t, `[{"on":"charge","action":"error_500","probability":0}]`)
	code, _ := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, http.StatusCreated, code)
}

func TestFaultValidation(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	tests := []struct {
		name string
		body string
		want int
	}{
		{"valid", `{"rules":[{"on":"charge","action":"drop_response","count":1,"probability":0.5},{"on":"inquiry","action":"delay","delay_ms":10}]}`, 200},
		{"empty", `{"rules":[]}`, 200},
		{"refund", `{"rules":[{"on":"refund","action":"error_500"}]}`, 200},
		{"unknown on", `{"rules":[{"on":"payout","action":"error_500"}]}`, 400},
		{"unknown action", `{"rules":[{"on":"charge","action":"explode"}]}`, 400},
		{"decline on inquiry", `{"rules":[{"on":"inquiry","action":"decline"}]}`, 400},
		{"delay without ms (its default)", `{"rules":[{"on":"charge","action":"delay"}]}`, 200},
		{"zero count", `{"rules":[{"on":"charge","action":"hang","count":0}]}`, 400},
		{"probability > 1", `{"rules":[{"on":"charge","action":"hang","probability":1.5}]}`, 400},
		{"unknown field", `{"rules":[{"on":"charge","action":"hang","when":"now"}]}`, 400},
		{"malformed", `{"rules":`, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := e.do(t, http.MethodPut, "/_sim/faults", nil, tt.body)
			require.Equal(t, tt.want, code, string(b))
		})
	}
}

func TestSettlementCSV(t *testing.T) {
	e := newEnv(t, CapabilityNone)
	day := time.Date(2025, 3, 14, 23, 59, 59, 0, time.UTC)
	e.sim.now = func() time.Time { return day }

	_, try := e.charge(t, "op-try", chargeReq("op-try"))
	_, jpy := e.charge(t, "op-jpy", chargeRequest{Reference: "op-jpy", AmountMinor: 500, Currency: "JPY", AccountID: "a"})
	_, kwd := e.charge(t, "op-kwd", chargeRequest{Reference: "op-kwd", AmountMinor: 1005, Currency: "KWD", AccountID: "a"})
	_, cents := e.charge(t, "op-cents", chargeRequest{Reference: "op-cents", AmountMinor: 7, Currency: "EUR", AccountID: "a"})
	e.faults(t, `[{"on":"charge","action":"decline","count":1}]`)
	_, declined := e.charge(t, "op-dec", chargeReq("op-dec"))
	require.Equal(t, statusDeclined, declined.Status)
	e.sim.now = func() time.Time { return day.Add(time.Second) } // next UTC day
	e.charge(t, "op-next", chargeReq("op-next"))

	code, b := e.do(t, http.MethodGet, "/v1/settlements/2025-03-14.csv", nil, nil)
	require.Equal(t, http.StatusOK, code)
	want := "settlement_date,provider_charge_id,reference,amount,currency,status,type\n" +
		"scope,all,charge refund,,,,\n" +
		"2025-03-14," + try.ID + ",op-try,123.45,TRY,settled,charge\n" +
		"2025-03-14," + jpy.ID + ",op-jpy,500,JPY,settled,charge\n" +
		"2025-03-14," + kwd.ID + ",op-kwd,1.005,KWD,settled,charge\n" +
		"2025-03-14," + cents.ID + ",op-cents,0.07,EUR,settled,charge\n" +
		"trailer,2025-03-14,4,2025-03-15T00:00:00Z,,,\n"
	require.Equal(t, want, string(b))

	code, b = e.do(t, http.MethodGet, "/v1/settlements/2025-03-16.csv", nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "settlement_date,provider_charge_id,reference,amount,currency,status,type\n"+
		"scope,all,charge refund,,,,\n"+
		"trailer,2025-03-16,0,2025-03-15T00:00:00Z,,,\n", string(b))

	for _, bad := range []string{"2025-13-01.csv", "2025-03-14", "2025-3-14.csv", "today.csv"} {
		code, _ = e.do(t, http.MethodGet, "/v1/settlements/"+bad, nil, nil)
		require.Equal(t, http.StatusBadRequest, code, bad)
	}
}

func TestSettlementCSVToday(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	_, c := e.charge(t, "op-1", chargeReq("op-1"))
	today := time.Now().UTC().Format(time.DateOnly)
	resp, err := e.send(http.DefaultClient, http.MethodGet, "/v1/settlements/"+today+".csv", nil, nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/csv", resp.Header.Get("Content-Type"))
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(b), today+","+c.ID+",op-1,123.45,TRY,settled,charge\n")
}

func TestFormatAmount(t *testing.T) {
	tests := []struct {
		minor    int64
		currency string
		want     string
	}{
		{12345, "TRY", "123.45"},
		{1, "TRY", "0.01"},
		{100, "TRY", "1.00"},
		{100, "JPY", "100"},
		{1, "KWD", "0.001"},
		{1000, "BHD", "1.000"},
		{-250, "USD", "-2.50"},
		// The simulator's settlement files use kasa's ISO 4217 table.
		{1500, "XOF", "1500"},
		{1500, "IQD", "1.500"},
		{125, "IRR", "1.25"},
		{12345, "UYW", "1.2345"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, payment.FormatAmount(tt.minor, tt.currency), "%d %s", tt.minor, tt.currency)
	}
}

func TestHealthz(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	code, _ := e.do(t, http.MethodGet, "/_sim/healthz", nil, nil)
	require.Equal(t, http.StatusOK, code)
}

func TestNewOptions(t *testing.T) {
	_, err := New(Options{})
	require.Error(t, err)
	_, err = New(Options{DataDir: t.TempDir(), Capability: "magic"})
	require.Error(t, err)
}
