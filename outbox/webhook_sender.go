package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/kasa-pay/kasa/store"
)

// SenderStore is what the webhook sender needs from the database.
type SenderStore interface {
	ClaimDeliveries(ctx context.Context, limit, perMerchant int, lease time.Duration) ([]store.ClaimedDelivery, error)
	RecordAttempt(ctx context.Context, r store.AttemptResult) (status store.DeliveryStatus, attempts int, superseded bool, err error)
}

// WebhookSenderOptions configure a WebhookSender. Zero values take the defaults shown.
type WebhookSenderOptions struct {
	Store SenderStore
	// Client is used as given; the default follows no redirect (a 3xx is a failed attempt), uses
	// no proxy, and dials only addresses CheckAddr allows unless AllowPrivate.
	Client *http.Client
	// AllowPrivate lets webhooks go to loopback, private and link-local addresses (local
	// development and tests); the default client then honours HTTP(S)_PROXY.
	AllowPrivate bool
	Own          OwnHosts      // kasa's own public hosts: refused under any policy
	Timeout      time.Duration // per attempt, connection to body read (10s)
	Concurrency  int           // attempts in flight in this sender (32)
	PerMerchant  int           // attempts in flight per merchant, all senders together (4)
	BackoffBase  time.Duration // delay after the first failure, doubling per attempt (10s)
	BackoffMax   time.Duration // cap of the delay (1h)
	RetryFor     time.Duration // keep retrying for this long (72h; never below 24h outside tests)
	PollInterval time.Duration // how often due deliveries are looked for (200ms)
	Metrics      *Metrics
	Logger       *slog.Logger

	resolver *net.Resolver // the default client's resolver (tests answer names themselves)
}

// WebhookSender delivers due webhooks. Attempts run outside any transaction under a lease
// (Timeout + 30s): a crashed sender's delivery is retried when its lease runs out, with the same
// event id and body. Several senders may run at once.
type WebhookSender struct {
	o     WebhookSenderOptions
	lease time.Duration
}

// NewWebhookSender applies the defaults.
func NewWebhookSender(o WebhookSenderOptions) *WebhookSender {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 32
	}
	if o.PerMerchant <= 0 {
		o.PerMerchant = 4
	}
	if o.BackoffBase <= 0 {
		o.BackoffBase = 10 * time.Second
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = time.Hour
	}
	if o.RetryFor <= 0 {
		o.RetryFor = 72 * time.Hour
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 200 * time.Millisecond
	}
	if o.Client == nil {
		dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second, Resolver: o.resolver}
		tr := &http.Transport{
			DialContext:         dialer.DialContext,
			TLSHandshakeTimeout: 5 * time.Second,
			MaxIdleConnsPerHost: o.PerMerchant,
			IdleConnTimeout:     90 * time.Second,
		}
		// Every address is checked as it is dialled, after resolution: a name cannot rebind
		// to an internal address between registration and delivery. A proxy would dial on
		// kasa's behalf, out of this check's sight, so there is none unless private addresses
		// are allowed (and kasa's own hosts are not named).
		dialer.Control = o.policy().dialControl
		if o.AllowPrivate && o.Own.Empty() {
			tr.Proxy = http.ProxyFromEnvironment
		}
		o.Client = &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if o.Metrics == nil {
		o.Metrics = unregistered()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &WebhookSender{o: o, lease: o.Timeout + 30*time.Second}
}

// Run sends due deliveries until ctx is cancelled, then waits for the attempts in flight (they
// are cut short and made due again at once, uncounted).
func (s *WebhookSender) Run(ctx context.Context) error {
	s.o.Logger.Info("webhook sender running", "concurrency", s.o.Concurrency, "per_merchant", s.o.PerMerchant, "timeout", s.o.Timeout,
		"allow_private", s.o.AllowPrivate)
	slots := make(chan struct{}, s.o.Concurrency)
	freed := make(chan struct{}, 1)
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	for ctx.Err() == nil {
		free := s.o.Concurrency - len(slots)
		n := 0
		if free > 0 {
			// A claim commits at the database even when a stop gives up on its answer: its rows
			// are read whatever the stop, and handed to Send, which makes them due again uncounted.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			ds, err := s.o.Store.ClaimDeliveries(cctx, free, s.o.PerMerchant, s.lease)
			cancel()
			if err != nil && ctx.Err() == nil {
				s.o.Logger.Warn("webhook sender: claim failed", "error", err)
			}
			for _, d := range ds {
				slots <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.Send(ctx, d)
					<-slots
					select {
					case freed <- struct{}{}:
					default:
					}
				}()
			}
			n = len(ds)
		}
		if free > 0 && n == free {
			continue // as many due as we could take: look again at once
		}
		timer.Reset(s.o.PollInterval)
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-freed: // a slot (maybe of a busy merchant) came free
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
	wg.Wait()
	s.o.Logger.Info("webhook sender stopped")
	return nil
}

// Send makes one attempt of a claimed delivery and records it.
func (s *WebhookSender) Send(ctx context.Context, d store.ClaimedDelivery) {
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	code, err := s.post(actx, d, start)
	cancel()
	err = redactErr(err)
	res := store.AttemptResult{
		DeliveryID: d.ID, Attempt: d.Attempt, StartedAt: start, Duration: time.Since(start),
		StatusCode: code, RetryFor: s.o.RetryFor,
	}
	result := "2xx"
	var refusedURL *refusal
	switch {
	case err == nil && code >= 200 && code < 300:
		res.Delivered = true
	case errors.As(err, &refusedURL):
		// The merchant's URL or what its name resolves to is not for kasa to call: retrying
		// would not change that. The delivery fails now, and an operator redelivers it once
		// the URL or KASA_WEBHOOK_ALLOW_PRIVATE is fixed.
		result, res.Error, res.RetryIn, res.RetryFor = "refused", truncate(refusedURL.Error(), 500), time.Second, 0
	case err != nil && ctx.Err() != nil:
		// Our own stop cut the attempt, not the merchant: it does not count as one, and the
		// delivery is due again at once for whichever sender runs next.
		result, res.Error, res.Aborted = "aborted", "aborted: the sender is stopping", true
	case err != nil:
		result, res.Error, res.RetryIn = "error", truncate(err.Error(), 500), s.backoff(d.Step)
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
			result, res.Error = "timeout", fmt.Sprintf("no answer within %s", s.o.Timeout)
		}
	default:
		result, res.Error, res.RetryIn = "non_2xx", fmt.Sprintf("HTTP %d", code), s.backoff(d.Step)
	}
	s.o.Metrics.attempts.WithLabelValues(result).Inc()
	s.o.Metrics.attemptDuration.Observe(res.Duration.Seconds())

	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	status, attempts, superseded, err := s.o.Store.RecordAttempt(rctx, res)
	log := s.o.Logger.With("delivery_id", d.ID, "merchant_id", d.MerchantID, "attempt", d.Attempt)
	switch {
	case err != nil:
		// The lease runs out and the delivery is attempted again: at least once.
		log.Warn("webhook sender: cannot record attempt", "error", err)
	case superseded:
		log.Debug("webhook sender: attempt superseded")
	case status == store.DeliveryDelivered:
		s.o.Metrics.deliveries.WithLabelValues("delivered").Inc()
		s.o.Metrics.attemptsPerDel.Observe(float64(attempts))
	case status == store.DeliveryFailed:
		s.o.Metrics.deliveries.WithLabelValues("failed").Inc()
		s.o.Metrics.attemptsPerDel.Observe(float64(attempts))
		log.Warn("webhook sender: giving up", "attempts", attempts, "error", res.Error)
	default:
		log.Debug("webhook sender: will retry", "in", res.RetryIn, "error", res.Error)
	}
}

// post sends the signed request; it returns the HTTP status (0 without an answer).
func (s *WebhookSender) post(ctx context.Context, d store.ClaimedDelivery, at time.Time) (int, error) {
	// The URL was checked at registration, perhaps under another policy or before there was one.
	if err := CheckWebhookURL(d.URL, s.o.policy()); err != nil {
		return 0, &refusal{url: d.URL, err: err, own: s.o.Own}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(d.Body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "kasa-webhooks/1")
	req.Header.Set(HeaderEventID, d.ID.String())
	req.Header.Set("Kasa-Event-Type", d.EventType)
	req.Header.Set(HeaderSignature, Sign(d.Secret, at, d.Body, d.PreviousSecret))
	resp, err := s.o.Client.Do(req)
	var ae *AddressError
	if errors.As(err, &ae) {
		return 0, &refusal{url: d.URL, err: err, addr: ae, own: s.o.Own}
	}
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	// Read (a bounded part of) the answer so the connection can be reused; a body that stalls
	// runs into the timeout. The status is the merchant's answer: a 2xx has acknowledged the
	// event whatever its body does after it, and sending it again would repeat it.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}

func (o WebhookSenderOptions) policy() Policy {
	return Policy{AllowPrivate: o.AllowPrivate, Own: o.Own}
}

// backoff is the delay after the attempt-th failure of a retry window (a redelivery starts the
// schedule again): BackoffBase doubling per attempt, capped at BackoffMax, with equal jitter
// (between half and all of it) so retries of many deliveries spread out.
func (s *WebhookSender) backoff(attempt int) time.Duration {
	d := s.o.BackoffMax
	if attempt >= 1 && attempt < 40 {
		if b := s.o.BackoffBase << (attempt - 1); b > 0 && b < d {
			d = b
		}
	}
	half := d / 2
	return half + rand.N(half+1)
}

// truncate keeps at most n bytes of s, cut at a rune's start and with invalid bytes replaced:
// the attempt's record is text, which PostgreSQL refuses when it is not valid UTF-8.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// refusal is a webhook kasa would not send: the URL, or the address its host resolved to, is
// outside the address policy.
type refusal struct {
	url  string
	err  error
	addr *AddressError // nil: the URL itself was refused
	own  OwnHosts
}

func (r *refusal) Error() string {
	if r.addr == nil {
		msg := fmt.Sprintf("refused: webhook URL %s %v", RedactURL(r.url), r.err)
		if CheckWebhookURL(r.url, Policy{AllowPrivate: true, Own: r.own}) == nil {
			msg += "; webhooks go to public addresses only unless KASA_WEBHOOK_ALLOW_PRIVATE=true"
		}
		return msg
	}
	host := RedactURL(r.url)
	if u, err := url.Parse(r.url); err == nil {
		host = u.Host
	}
	if r.addr.Reason == reasonOwn {
		return fmt.Sprintf("refused: %s resolved to %s, %s (KASA_WEBHOOK_OWN_HOSTS)", host, r.addr.Addr, phrase(r.addr.Reason))
	}
	return fmt.Sprintf("refused: %s resolved to %s, %s; webhooks go to public addresses only unless KASA_WEBHOOK_ALLOW_PRIVATE=true",
		host, r.addr.Addr, phrase(r.addr.Reason))
}

func (r *refusal) Unwrap() error { return r.err }
