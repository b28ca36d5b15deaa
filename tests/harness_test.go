// Package tests holds kasa's end-to-end tests: the real REST API over HTTP, real PostgreSQL, a
// real Temporal dev server and the bank simulator, asserting effects in the database and at the
// simulator, not only status codes.
package tests

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/api"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/banksim"
	"github.com/kasa-pay/kasa/tools/kasaapi"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/worker"
	"github.com/kasa-pay/kasa/workflows"
)

var (
	env *testkit.Env
	db  *store.Store
	tc  client.Client
)

const adminToken = "adm_test_token_0123456789abcdef0123" // kasa api wants 32 characters at least

// bookingWindow is the stacks' KASA_PROVIDER_BOOKING_WINDOW: short, so that tests can wait it out.
const bookingWindow = time.Second

func TestMain(m *testing.M) {
	testkit.Main(m, testkit.Options{Temporal: true, TemporalServer: true}, func(e *testkit.Env) { env, db, tc = e, e.Store, e.Temporal })
}

// stack is one isolated kasa: its own simulator, worker task queue and API server, sharing the
// package's database and Temporal.
type stack struct {
	t      *testing.T
	api    *httptest.Server
	sim    *httptest.Server
	queue  string
	awaits *atomic.Int32 // the API's calls for a workflow's result
	// commandFaults are what happens to the API's next captures and cancels, in turn.
	commandFaults *commandFaults
	// others are further API instances on the same database, Temporal and task queue, each with
	// its own memory (stackOptions.apis).
	others []*httptest.Server
}

// A command fault: the request never reaches Temporal (as when it is unreachable); or the workflow
// takes the command but its answer is lost; or the command is sent only once the payment's
// workflow has ended (the API read the payment just before); or, once it has ended, Temporal no
// longer knows the command (taken by an earlier run of the workflow, before a continue-as-new).
const (
	commandLost       = "lost"
	commandAnswerLost = "answer lost"
	commandAfterEnd   = "after the workflow ended"
	commandForgotten  = "forgotten once the workflow ended"
	// Temporal is slow to answer the update: it takes the command and says so only after the
	// API's sync wait has ended; or the update does not reach Temporal before the wait ends.
	commandAcceptedLate = "accepted, its answer later than the sync wait"
	commandUnsent       = "not sent before the sync wait ended"
)

type commandFaults struct {
	mu   sync.Mutex
	next []string
}

func (f *commandFaults) add(faults ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next = append(f.next, faults...)
}

func (f *commandFaults) take() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.next) == 0 {
		return ""
	}
	fault := f.next[0]
	f.next = f.next[1:]
	return fault
}

func newStack(t *testing.T, capability workflows.Capability) *stack {
	t.Helper()
	return newStackWith(t, stackOptions{capability: capability, temporal: tc})
}

type stackOptions struct {
	capability workflows.Capability
	temporal   client.Client
	// remoteWorker: the API does not learn outcomes from the worker's store (as `kasa api` with
	// the worker in another process) and asks Temporal for each workflow's result.
	remoteWorker bool
	pollAfter    time.Duration // api.Options.PollAfter (default 1s)
	// bookingWindow is the workflows' booking window (default: the workflows' default).
	bookingWindow time.Duration
	retention     time.Duration // api.Options.Retention (default: no bound on the replay cache)
	captureWindow time.Duration // api.Options.CaptureWindow (default: the API's)
	adminPrevious string        // api.Options.AdminTokenPrevious: a rotation's overlap
	backlog       api.Backlog   // api.Options.Backlog (default: none, nothing is queued)
	// bank, when set, stands in front of the simulator: it answers what the simulator cannot.
	bank func(sim http.Handler) http.Handler
	// steps, when set, stands in front of the worker's store: it slows or stops its steps.
	steps func(activities.Store) activities.Store
	// apis is how many API instances serve the stack (default 1): the first is stack.api.
	apis     int
	syncWait time.Duration // api.Options.SyncWait (default 15s)
	// chargeBudget and chargeTimeout are the workers' (default 10s and the workflows' default);
	// settleTimeout is the API's settlement imports' wait for each settlement (default 30s).
	chargeBudget, chargeTimeout, settleTimeout time.Duration
	// apiStore, when set, stands in front of the APIs' store.
	apiStore func(api.Store) api.Store
}

// awaitCounter counts the API's calls for a workflow's result, and plays its command faults.
type awaitCounter struct {
	workflows.Starter
	n      *atomic.Int32
	faults *commandFaults
}

func (a awaitCounter) Command(ctx context.Context, merchantID uuid.UUID, key, update string, c workflows.Command) (string, error) {
	unavailable := fmt.Errorf("%w: temporal unreachable (test)", payment.ErrUnavailable)
	switch f := a.faults.take(); f {
	case commandLost:
		return "", unavailable
	case commandAnswerLost:
		short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		if _, err := a.Starter.Command(short, merchantID, key, update, c); err != nil && !errors.Is(err, workflows.ErrStillRunning) {
			return "", err
		}
		return "", unavailable
	case commandAcceptedLate, commandUnsent:
		late := a.Starter
		late.Client = lateUpdates{Client: a.Client, send: f == commandAcceptedLate}
		return late.Command(ctx, merchantID, key, update, c)
	case commandAfterEnd, commandForgotten:
		if err := a.Client.GetWorkflow(ctx, workflows.PaymentWorkflowID(merchantID, key), "").Get(ctx, nil); err != nil {
			return "", err
		}
		if f == commandForgotten {
			return "", payment.ErrNotCapturable // what the client makes of Temporal's "not found"
		}
	}
	return a.Starter.Command(ctx, merchantID, key, update, c)
}

// lateUpdates is a Temporal client whose updates are answered only once the caller's wait has
// ended: sent, Temporal takes the update and its answer comes too late; unsent, it never left.
type lateUpdates struct {
	client.Client
	send bool
}

func (l lateUpdates) UpdateWorkflow(ctx context.Context, o client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	if l.send {
		if _, err := l.Client.UpdateWorkflow(ctx, o); err != nil {
			return nil, err
		}
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (a awaitCounter) AwaitPayment(ctx context.Context, merchantID uuid.UUID, key, runID string) (workflows.PaymentResult, error) {
	a.n.Add(1)
	return a.Starter.AwaitPayment(ctx, merchantID, key, runID)
}

// stackRetentionFollow is how often a stack's API reads the workers' shortest retention.
const stackRetentionFollow = 50 * time.Millisecond

func newStackWith(t *testing.T, o stackOptions) *stack {
	t.Helper()
	capability, tc := o.capability, o.temporal
	sim, err := banksim.New(banksim.Options{DataDir: t.TempDir(), Capability: banksim.Capability(capability), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var bank http.Handler = sim.Handler()
	if o.bank != nil {
		bank = o.bank(bank)
	}
	simSrv := httptest.NewServer(bank)
	queue := "payments-test-" + uuid.NewString()
	var steps activities.Store = db
	if o.steps != nil {
		steps = o.steps(db)
	}
	// The worker, which talks to the bank, holds the charge policy; the API names none.
	w := worker.New(tc, queue, &activities.Activities{Store: steps, Provider: provider.New(simSrv.URL, 5*time.Second),
		Policy: workflows.ChargePolicy{Capability: capability, Budget: cmp.Or(o.chargeBudget, 10*time.Second), Timeout: o.chargeTimeout,
			BookingWindow: o.bookingWindow}}, nil)
	require.NoError(t, w.Start())
	t.Cleanup(func() { // after the APIs' (cleanups run last first)
		w.Stop()
		simSrv.Close()
		_ = sim.Close()
	})
	var outcomes api.Outcomes = db // as in kasa dev: the worker runs here, on the same store
	if o.remoteWorker {
		outcomes = nil
	}
	awaits, faults := &atomic.Int32{}, &commandFaults{}
	var apiStore api.Store = db
	if o.apiStore != nil {
		apiStore = o.apiStore(db)
	}
	newAPI := func() *httptest.Server {
		srv := api.New(api.Options{
			Outcomes: outcomes, PollAfter: o.pollAfter,
			Store: apiStore, Workflows: awaitCounter{workflows.Starter{Client: tc, TaskQueue: queue}, awaits, faults}, AdminToken: adminToken,
			AllowPrivateWebhooks: true, SyncWait: cmp.Or(o.syncWait, 15*time.Second), // webhook endpoints of tests listen on 127.0.0.1
			ReplayCache:   1000,
			Retention:     o.retention,
			CaptureWindow: o.captureWindow, AdminTokenPrevious: o.adminPrevious, Backlog: o.backlog,
			Logger:     slog.New(slog.DiscardHandler),
			Reconciler: &reconcile.Reconciler{Store: db, Settler: workflows.Starter{Client: tc, TaskQueue: queue}, SettleTimeout: cmp.Or(o.settleTimeout, 30*time.Second), BookingWindow: bookingWindow, Runs: db, Source: "api"},
		})
		apiSrv := httptest.NewServer(srv.Handler())
		follow, stopFollow := context.WithCancel(context.Background())
		go srv.FollowRetentions(follow, db, worker.RetentionLive, stackRetentionFollow)
		t.Cleanup(func() {
			stopFollow()
			apiSrv.Close()
		})
		return apiSrv
	}
	apiSrv := newAPI()
	var others []*httptest.Server
	for range o.apis - 1 {
		others = append(others, newAPI())
	}
	return &stack{t: t, api: apiSrv, sim: simSrv, queue: queue, awaits: awaits, commandFaults: faults, others: others}
}

type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// requireProblem checks an error answer: its status and its problem's code.
func requireProblem(t *testing.T, r response, status int, code string) {
	t.Helper()
	require.Equal(t, status, r.Status, "%s", r.Body)
	require.Equal(t, code, r.json(t)["code"], "%s", r.Body)
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.Body, &m), "body: %s", r.Body)
	return m
}

// do sends a request to the stack's API; headers come in pairs ("Idempotency-Key", "k1").
func (s *stack) do(method, path, bearer string, body string, headers ...string) response {
	s.t.Helper()
	return httpDo(s.t, method, s.api.URL+path, bearer, body, headers...)
}

func httpDo(t *testing.T, method, url, bearer string, body string, headers ...string) response {
	t.Helper()
	r, err := httpCall(method, url, bearer, body, headers...)
	require.NoError(t, err, "%s %s", method, url)
	return r
}

var testClient = &http.Client{Timeout: 30 * time.Second}

// httpCall is one HTTP request; a transport error is returned, not fatal (a process may be
// down on purpose). Headers come in pairs.
func httpCall(method, url, bearer, body string, headers ...string) (response, error) {
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	r, err := kasaapi.Do(context.Background(), testClient, method, url, bearer, b, headers...)
	return response(r), err
}

type merchant struct {
	ID, APIKey           string
	KeyID, WebhookSecret string // as creation answered them
}

func (s *stack) newMerchant() merchant {
	s.t.Helper()
	return s.createMerchant(`{"name":"Test Merchant"}`)
}

// newHookedMerchant is a merchant whose events go to the webhook url.
func (s *stack) newHookedMerchant(url string) merchant {
	s.t.Helper()
	return s.createMerchant(fmt.Sprintf(`{"name":"Hooked","webhook_url":%q}`, url))
}

func (s *stack) createMerchant(body string) merchant {
	s.t.Helper()
	r := s.do("POST", "/admin/v1/merchants", adminToken, body)
	require.Equal(s.t, http.StatusCreated, r.Status, "%s", r.Body)
	m := r.json(s.t)
	return merchant{ID: m["id"].(string), APIKey: m["api_key"].(string), KeyID: m["api_key_id"].(string),
		WebhookSecret: m["webhook_secret"].(string)}
}

func (s *stack) newAccount(m merchant, currency, deposit string) string {
	s.t.Helper()
	r := s.do("POST", "/admin/v1/accounts", adminToken, fmt.Sprintf(`{"merchant_id":%q,"currency":%q}`, m.ID, currency))
	require.Equal(s.t, http.StatusCreated, r.Status, "%s", r.Body)
	id := r.json(s.t)["id"].(string)
	if deposit != "" {
		r = s.do("POST", "/admin/v1/accounts/"+id+"/deposits", adminToken, fmt.Sprintf(`{"amount":%q}`, deposit), "Idempotency-Key", "seed-"+id)
		require.Equal(s.t, http.StatusCreated, r.Status, "%s", r.Body)
	}
	return id
}

func (s *stack) pay(m merchant, key, body string) response {
	s.t.Helper()
	return s.do("POST", "/v1/payments", m.APIKey, body, "Idempotency-Key", key)
}

func payBody(invoice, amount, currency, account string) string {
	return fmt.Sprintf(`{"invoice_id":%q,"amount":%q,"currency":%q,"account_id":%q}`, invoice, amount, currency, account)
}

func (s *stack) account(m merchant, id string) map[string]any {
	s.t.Helper()
	r := s.do("GET", "/v1/accounts/"+id, m.APIKey, "")
	require.Equal(s.t, http.StatusOK, r.Status, "%s", r.Body)
	return r.json(s.t)
}

// simCount is how many times the simulator moved money for a reference.
func (s *stack) simCount(reference string) int {
	s.t.Helper()
	n, _ := bankCharges(s.t, s.sim.URL, reference)
	return n
}

func (s *stack) setFaults(rules string) { s.t.Helper(); setBankFaults(s.t, s.sim.URL, rules) }

// requireVerified runs `kasa verify`'s checks: no invariant may be violated after a scenario.
func requireVerified(t *testing.T) {
	t.Helper()
	problems, err := db.Verify(context.Background())
	require.NoError(t, err)
	require.Empty(t, problems)
}
