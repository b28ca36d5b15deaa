package api

import (
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/net/netutil"
	"golang.org/x/time/rate"
)

// Limits bound what clients can hold of the server. A zero value turns that limit off.
type Limits struct {
	ReadTimeout  time.Duration // a whole request, body included
	WriteTimeout time.Duration // from the end of the request's headers to the end of the answer
	IdleTimeout  time.Duration // a keep-alive connection between requests
	MaxConns     int           // open connections; more wait to be accepted
	// MaxConnsPerClient is how many of them one client address may hold (an IPv6 client is its
	// /64; a trusted proxy is not capped): past it a new connection is closed at once, so one
	// host holding idle keep-alive sockets cannot lock every other client out.
	MaxConnsPerClient int
	MaxInFlight       int // merchant and admin requests being handled; more are answered 503
	// MerchantShare is the part of MaxInFlight, and of the backlog's MaxRunning, that one
	// merchant may hold, so that one merchant's burst leaves room for the others; 0 or 1: all.
	MerchantShare float64
	PerIP         Rate // requests per client address (an IPv6 client is its /64)
	PerMerchant   Rate // authenticated requests per merchant
	// FailedAuth is how many requests with wrong credentials a client address may make: past
	// it every request of that address needing credentials gets 429, before any lookup.
	FailedAuth Rate
	// TrustedProxies are the addresses (or CIDRs) whose X-Forwarded-For names the client; with
	// none the client is the connection's peer, whatever headers it sends.
	TrustedProxies []string
}

// Rate is a token bucket: PerSecond tokens a second, at most Burst at once. PerSecond 0 is off.
type Rate struct {
	PerSecond float64
	Burst     int
}

// maxReadHeaderTimeout bounds the headers on their own: a client has no reason to take longer.
const maxReadHeaderTimeout = 10 * time.Second

// HTTPServer is the server for Handler, with the limits' timeouts. Without a read timeout a
// client that trickles its body holds a connection and a goroutine for ever; the write timeout
// must outlast the longest answer (the payment sync wait), which config checks.
func (s *Server) HTTPServer() *http.Server {
	l := s.Limits
	header := maxReadHeaderTimeout
	if l.ReadTimeout > 0 {
		header = min(header, l.ReadTimeout)
	}
	hs := &http.Server{
		Handler:           s.engine,
		ReadHeaderTimeout: header,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
	}
	// A shutdown waits for the requests in flight only so long: those waiting for an outcome
	// answer at once (202, the operation as it is) rather than be cut off without an answer.
	hs.RegisterOnShutdown(s.drain)
	return hs
}

// Listener caps ln at MaxConns open connections: past it, new ones wait in the kernel's accept
// queue until one closes (the timeouts see that idle and slow ones do).
func (s *Server) Listener(ln net.Listener) net.Listener {
	if s.Limits.MaxConns > 0 {
		ln = netutil.LimitListener(ln, s.Limits.MaxConns)
	}
	if s.Limits.MaxConnsPerClient > 0 {
		ln = &perClientListener{Listener: ln, max: s.Limits.MaxConnsPerClient, open: map[string]int{},
			trusted: prefixes(s.Limits.TrustedProxies), refused: s.metrics.connsRefused}
	}
	return ln
}

// perClientListener closes a new connection from a client address that already holds max.
type perClientListener struct {
	net.Listener
	max     int
	trusted []netip.Prefix
	refused interface{ Inc() }

	mu   sync.Mutex
	open map[string]int
}

func (l *perClientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, capped := l.client(c.RemoteAddr())
		if !capped {
			return c, nil
		}
		l.mu.Lock()
		over := l.open[key] >= l.max
		if !over {
			l.open[key]++
		}
		l.mu.Unlock()
		if !over {
			return &clientConn{Conn: c, release: func() { l.release(key) }}, nil
		}
		l.refused.Inc()
		_ = c.Close() // its global slot (LimitListener's) goes with it
	}
}

// client is the address's key, and whether it is capped (a trusted proxy speaks for many).
func (l *perClientListener) client(a net.Addr) (string, bool) {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String(), true
	}
	ip := ap.Addr().Unmap()
	for _, p := range l.trusted {
		if p.Contains(ip) {
			return "", false
		}
	}
	return clientKey(ip.String()), true
}

func (l *perClientListener) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// clientConn gives its client's slot back once, however often it is closed.
type clientConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *clientConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// prefixes parses the trusted proxies (addresses or CIDRs); what does not parse trusts nothing.
func prefixes(list []string) []netip.Prefix {
	var out []netip.Prefix
	for _, v := range list {
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, p.Masked())
		} else if a, err := netip.ParseAddr(v); err == nil {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		}
	}
	return out
}

// limitIP answers 429 to a client address past its rate, before any other work (a request with
// a wrong API key costs a database query).
func (s *Server) limitIP(c *gin.Context) {
	if s.perIP == nil {
		c.Next()
		return
	}
	if ok, wait := s.perIP.allow(clientKey(c.ClientIP()), time.Now()); !ok {
		s.writeError(c, &rateLimitedError{wait: wait})
		return
	}
	c.Next()
}

// limitMerchant answers 429 to a merchant past its rate; it runs after merchantAuth.
func (s *Server) limitMerchant(c *gin.Context) {
	if s.perMerchant == nil {
		c.Next()
		return
	}
	if ok, wait := s.perMerchant.allow(merchantOf(c).ID.String(), time.Now()); !ok {
		s.writeError(c, &rateLimitedError{wait: wait})
		return
	}
	c.Next()
}

// limitInFlight answers 503 at once past MaxInFlight requests being handled, instead of letting
// them queue for the database pool and Temporal.
func (s *Server) limitInFlight(c *gin.Context) {
	if s.inFlight == nil {
		c.Next()
		return
	}
	select {
	case s.inFlight <- struct{}{}:
		defer func() { <-s.inFlight }()
		c.Next()
	default:
		s.writeError(c, errOverloaded)
	}
}

// clientKey is the rate-limit key of a client address: an IPv6 host gets a /64 to itself and
// could otherwise change address for every request.
func clientKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

var errOverloaded = errors.New("the server is at its limit of requests in flight; retry shortly")

// rateLimitedError is a request over its rate; wait is when a token is there again.
type rateLimitedError struct{ wait time.Duration }

func (*rateLimitedError) Error() string { return "too many requests; retry after Retry-After seconds" }

// retryAfter is wait in whole seconds, rounded up, at least 1.
func (e *rateLimitedError) retryAfter() int {
	return max(1, int(math.Ceil(e.wait.Seconds())))
}

// maxLimiterKeys bounds a limiter's table. Past it (a flood from more addresses than that) the
// table starts over: per-address limits cannot hold such a flood anyway, memory must.
const maxLimiterKeys = 100_000

// limiter is a token bucket per key. A bucket unused for fullAfter has refilled and is the same
// as a new one, so it is dropped: the table holds only clients seen in the last fullAfter.
type limiter struct {
	rate      rate.Limit
	burst     int
	fullAfter time.Duration

	mu    sync.Mutex
	keys  map[string]*bucket
	swept time.Time
}

type bucket struct {
	lim  *rate.Limiter
	seen time.Time
	held int // tokens held by requests not yet known to spend them (hold)
}

// newLimiter returns nil for a rate that is off.
func newLimiter(r Rate) *limiter {
	if r.PerSecond <= 0 {
		return nil
	}
	burst := max(r.Burst, 1)
	// Past an hour idle a bucket is dropped even if not yet full: a client that slow gains
	// little from a fresh burst, and the table must not keep it for days.
	full := min(float64(burst)/r.PerSecond, time.Hour.Seconds())
	return &limiter{
		rate: rate.Limit(r.PerSecond), burst: burst,
		fullAfter: time.Duration(full * float64(time.Second)),
		keys:      map[string]*bucket{},
	}
}

// allow takes a token from key's bucket at now, or says how long until one is there.
// empty reports whether key's bucket has no token now (and how long until one), without taking
// any: a client that may still fail gets its answer, one that failed too often does not.
func (l *limiter) empty(key string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.keys[key]
	if !ok {
		return false, 0
	}
	if t := b.lim.TokensAt(now); t < 1 {
		return true, time.Duration((1 - t) / float64(l.rate) * float64(time.Second))
	}
	return false, 0
}

// authRefused answers 429 to a client address past its failed-authentication limit; it runs
// before credentials are looked up.
func (s *Server) authRefused(c *gin.Context) bool {
	if s.failedAuth == nil {
		return false
	}
	if blocked, wait := s.failedAuth.empty(clientKey(c.ClientIP()), time.Now()); blocked {
		s.writeError(c, &rateLimitedError{wait: wait})
		return true
	}
	return false
}

// authFailed counts a request with wrong credentials against its client address.
func (s *Server) authFailed(c *gin.Context) {
	if s.failedAuth != nil {
		s.failedAuth.allow(clientKey(c.ClientIP()), time.Now())
	}
}

// clientAuth is the failed-authentication limit of one request's client address (authGuard).
type clientAuth struct {
	s *Server
	c *gin.Context
}

func (a clientAuth) hold() (func(failed bool), error) {
	release, ok, wait := a.s.failedAuth.hold(clientKey(a.c.ClientIP()), time.Now())
	if !ok {
		return nil, &rateLimitedError{wait: wait}
	}
	return release, nil
}

func (a clientAuth) failed() { a.s.authFailed(a.c) }

// hold takes from key's bucket the chance of one failure before a request that may fail is
// checked, or says how long until one is there: the tokens left less those held already must be
// one at least, so that requests checked at the same time cannot all spend the same token.
// release gives it back, or spends it when the request failed.
func (l *limiter) hold(key string, now time.Time) (release func(failed bool), ok bool, wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucketLocked(key, now)
	if t := b.lim.TokensAt(now) - float64(b.held); t < 1 {
		return nil, false, time.Duration((1 - t) / float64(l.rate) * float64(time.Second))
	}
	b.held++
	return func(failed bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		now := time.Now()
		b.held--
		b.seen = now
		if failed {
			b.lim.ReserveN(now, 1) // spent even if other failures took the rest meanwhile
		}
	}, true, 0
}

// bucketLocked is key's bucket, made full when it is new, seen now; l.mu is held. Buckets full
// again are swept from time to time, or when there are too many.
func (l *limiter) bucketLocked(key string, now time.Time) *bucket {
	if now.Sub(l.swept) >= l.fullAfter || len(l.keys) >= maxLimiterKeys {
		l.sweep(now)
	}
	b, ok := l.keys[key]
	if !ok {
		b = &bucket{lim: rate.NewLimiter(l.rate, l.burst)}
		l.keys[key] = b
	}
	b.seen = now
	return b
}

func (l *limiter) allow(key string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.bucketLocked(key, now).lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now) // a refused request spends nothing
		return false, d
	}
	return true, 0
}

func (l *limiter) sweep(now time.Time) {
	l.swept = now
	for k, b := range l.keys {
		if now.Sub(b.seen) >= l.fullAfter && b.held == 0 {
			delete(l.keys, k)
		}
	}
	if len(l.keys) >= maxLimiterKeys*9/10 { // else a full table would be swept on every request
		l.keys = map[string]*bucket{}
	}
}

func (l *limiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

// deadline ends a request's work a second before its answer could no longer be written
// (Limits.WriteTimeout): a database that stalls is then answered 503 unavailable with
// Retry-After, never with a connection closed without an answer.
func (s *Server) deadline(c *gin.Context) {
	w := s.Limits.WriteTimeout
	if w <= 0 {
		c.Next()
		return
	}
	d := w - time.Second
	if d <= 0 {
		d = w / 2
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), d)
	defer cancel()
	c.Request = c.Request.WithContext(ctx)
	c.Next()
}
