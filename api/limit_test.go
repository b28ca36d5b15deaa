package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// serveTCP serves s on a loopback port the way `kasa api` does (HTTPServer over Listener) and
// returns its address.
func serveTCP(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := s.HTTPServer()
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ln.Addr().String()
}

// closedWithin reports whether the server closes conn within d, reading (and dropping)
// whatever it answers meanwhile.
func closedWithin(conn net.Conn, d time.Duration) bool {
	closed := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, conn); close(closed) }()
	select {
	case <-closed:
		return true
	case <-time.After(d):
		return false
	}
}

const paymentHead = "POST /v1/payments HTTP/1.1\r\nHost: kasa\r\nAuthorization: Bearer sk_a\r\n" +
	"Content-Type: application/json\r\nIdempotency-Key: slow\r\nContent-Length: 4000\r\n\r\n"

// TestSlowClientIsDisconnected: a client that trickles its headers or its body, a byte at a
// time, holds a connection and a goroutine; the read timeout ends it.
func TestSlowClientIsDisconnected(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		prefix  string // sent at once
		trickle string // then a byte every 50ms
	}{
		{"headers", "", paymentHead},
		{"body", paymentHead, strings.Repeat(" ", 4000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _, _ := newTestServer(t, func(o *Options) {
				o.Limits = Limits{ReadTimeout: 500 * time.Millisecond, WriteTimeout: 2 * time.Second, IdleTimeout: time.Second}
			})
			conn, err := net.Dial("tcp", serveTCP(t, s))
			require.NoError(t, err)
			defer conn.Close()
			_, err = io.WriteString(conn, tc.prefix)
			require.NoError(t, err)
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				for i := range len(tc.trickle) {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					if _, err := io.WriteString(conn, tc.trickle[i:i+1]); err != nil {
						return
					}
				}
			}()
			start := time.Now()
			require.True(t, closedWithin(conn, 5*time.Second), "a client trickling its %s is still connected after 5s", tc.name)
			require.Less(t, time.Since(start), 3*time.Second)
		})
	}
}

// TestIdleConnectionIsClosed: a keep-alive connection with no request is closed after the
// idle timeout.
func TestIdleConnectionIsClosed(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestServer(t, func(o *Options) {
		o.Limits = Limits{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: 300 * time.Millisecond}
	})
	conn, err := net.Dial("tcp", serveTCP(t, s))
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: kasa\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.False(t, resp.Close, "the connection is kept alive")
	start := time.Now()
	closed := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, br); close(closed) }()
	select {
	case <-closed:
	case <-time.After(4 * time.Second):
		t.Fatal("an idle keep-alive connection is still open after 4s")
	}
	require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond, "closed by the idle timeout, not at once")
}

// TestConnectionCap: past MaxConns open connections, a new one waits until one closes.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestServer(t, func(o *Options) {
		o.Limits = Limits{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxConns: 2}
	})
	addr := serveTCP(t, s)
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		held = append(held, c)
	}
	client := &http.Client{Timeout: 500 * time.Millisecond}
	_, err := client.Get("http://" + addr + "/healthz")
	require.Error(t, err, "a third connection is not served while two are open")

	require.NoError(t, held[0].Close())
	client.Timeout = 3 * time.Second
	resp, err := client.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// problemOf decodes a problem+json answer.
func problemOf(t *testing.T, rec *httptest.ResponseRecorder) problem {
	t.Helper()
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	var p problem
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
	return p
}

// TestInFlightCap: past MaxInFlight merchant requests being handled, the next one is answered
// 503 at once rather than queued; the operations endpoints still answer.
func TestInFlightCap(t *testing.T) {
	t.Parallel()
	s, st, wf := newTestServer(t, func(o *Options) {
		o.SyncWait = 2 * time.Second
		o.Limits = Limits{MaxInFlight: 1}
	})
	wf.outcome = "" // the payment stays processing: its request waits SyncWait
	h := s.Handler()
	var wg sync.WaitGroup
	wg.Go(func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request{body: payBody}.build())
		require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	})
	require.Eventually(t, func() bool {
		wf.mu.Lock()
		defer wf.mu.Unlock()
		return wf.starts == 1
	}, 2*time.Second, 5*time.Millisecond)

	start := time.Now()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request{method: "GET", path: "/v1/accounts/" + accountA.String()}.build())
	require.Less(t, time.Since(start), time.Second, "answered at once, not after the 2s request ahead of it")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
	require.Equal(t, "unavailable", problemOf(t, rec).Code)
	st.mu.Lock()
	require.Zero(t, st.calls["Account"], "the rejected request did no work")
	st.mu.Unlock()

	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		require.Equal(t, http.StatusOK, rec.Code, path)
	}
	wg.Wait()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, request{method: "GET", path: "/v1/accounts/" + accountA.String()}.build())
	require.Equal(t, http.StatusOK, rec.Code, "the slot is free again")
}

// TestMerchantShareOfInFlight: one merchant holds at most its share of MaxInFlight; past it its
// requests are answered 503 while another merchant's are still served. A share below 1 never
// gives one merchant every slot: a merchant holding both of two, at 0.9, would leave another
// refused while it alone is busy.
func TestMerchantShareOfInFlight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		inFlight int
		share    float64
	}{
		{"one request per merchant", 4, 0.25},
		{"a share below 1 leaves room", 2, 0.9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, st, wf := newTestServer(t, func(o *Options) {
				o.SyncWait = 2 * time.Second
				o.Limits = Limits{MaxInFlight: tc.inFlight, MerchantShare: tc.share}
			})
			wf.outcome = "" // the payment stays processing: its request waits SyncWait
			h := s.Handler()
			var wg sync.WaitGroup
			wg.Go(func() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, request{body: payBody}.build())
				require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
			})
			require.Eventually(t, func() bool {
				wf.mu.Lock()
				defer wf.mu.Unlock()
				return wf.starts == 1
			}, 2*time.Second, 5*time.Millisecond)

			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, request{method: "GET", path: "/v1/accounts/" + accountA.String()}.build())
			require.Equal(t, http.StatusServiceUnavailable, rec.Code, "merchant A is at its share: %s", rec.Body.String())
			st.mu.Lock()
			require.Zero(t, st.calls["Account"], "the rejected request did no work")
			st.mu.Unlock()

			rec = httptest.NewRecorder()
			h.ServeHTTP(rec, request{method: "GET", path: "/v1/accounts/" + accountB.String(), header: map[string]string{"Authorization": "Bearer sk_b"}}.build())
			require.Equal(t, http.StatusOK, rec.Code, "merchant B is served meanwhile: %s", rec.Body.String())
			wg.Wait()
			rec = httptest.NewRecorder()
			h.ServeHTTP(rec, request{method: "GET", path: "/v1/accounts/" + accountA.String()}.build())
			require.Equal(t, http.StatusOK, rec.Code, "merchant A's slot is free again")
		})
	}
}

// TestRateLimitPerClientAddress: past its burst an address is answered 429 rate_limited with
// Retry-After; other addresses are not; X-Forwarded-For counts only from a trusted proxy.
func TestRateLimitPerClientAddress(t *testing.T) {
	t.Parallel()
	type hit struct {
		remote, forwarded string
		want              int
	}
	for _, tc := range []struct {
		name    string
		trusted []string
		hits    []hit
	}{
		{"one address past its burst", nil, []hit{
			{"10.0.0.1", "", 200}, {"10.0.0.1", "", 200}, {"10.0.0.1", "", 429},
			{"10.0.0.2", "", 200}, {"10.0.0.2", "", 200}, {"10.0.0.2", "", 429},
		}},
		{"a forged X-Forwarded-For changes nothing", nil, []hit{
			{"10.0.0.1", "192.0.2.1", 200}, {"10.0.0.1", "192.0.2.2", 200}, {"10.0.0.1", "192.0.2.3", 429},
		}},
		{"behind a trusted proxy, the forwarded address counts", []string{"10.0.0.0/8"}, []hit{
			{"10.0.0.1", "192.0.2.1", 200}, {"10.0.0.1", "192.0.2.1", 200}, {"10.0.0.1", "192.0.2.1", 429},
			{"10.0.0.1", "192.0.2.2", 200}, {"10.0.0.3", "192.0.2.2", 200}, {"10.0.0.1", "192.0.2.2", 429},
		}},
		{"an IPv6 client is its /64", nil, []hit{
			{"2001:db8::1", "", 200}, {"2001:db8::2", "", 200}, {"2001:db8::ffff:1", "", 429},
			{"2001:db8:0:1::1", "", 200},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _, _ := newTestServer(t, func(o *Options) {
				o.Limits = Limits{PerIP: Rate{PerSecond: 0.01, Burst: 2}, TrustedProxies: tc.trusted}
			})
			h := s.Handler()
			for i, x := range tc.hits {
				req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
				req.RemoteAddr = net.JoinHostPort(x.remote, "40000")
				if x.forwarded != "" {
					req.Header.Set("X-Forwarded-For", x.forwarded)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				require.Equal(t, x.want, rec.Code, "hit %d from %s (%s)", i, x.remote, x.forwarded)
				if x.want == 429 {
					requireRateLimited(t, rec, 100)
				}
			}
		})
	}
}

// requireRateLimited checks a 429 answer: problem+json rate_limited with a Retry-After of
// about wait seconds (the time until the bucket holds a token again).
func requireRateLimited(t *testing.T, rec *httptest.ResponseRecorder, wait int) {
	t.Helper()
	p := problemOf(t, rec)
	require.Equal(t, "rate_limited", p.Code)
	require.Equal(t, 429, p.Status)
	after, err := strconv.Atoi(rec.Header().Get("Retry-After"))
	require.NoError(t, err, "Retry-After in seconds")
	require.InDelta(t, wait, after, 1)
}

// TestRateLimitPerMerchant: one merchant past its burst is limited on every address; another
// merchant is not, and a request that fails authentication spends no merchant's tokens.
func TestRateLimitPerMerchant(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestServer(t, func(o *Options) {
		o.Limits = Limits{PerMerchant: Rate{PerSecond: 0.5, Burst: 2}}
	})
	h := s.Handler()
	get := func(key, remote string) *httptest.ResponseRecorder {
		req := request{method: "GET", path: "/v1/accounts/" + accountA.String(), header: map[string]string{"Authorization": "Bearer " + key}}.build()
		req.RemoteAddr = remote + ":40000"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	require.Equal(t, http.StatusUnauthorized, get("sk_wrong", "10.0.0.9").Code)
	require.Equal(t, http.StatusOK, get("sk_a", "10.0.0.1").Code)
	require.Equal(t, http.StatusOK, get("sk_a", "10.0.0.2").Code)
	rec := get("sk_a", "10.0.0.3")
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	requireRateLimited(t, rec, 2)
	require.Equal(t, http.StatusNotFound, get("sk_b", "10.0.0.1").Code, "merchant B is not limited (and cannot see A's account)")
}

// TestLimiterForgetsIdleClients: a client's bucket is dropped once it has refilled (it is then
// the same as a new one), so a flood of addresses does not grow memory for ever.
func TestLimiterForgetsIdleClients(t *testing.T) {
	t.Parallel()
	l := newLimiter(Rate{PerSecond: 10, Burst: 20}) // full again 2s after the last request
	t0 := time.Now()
	for i := range 1000 {
		ok, _ := l.allow(fmt.Sprintf("k%d", i), t0)
		require.True(t, ok)
	}
	require.Equal(t, 1000, l.size())
	t1 := t0.Add(3 * time.Second)
	ok, _ := l.allow("k0", t1)
	require.True(t, ok)
	require.Equal(t, 1, l.size(), "only the client seen since")

	// A limited client is remembered while its bucket refills.
	for range 20 {
		l.allow("hot", t1)
	}
	ok, wait := l.allow("hot", t1)
	require.False(t, ok)
	require.Equal(t, 100*time.Millisecond, wait)
	l.allow("other", t1.Add(time.Second))
	ok, _ = l.allow("hot", t1.Add(time.Second))
	require.True(t, ok)
	require.Equal(t, 3, l.size(), "k0, hot and other are all within 2s of their last request")

	// Past maxLimiterKeys the table starts over rather than grow.
	big := newLimiter(Rate{PerSecond: 1, Burst: 1})
	for i := range maxLimiterKeys + 10 {
		big.allow(strconv.Itoa(i), t0)
	}
	require.LessOrEqual(t, big.size(), maxLimiterKeys)
}

// TestSyncWaitPaymentAnswersUnderTheTimeouts: a payment that takes the whole sync wait, longer
// than the read timeout, is still answered over a real connection.
func TestSyncWaitPaymentAnswersUnderTheTimeouts(t *testing.T) {
	t.Parallel()
	s, _, wf := newTestServer(t, func(o *Options) {
		o.SyncWait = 700 * time.Millisecond
		// The write timeout leaves the wait a margin, as config requires (a loaded machine adds to it).
		o.Limits = Limits{ReadTimeout: 300 * time.Millisecond, WriteTimeout: 5 * time.Second, IdleTimeout: 300 * time.Millisecond, MaxConns: 4, MaxInFlight: 4}
	})
	wf.outcome = ""
	addr := serveTCP(t, s)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/payments", strings.NewReader(payBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_a")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-sync")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.GreaterOrEqual(t, time.Since(start), 700*time.Millisecond, "waited the sync wait, past the read timeout")
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, string(payment.StatusProcessing), body["status"])
}

// One client address holding idle connections cannot take them all: past its share a new
// connection from it is closed, while another address is still served.
func TestConnectionCapPerClient(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestServer(t, func(o *Options) {
		o.Limits = Limits{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxConns: 4, MaxConnsPerClient: 2}
	})
	addr := serveTCP(t, s)
	from := func(ip string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	}
	for range 2 {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
	}
	_, err := from("127.0.0.1").Get("http://" + addr + "/healthz")
	require.Error(t, err, "a third connection from the same address is closed")
	resp, err := from("127.0.0.2").Get("http://" + addr + "/healthz")
	require.NoError(t, err, "another address is served")
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// Wrong credentials are limited per client address far more tightly than requests: past the
// limit that address gets 429 before any lookup, even with a right key, while others are served.
func TestFailedAuthenticationIsLimitedPerClient(t *testing.T) {
	t.Parallel()
	s, st, _ := newTestServer(t, func(o *Options) {
		o.Limits = Limits{FailedAuth: Rate{PerSecond: 0.01, Burst: 3}}
	})
	h := s.Handler()
	get := func(ip, key string) int {
		req := httptest.NewRequest("GET", "/v1/accounts/0192f1f0-0000-7000-8000-0000000000ff", nil)
		req.RemoteAddr = ip + ":1234"
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for i := range 3 {
		require.Equal(t, http.StatusUnauthorized, get("192.0.2.1", fmt.Sprintf("sk_wrong_%d", i)))
	}
	lookups := st.calls["MerchantByAPIKey"]
	require.Equal(t, http.StatusTooManyRequests, get("192.0.2.1", "sk_wrong_9"))
	require.Equal(t, http.StatusTooManyRequests, get("192.0.2.1", "sk_a"), "even a right key, until the bucket refills")
	require.Equal(t, lookups, st.calls["MerchantByAPIKey"], "no lookup past the limit")
	require.Equal(t, http.StatusNotFound, get("192.0.2.2", "sk_a"), "another address is served")
}

// stalledStore is a database that takes no query: each call waits until its context ends, then
// fails as pgx does.
type stalledStore struct{ *fakeStore }

func (s stalledStore) MerchantByAPIKey(ctx context.Context, _ string) (payment.Merchant, error) {
	<-ctx.Done()
	return payment.Merchant{}, ctx.Err()
}

func (s stalledStore) Account(ctx context.Context, _ uuid.UUID) (payment.Account, error) {
	<-ctx.Done()
	return payment.Account{}, ctx.Err()
}

func (s stalledStore) Deposit(ctx context.Context, _ uuid.UUID, _ string, _ int64) (store.Deposit, bool, error) {
	<-ctx.Done()
	return store.Deposit{}, false, ctx.Err()
}

func (s stalledStore) Begin(ctx context.Context, _ store.BeginInput) (store.Record, payment.Payment, store.Began, error) {
	<-ctx.Done()
	return store.Record{}, payment.Payment{}, 0, ctx.Err()
}

// A stalled database is answered 503 unavailable with Retry-After before the write timeout, not
// with a connection closed without an answer once it passed.
func TestStalledDatabaseAnswersUnavailable(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"/v1/payments", "/admin/v1/accounts/" + payment.NewID().String() + "/deposits"} {
		s, _, _ := newTestServer(t, func(o *Options) {
			o.Store = stalledStore{o.Store.(*fakeStore)}
			o.Limits = Limits{ReadTimeout: time.Second, WriteTimeout: 1500 * time.Millisecond, IdleTimeout: time.Second}
		})
		addr := serveTCP(t, s)
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(`{"amount":"1.00"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk_a")
		if strings.HasPrefix(path, "/admin") {
			req.Header.Set("Authorization", "Bearer adm")
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k-stalled")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, path)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s: %s", path, b)
		require.Contains(t, string(b), `"code":"unavailable"`, path)
		require.NotEmpty(t, resp.Header.Get("Retry-After"), path)
	}
}

// heldLookupStore holds every API key lookup until release is closed, so that requests can be
// in their lookups at once, and counts the lookups.
type heldLookupStore struct {
	*fakeStore
	release chan struct{}
	lookups atomic.Int32
}

func (s *heldLookupStore) MerchantByAPIKey(ctx context.Context, key string) (payment.Merchant, error) {
	s.lookups.Add(1)
	select {
	case <-s.release:
	case <-ctx.Done():
		return payment.Merchant{}, ctx.Err()
	}
	return s.fakeStore.MerchantByAPIKey(ctx, key)
}

// Wrong keys sent all at once, each before any other has failed, still get no more lookups
// than the failed-authentication limit allows: the rest are answered 429 before a lookup.
// A right key's burst from the same address is not held against it.
func TestFailedAuthenticationLimitHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	const burst, sent = 3, 12
	for _, tc := range []struct {
		name      string
		key       func(i int) string
		lookups   int32 // at most
		unauth    int
		limited   int
		notLimits bool
	}{
		{name: "distinct wrong keys", key: func(i int) string { return fmt.Sprintf("sk_guess_%d", i) }, lookups: burst, unauth: burst, limited: sent - burst},
		{name: "a right key", key: func(int) string { return "sk_a" }, lookups: sent, notLimits: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			held := &heldLookupStore{release: make(chan struct{})}
			s, _, _ := newTestServer(t, func(o *Options) {
				held.fakeStore = o.Store.(*fakeStore)
				o.Store = held
				o.Limits = Limits{FailedAuth: Rate{PerSecond: 0.01, Burst: burst}}
			})
			h := s.Handler()
			get := func(key string) int {
				req := httptest.NewRequest("GET", "/v1/accounts/0192f1f0-0000-7000-8000-0000000000ff", nil)
				req.RemoteAddr = "192.0.2.7:1234"
				req.Header.Set("Authorization", "Bearer "+key)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				return rec.Code
			}
			codes := make(chan int, sent)
			var wg sync.WaitGroup
			for i := range sent {
				wg.Add(1)
				go func() { defer wg.Done(); codes <- get(tc.key(i)) }()
			}
			// Every request that is let through is in its lookup, or answered, before any fails.
			require.Eventually(t, func() bool { return int(held.lookups.Load())+len(codes) == sent },
				5*time.Second, 5*time.Millisecond)
			close(held.release)
			wg.Wait()
			close(codes)
			got := map[int]int{}
			for c := range codes {
				got[c]++
			}
			require.LessOrEqual(t, held.lookups.Load(), tc.lookups, "lookups")
			if tc.notLimits {
				require.Equal(t, map[int]int{http.StatusNotFound: sent}, got)
				// The right key's lookups spent none of the address's failures.
				for i := range burst {
					require.Equal(t, http.StatusUnauthorized, get(fmt.Sprintf("sk_wrong_%d", i)), "wrong key %d", i)
				}
				return
			}
			require.Equal(t, map[int]int{http.StatusUnauthorized: tc.unauth, http.StatusTooManyRequests: tc.limited}, got)
		})
	}
}

// A long-running API sees clients, keys and merchants come and go: what it keeps per client
// address, API key or merchant is given back when they leave, or bounded, never kept for each
// one it has seen.
func TestPerClientTablesDoNotGrowWithClients(t *testing.T) {
	t.Parallel()
	t.Run("connections per client address", func(t *testing.T) {
		t.Parallel()
		s, _, _ := newTestServer(t, func(o *Options) {
			o.Limits = Limits{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxConns: 64, MaxConnsPerClient: 2}
		})
		raw, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ln := s.Listener(raw)
		pcl, ok := ln.(*perClientListener)
		require.True(t, ok)
		srv := s.HTTPServer()
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close(); <-done })
		for i := range 50 {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}}
			c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
			resp, err := c.Get("http://" + raw.Addr().String() + "/healthz")
			require.NoError(t, err)
			resp.Body.Close()
		}
		require.Eventually(t, func() bool {
			pcl.mu.Lock()
			defer pcl.mu.Unlock()
			return len(pcl.open) == 0
		}, 2*time.Second, 10*time.Millisecond, "the addresses of closed connections are forgotten")
	})
	t.Run("api keys", func(t *testing.T) {
		t.Parallel()
		var c merchantCache
		load := func(_ context.Context, key string) (payment.Merchant, error) {
			if strings.HasPrefix(key, "sk_wrong") {
				return payment.Merchant{}, payment.ErrUnauthorized
			}
			return payment.Merchant{ID: merchantA}, nil
		}
		for i := range authCacheSize + 100 {
			_, err := c.lookup(context.Background(), fmt.Sprintf("sk_%d", i), load, nil)
			require.NoError(t, err)
			_, err = c.lookup(context.Background(), fmt.Sprintf("sk_wrong_%d", i), load, nil)
			require.ErrorIs(t, err, payment.ErrUnauthorized)
		}
		require.LessOrEqual(t, len(c.entries), authCacheSize)
		require.LessOrEqual(t, len(c.misses), authMissSize)
		require.Empty(t, c.pending, "no lookup is in flight")
	})
	t.Run("requests in flight per merchant", func(t *testing.T) {
		t.Parallel()
		p := newPerKey(2)
		for range 1000 {
			m := payment.NewID()
			require.True(t, p.acquire(m))
			p.release(m)
		}
		require.Empty(t, p.held)
	})
}
