// Package api is kasa's HTTP transport: routes, authentication, request/response bodies, the
// idempotency answers (docs/openapi.yaml), and the single error-to-HTTP mapping.
package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kasa-pay/kasa/docs"
	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// Store is what the API needs from the database.
type Store interface {
	Ping(ctx context.Context) error
	CreateMerchantWithKey(ctx context.Context, m payment.Merchant, keyID uuid.UUID, apiKey, webhookSecret string) error
	CreateMerchantOnce(ctx context.Context, key string, requestHash []byte, m payment.Merchant, c store.MerchantCreated) (store.MerchantCreated, bool, error)
	MerchantByAPIKey(ctx context.Context, apiKey string) (payment.Merchant, error)
	Audit(ctx context.Context, e store.AuditEntry) error
	AuditLog(ctx context.Context, limit int, after uuid.UUID) ([]store.AuditEntry, bool, error)
	AddAPIKey(ctx context.Context, merchantID, keyID uuid.UUID, apiKey string) error
	RevokeAPIKey(ctx context.Context, merchantID, keyID uuid.UUID) error
	APIKeys(ctx context.Context, merchantID uuid.UUID) ([]store.APIKey, error)
	RotateWebhookSecret(ctx context.Context, merchantID uuid.UUID, secret string, overlap time.Duration) (time.Time, error)
	CreateAccount(ctx context.Context, merchantID uuid.UUID, currency string) (payment.Account, error)
	CreateAccountOnce(ctx context.Context, key string, merchantID uuid.UUID, currency string) (payment.Account, bool, error)
	Account(ctx context.Context, id uuid.UUID) (payment.Account, error)
	Deposit(ctx context.Context, accountID uuid.UUID, key string, amount int64) (store.Deposit, bool, error)
	Begin(ctx context.Context, in store.BeginInput) (store.Record, payment.Payment, store.Began, error)
	Refusal(ctx context.Context, merchantID uuid.UUID, r payment.Request) error
	Record(ctx context.Context, merchantID uuid.UUID, key string) (store.Record, error)
	TakeOver(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error)
	ExpireLease(ctx context.Context, operationID uuid.UUID) error
	SaveResponse(ctx context.Context, merchantID uuid.UUID, key string, outcome payment.Status, body []byte) (payment.Status, []byte, error)
	Payment(ctx context.Context, id uuid.UUID) (payment.Payment, error)
	PaymentByKey(ctx context.Context, merchantID uuid.UUID, key string) (payment.Payment, error)
	ListPayments(ctx context.Context, in store.ListPaymentsInput) ([]payment.Payment, bool, error)
	BeginRefund(ctx context.Context, in store.BeginRefundInput) (store.Record, payment.Refund, store.Began, error)
	CheckRefundAgain(ctx context.Context, in store.BeginRefundInput, rec store.Record) error
	RefundRecord(ctx context.Context, merchantID uuid.UUID, key string) (store.Record, error)
	TakeOverRefund(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error)
	BeginCommand(ctx context.Context, c store.Command, lease time.Duration) (store.Command, bool, error)
	Command(ctx context.Context, merchantID uuid.UUID, key string) (store.Command, error)
	LeaseCommand(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error)
	AnswerCommand(ctx context.Context, merchantID uuid.UUID, key string, status int, body []byte) error
	UnleaseCommand(ctx context.Context, merchantID uuid.UUID, key string) error
	DeleteCommand(ctx context.Context, merchantID uuid.UUID, key string) error
	TakenCommand(ctx context.Context, paymentID uuid.UUID) (uuid.UUID, error)
	CaptureClosed(ctx context.Context, ids []uuid.UUID) ([]uuid.UUID, error)
	// Now is the database's clock, which stamped every time a row holds (capture_before...).
	Now(ctx context.Context) (time.Time, error)
	Refund(ctx context.Context, id uuid.UUID) (payment.Refund, error)
	PaymentRefunds(ctx context.Context, paymentID uuid.UUID, limit int, startingAfter *uuid.UUID) ([]payment.Refund, bool, error)
}

// Workflows is how the API talks to Temporal.
type Workflows interface {
	StartPayment(ctx context.Context, key string, in workflows.PaymentInput) (runID string, err error)
	AwaitPayment(ctx context.Context, merchantID uuid.UUID, key, runID string) (workflows.PaymentResult, error)
	StartRefund(ctx context.Context, key string, in workflows.RefundInput) (runID string, err error)
	AwaitRefund(ctx context.Context, merchantID uuid.UUID, key, runID string) (workflows.RefundWorkflowResult, error)
	Command(ctx context.Context, merchantID uuid.UUID, paymentKey, update string, c workflows.Command) (string, error)
	Ready(ctx context.Context) error
}

// SearchAttributes reports which search attributes the payment workflows set are not registered
// on the namespace: while any is missing every workflow start fails.
type SearchAttributes interface {
	MissingSearchAttributes(ctx context.Context) ([]string, error)
}

// Options configure a Server.
type Options struct {
	Store      Store
	Workflows  Workflows
	AdminToken string
	// AdminTokenPrevious is accepted beside AdminToken while a rotation overlaps.
	AdminTokenPrevious string
	SyncWait           time.Duration // how long a create (payment, refund) waits for the outcome before 202
	Lease              time.Duration // how long a new record's owner has to start its workflow
	// CaptureWindow is how long a manual payment may wait for its capture (its capture_before).
	CaptureWindow time.Duration
	// ReplayCache is how many completed idempotency records are kept in memory per generation
	// (two generations); 0 turns the cache off and every replay reads the database.
	ReplayCache int
	// Retention is how long the idempotency record of a finished operation is kept: the replay
	// cache answers from none older. 0: no bound.
	Retention  time.Duration
	Logger     *slog.Logger
	Registry   *prometheus.Registry // default: a new one
	Reconciler Reconciler           // imports settlement files (POST /admin/v1/settlements)
	// AllowPrivateWebhooks accepts webhook URLs on loopback, private and link-local addresses
	// (outbox.CheckWebhookURL).
	AllowPrivateWebhooks bool
	// OwnHosts are kasa's own public hosts, refused as webhook URLs under any policy.
	OwnHosts outbox.OwnHosts
	// Outcomes, when the payment worker runs in this process on the same store, announces that
	// an operation left processing, with the answer its commit stored: the API waits for that
	// instead of asking Temporal for every workflow's result (one long poll fewer on the Temporal
	// server per payment) and answers without reading the record back.
	Outcomes Outcomes
	// PollAfter is how long a new payment's request waits for an announced outcome before it
	// also asks Temporal for the workflow's result and reads the record every 250ms (1s).
	PollAfter time.Duration
	// SeparateMetrics leaves /metrics off Handler: MetricsHandler serves it on an address of its
	// own, for deployments that do not show it on the merchant port.
	SeparateMetrics bool
	Limits          Limits
	// Backlog is the payday admission of new payments; its zero value queues nothing.
	Backlog Backlog
	// SearchAttributes, when set, is part of readiness: "search_attributes" says "missing"
	// (503) until `kasa migrate` or an operator registered them.
	SearchAttributes SearchAttributes
}

// Outcomes announces committed outcomes in this process (store.Store.WatchOutcome).
type Outcomes interface {
	WatchOutcome(operationID uuid.UUID) (done <-chan store.Answer, stop func())
}

// Server serves the merchant and admin APIs.
type Server struct {
	Options
	log       *slog.Logger
	metrics   *metrics
	engine    *gin.Engine
	merchants merchantCache
	replays   replayCache
	ready     readiness
	payments  paymentOps
	refunds   refundOps

	perIP, perMerchant *limiter      // nil: off
	failedAuth         *limiter      // wrong credentials per client address; nil: off
	inFlight           chan struct{} // a slot per request being handled; nil: off
	merchantFlight     *perKey       // requests in flight per merchant, up to its share; nil: off
	admission          *admission

	// life ends when the server starts shutting down (drain): requests waiting for an outcome
	// then answer with the operation as it is.
	life  context.Context
	drain context.CancelFunc
}

// New builds the router.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Lease == 0 {
		o.Lease = 30 * time.Second
	}
	if o.PollAfter == 0 {
		o.PollAfter = time.Second
	}
	if o.CaptureWindow == 0 {
		o.CaptureWindow = payment.DefaultCaptureWindow
	}
	gin.SetMode(gin.ReleaseMode)
	s := &Server{Options: o, log: o.Logger, metrics: newMetrics(o.Registry), replays: replayCache{size: o.ReplayCache, maxAge: o.Retention}}
	s.payments, s.refunds = paymentOps{s}, refundOps{s}
	s.life, s.drain = context.WithCancel(context.Background())
	if src, ok := o.Store.(statsSource); ok {
		o.Registry.MustRegister(newDBCollector(src))
	}
	s.perIP, s.perMerchant = newLimiter(o.Limits.PerIP), newLimiter(o.Limits.PerMerchant)
	s.failedAuth = newLimiter(o.Limits.FailedAuth)
	if o.Limits.MaxInFlight > 0 {
		s.inFlight = make(chan struct{}, o.Limits.MaxInFlight)
		if sh := o.Limits.MerchantShare; sh > 0 && sh < 1 {
			s.merchantFlight = newPerKey(merchantShare(o.Limits.MaxInFlight, sh))
		}
	}
	s.admission = newAdmission(o.Backlog, o.Limits.MerchantShare)
	s.admission.register(o.Registry)
	e := gin.New()
	e.HandleMethodNotAllowed = true
	e.RedirectTrailingSlash = false // a redirect is no problem+json answer: 404 instead
	e.ContextWithFallback = true
	// gin trusts every proxy's X-Forwarded-For unless told otherwise: any client could then pick
	// the address it is rate-limited as.
	if err := e.SetTrustedProxies(o.Limits.TrustedProxies); err != nil {
		s.log.Error("api: trusted proxies ignored", "error", err)
		_ = e.SetTrustedProxies(nil)
	}
	e.Use(headWithoutBody, s.requestID, s.observe, s.recover, s.limitIP)
	e.NoRoute(func(c *gin.Context) { s.writeError(c, errRouteNotFound) })
	e.NoMethod(func(c *gin.Context) { s.writeError(c, errMethodNotAllowed) })

	serveGet(e, "/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	serveGet(e, "/readyz", s.readyz)
	if !o.SeparateMetrics {
		serveGet(e, "/metrics", gin.WrapH(s.MetricsHandler()))
	}
	serveGet(e, "/openapi.yaml", func(c *gin.Context) { c.Data(http.StatusOK, "application/yaml", docs.OpenAPI) })

	// A settlement import may settle for longer than an answer may take to write: it runs on.
	e.POST("/admin/v1/settlements", noStore, s.limitInFlight, s.adminAuth, s.settlements)
	admin := e.Group("/admin/v1", noStore, s.deadline, s.limitInFlight, s.adminAuth)
	admin.POST("/merchants", s.createMerchant)
	admin.POST("/accounts", s.createAccount)
	admin.POST("/accounts/:id/deposits", s.deposit)
	serveGet(admin, "/merchants/:id/deliveries", s.merchantDeliveries)
	admin.POST("/merchants/:id/api-keys", s.createAPIKey)
	serveGet(admin, "/merchants/:id/api-keys", s.listAPIKeys)
	admin.DELETE("/merchants/:id/api-keys/:key_id", s.revokeAPIKey)
	admin.POST("/merchants/:id/webhook-secret", s.rotateWebhookSecret)
	admin.POST("/deliveries/:id/redeliver", s.redeliver)
	serveGet(admin, "/audit", s.auditLog)

	v1 := e.Group("/v1", s.deadline, s.limitInFlight, s.merchantAuth, s.limitMerchant, s.limitMerchantInFlight)
	v1.POST("/payments", s.createPayment)
	serveGet(v1, "/payments", s.getPayments)
	serveGet(v1, "/payments/:id", s.getPayment)
	v1.POST("/payments/:id/refunds", s.createRefund)
	v1.POST("/payments/:id/capture", s.command(payment.CommandCapture))
	v1.POST("/payments/:id/cancel", s.command(payment.CommandCancel))
	serveGet(v1, "/payments/:id/refunds", s.listRefunds)
	serveGet(v1, "/refunds/:id", s.getRefund)
	serveGet(v1, "/accounts/:id", s.getAccount)
	s.engine = e
	return s
}

// serveGet serves a GET route, and HEAD on it as HTTP allows wherever GET is: the same answer
// without its body (headWithoutBody).
func serveGet(r gin.IRoutes, path string, handlers ...gin.HandlerFunc) {
	r.GET(path, handlers...)
	r.HEAD(path, handlers...)
}

// headWithoutBody lets a HEAD request's handlers answer as for a GET and writes none of the
// body: its length is sent as Content-Length, unless a handler set one.
func headWithoutBody(c *gin.Context) {
	if c.Request.Method != http.MethodHead {
		c.Next()
		return
	}
	w := &headWriter{ResponseWriter: c.Writer}
	c.Writer = w
	c.Next()
	if w.Header().Get("Content-Length") == "" {
		w.Header().Set("Content-Length", strconv.Itoa(w.n))
	}
	w.ResponseWriter.WriteHeaderNow()
}

// headWriter counts the body a handler writes and drops it; the status and headers go out once
// the handlers are done (headWithoutBody).
type headWriter struct {
	gin.ResponseWriter
	n int
}

func (w *headWriter) Write(b []byte) (int, error) {
	w.n += len(b)
	return len(b), nil
}

func (w *headWriter) WriteString(s string) (int, error) {
	w.n += len(s)
	return len(s), nil
}

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.engine }

// MetricsHandler answers GET /metrics and nothing else, for a listener of its own.
func (s *Server) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	// A figure the database cannot give now (down, or slower than the scrape) is left out and
	// logged: the request counts still show the outage, and the API does not look down.
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}))
	return mux
}

// Routes lists "METHOD path" for every route (the OpenAPI test compares them with the spec),
// but HEAD, which every GET route answers too.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.engine.Routes() {
		if r.Method == http.MethodHead {
			continue
		}
		out = append(out, r.Method+" "+r.Path)
	}
	return out
}

// readyTTL is how long a readiness answer is reused: a check is a database round trip and two
// Temporal calls, and /readyz needs no credentials.
const readyTTL = time.Second

// searchAttributesTTL is how long registered search attributes are believed to stay so: they
// are removed only by an operator. Missing ones are looked for again at every check.
const searchAttributesTTL = time.Minute

// errSearchAttributesMissing: the namespace lacks attributes the workflows set.
var errSearchAttributesMissing = errors.New("search attributes missing")

// readiness is the latest readiness answer. Callers that arrive during a check wait for it
// under mu rather than start their own.
type readiness struct {
	mu      sync.Mutex
	checked time.Time
	status  int
	checks  gin.H
	causes  map[string]string // dependency -> the error last logged for it
	attrsOK time.Time         // when the search attributes were last found registered
	leaving atomic.Bool       // the process is stopping (NotReady): 503 whatever the checks say
}

// NotReady makes /readyz answer 503 from now on, the process still serving: a stopping API lets
// its load balancer take it out of rotation before its listener closes.
func (s *Server) NotReady() { s.ready.leaving.Store(true) }

func (s *Server) readyz(c *gin.Context) {
	if s.ready.leaving.Load() {
		c.JSON(http.StatusServiceUnavailable, gin.H{"api": "shutting down"})
		return
	}
	status, checks := s.ready.get(c.Request.Context(), s.checkReady)
	c.JSON(status, checks)
}

func (r *readiness) get(ctx context.Context, check func(context.Context) map[string]error) (int, gin.H) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checks != nil && time.Since(r.checked) < readyTTL {
		return r.status, r.checks
	}
	// Not the caller's context: its cancellation must not be every waiter's "down".
	errs := check(context.WithoutCancel(ctx))
	r.checked, r.status, r.checks = time.Now(), http.StatusOK, gin.H{}
	for dep, err := range errs {
		r.checks[dep] = "ok"
		switch {
		case errors.Is(err, errSearchAttributesMissing):
			r.checks[dep], r.status = "missing", http.StatusServiceUnavailable
		case errors.Is(err, workflows.ErrNoWorker):
			r.checks[dep], r.status = "no_worker", http.StatusServiceUnavailable
		case err != nil:
			r.checks[dep], r.status = "down", http.StatusServiceUnavailable
		}
	}
	return r.status, r.checks
}

// checkReady checks each dependency. The answer says only which one is down: an error names
// hosts, users and queues, so it goes to the log, once per change rather than once per probe.
// It runs under s.ready.mu.
func (s *Server) checkReady(ctx context.Context) map[string]error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	errs := map[string]error{"database": s.Store.Ping(ctx), "temporal": s.Workflows.Ready(ctx)}
	if s.SearchAttributes != nil {
		errs["search_attributes"] = s.checkSearchAttributes(ctx)
	}
	if s.ready.causes == nil {
		s.ready.causes = map[string]string{}
	}
	for dep, err := range errs {
		was := s.ready.causes[dep]
		switch {
		case err != nil && err.Error() != was:
			s.log.Warn("readiness: "+dep+" down", "error", err)
			s.ready.causes[dep] = err.Error()
		case err == nil && was != "":
			s.log.Info("readiness: " + dep + " ok again")
			delete(s.ready.causes, dep)
		}
	}
	return errs
}

// checkSearchAttributes asks Temporal at most once a minute while the attributes are there,
// and at every check while they are not. It runs under s.ready.mu.
func (s *Server) checkSearchAttributes(ctx context.Context) error {
	if time.Since(s.ready.attrsOK) < searchAttributesTTL {
		return nil
	}
	missing, err := s.SearchAttributes.MissingSearchAttributes(ctx)
	switch {
	case err != nil:
		return err
	case len(missing) > 0:
		return fmt.Errorf("%w on the namespace: %s (run kasa migrate, docs/operations.md)", errSearchAttributesMissing, strings.Join(missing, ", "))
	}
	s.ready.attrsOK = time.Now()
	return nil
}

const ctxMerchant = "kasa.merchant"

func bearer(c *gin.Context) string {
	h := c.GetHeader("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// adminAuth lets through a call with the admin token (or the previous one, while a rotation
// overlaps) and records it in the admin audit once it is answered (docs/security.md).
func (s *Server) adminAuth(c *gin.Context) {
	if s.authRefused(c) {
		return
	}
	tok := bearer(c)
	current := s.AdminToken != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.AdminToken)) == 1
	previous := s.AdminTokenPrevious != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.AdminTokenPrevious)) == 1
	if !current && !previous {
		s.authFailed(c)
		s.writeError(c, payment.ErrUnauthorized)
		return
	}
	answered := false
	defer func() { // a handler's panic is answered 500 by recover, and audited as that here
		e := store.AuditEntry{TokenID: AdminTokenID(tok), Method: c.Request.Method, Route: c.FullPath(),
			Target: auditTarget(c.Request.URL), Status: c.Writer.Status(), RequestID: requestID(c)}
		if !answered {
			e.Status = http.StatusInternalServerError
		}
		if err := s.Store.Audit(context.WithoutCancel(c.Request.Context()), e); err != nil {
			s.log.Error("admin audit: the call is not recorded", "request_id", e.RequestID, "route", e.Route, "status", e.Status, "error", err)
		}
	}()
	c.Next()
	answered = true
}

// auditTarget is a call's path and query as the audit keeps them. A query string may carry
// bytes that are not UTF-8 (HTTP lets them through), which PostgreSQL refuses in text: they are
// percent-encoded, else the call would be left out of the audit.
func auditTarget(u *url.URL) string {
	t := u.RequestURI()
	if utf8.ValidString(t) {
		return t
	}
	var b strings.Builder
	for i := 0; i < len(t); {
		r, n := utf8.DecodeRuneInString(t[i:])
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, "%%%02X", t[i])
		} else {
			b.WriteString(t[i : i+n])
		}
		i += n
	}
	return b.String()
}

// AdminTokenID names an admin token in the audit without revealing it: the start of its SHA-256.
func AdminTokenID(token string) string {
	h := sha256.Sum256([]byte(token))
	return "adm_" + hex.EncodeToString(h[:6])
}

func (s *Server) merchantAuth(c *gin.Context) {
	if s.authRefused(c) {
		return
	}
	key := bearer(c)
	if key == "" {
		s.authFailed(c)
		s.writeError(c, payment.ErrUnauthorized)
		return
	}
	var guard authGuard
	if s.failedAuth != nil {
		guard = clientAuth{s, c}
	}
	m, err := s.merchants.lookup(c.Request.Context(), key, s.Store.MerchantByAPIKey, guard)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.Set(ctxMerchant, m)
	c.Next()
}

func merchantOf(c *gin.Context) payment.Merchant { return c.MustGet(ctxMerchant).(payment.Merchant) }

func (s *Server) requestID(c *gin.Context) {
	// A client's id is kept when it is printable ASCII: it goes into logs and admin_audit.
	id := c.GetHeader("X-Request-Id")
	if len(id) > 128 || !payment.ValidKey(id) {
		id = payment.NewID().String()
	}
	c.Set("kasa.request_id", id)
	c.Header("X-Request-Id", id)
	c.Next()
}

func requestID(c *gin.Context) string { return c.GetString("kasa.request_id") }

func (s *Server) recover(c *gin.Context) {
	defer func() {
		if r := recover(); r != nil {
			s.writeError(c, fmt.Errorf("panic: %v\n%s", r, debug.Stack())) // logged there, once
		}
	}()
	c.Next()
}

func writeJSON(c *gin.Context, status int, v any) {
	b, err := payment.JSON(v)
	if err != nil {
		panic(err) // our own response types always encode
	}
	c.Data(status, "application/json", b)
}

func setRetryAfter(c *gin.Context) { c.Header("Retry-After", strconv.Itoa(retryAfter)) }

// noStore keeps every admin answer out of caches: some carry secrets shown once (a merchant's API
// key, its webhook secret).
func noStore(c *gin.Context) {
	c.Header("Cache-Control", "no-store")
	c.Next()
}
