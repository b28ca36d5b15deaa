package tests

// Several instances of every long-running process at once: two `kasa api`, two `kasa worker`,
// two `kasa relay`, against one database and one Temporal namespace. Any one of them is SIGKILLed
// in the middle of the work; the others carry on, and nothing is lost or done twice: every
// payment is charged once at the bank, the ledger verifies, and every event reaches the merchant.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// multiTemporal is the Temporal every multi-instance test runs against, and the only place
// that says which: the package's real multi-service Temporal Server on PostgreSQL.
func multiTemporal() (address, namespace string) { return env.TemporalServerAddress, "default" }

// multiStack is a crashStack with any number of API and worker processes.
type multiStack struct {
	*crashStack
	apis     []*proc
	apiAddrs []string
	tc       client.Client // reads workflow histories and task queue pollers
}

func newMultiStack(t *testing.T, c crashConfig) *multiStack {
	t.Helper()
	c.temporal, c.namespace = multiTemporal()
	s := &multiStack{crashStack: newCrashStack(t, c)}
	tc, err := client.Dial(client.Options{HostPort: s.temporal, Namespace: s.namespace, Logger: quietSDKLogger{}})
	require.NoError(t, err)
	t.Cleanup(tc.Close)
	s.tc = tc
	return s
}

// quietSDKLogger keeps the SDK's chatter out of the test output.
type quietSDKLogger struct{}

func (quietSDKLogger) Debug(string, ...any) {}
func (quietSDKLogger) Info(string, ...any)  {}
func (quietSDKLogger) Warn(string, ...any)  {}
func (quietSDKLogger) Error(string, ...any) {}

// startWorkerNamed starts one more `kasa worker`, logging to <name>.log.
func (s *multiStack) startWorkerNamed(name string, overrides ...string) *proc {
	s.t.Helper()
	return startProc(s.t, s.dir, s.bin, name, s.env(overrides...), "worker")
}

// startAPIs starts n more `kasa api` processes, each on a port of its own (the first one ever on
// the crashStack's address, which its helpers use), and waits until each is ready.
func (s *multiStack) startAPIs(n int, overrides ...string) {
	s.t.Helper()
	for range n {
		addr := s.apiAddr
		if len(s.apiAddrs) > 0 {
			addr = testkit.FreeAddr(s.t)
		}
		name := fmt.Sprintf("api%d", len(s.apis)+1)
		p := startProc(s.t, s.dir, s.bin, name, s.env(append([]string{"KASA_API_ADDR", addr}, overrides...)...), "api")
		p.waitHTTP("http://" + addr + "/readyz")
		s.apis, s.apiAddrs = append(s.apis, p), append(s.apiAddrs, addr)
	}
}

// payAt sends a payment to the i-th API.
func (s *multiStack) payAt(i int, m merchant, key, body string) (response, error) {
	return httpCall("POST", "http://"+s.apiAddrs[i]+"/v1/payments", m.APIKey, body, "Idempotency-Key", key)
}

// payUntilCreated pays key on the i-th API like a careful client until it is answered 201:
// 409 idempotency_key_in_use (with Retry-After) and 202 are retried with the same key. It runs in
// goroutines, so it reports a problem instead of failing the test.
func (s *multiStack) payUntilCreated(i int, m merchant, key, body string, until time.Time) (answers []response, problem string) {
	for {
		r, err := s.payAt(i, m, key, body)
		if err != nil {
			return answers, fmt.Sprintf("api%d: %v", i+1, err)
		}
		answers = append(answers, r)
		switch r.Status {
		case http.StatusCreated:
			return answers, ""
		case http.StatusAccepted:
		case http.StatusConflict:
			var p struct{ Code string }
			_ = json.Unmarshal(r.Body, &p)
			if p.Code != "idempotency_key_in_use" || r.Header.Get("Retry-After") == "" {
				return answers, fmt.Sprintf("api%d: 409 that is not a key in use: %s", i+1, r.Body)
			}
		default:
			return answers, fmt.Sprintf("api%d: unexpected answer %d: %s", i+1, r.Status, r.Body)
		}
		if time.Now().After(until) {
			return answers, fmt.Sprintf("api%d: no 201 by the deadline (last %d: %s)", i+1, r.Status, r.Body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// workflowTasks lists who ran a payment's workflow tasks: the identity of each started task and
// of each completed one, and how many timed out (their worker went silent).
func (s *multiStack) workflowTasks(m merchant, key string) (started, completed []string, timedOut int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	it := s.tc.GetWorkflowHistory(ctx, workflows.PaymentWorkflowID(mustUUID(s.t, m.ID), key), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		require.NoError(s.t, err, key)
		switch e.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED:
			started = append(started, e.GetWorkflowTaskStartedEventAttributes().GetIdentity())
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
			completed = append(completed, e.GetWorkflowTaskCompletedEventAttributes().GetIdentity())
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
			timedOut++
		}
	}
	return started, completed, timedOut
}

// identity is the Temporal identity of a kasa process: the SDK's default, pid@host@.
func identity(p *proc) string { return strconv.Itoa(p.pid()) + "@" }

// whose names the process of an identity among procs, or "" for none of them.
func whose(id string, procs map[string]*proc) string {
	for name, p := range procs {
		if strings.HasPrefix(id, identity(p)) {
			return name
		}
	}
	return ""
}

// waitPolling waits until each named worker polls the payment task queue.
func (s *multiStack) waitPolling(workers map[string]*proc, names ...string) {
	s.t.Helper()
	require.Eventually(s.t, func() bool {
		resp, err := s.tc.DescribeTaskQueue(context.Background(), s.queue, enumspb.TASK_QUEUE_TYPE_WORKFLOW)
		if err != nil {
			return false
		}
		seen := map[string]bool{}
		for _, p := range resp.GetPollers() {
			seen[whose(p.GetIdentity(), workers)] = true
		}
		for _, name := range names {
			if !seen[name] {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "%v poll the task queue", names)
}

// Payments spread over two APIs, each key sent to both (one after the other, concurrently, or at
// the same instant): every payment runs once, both APIs give the same answer for a key, and the
// two workers share the workflows.
func TestMultiAPIsAndWorkersSharePayments(t *testing.T) {
	t.Parallel()
	s := newMultiStack(t, crashConfig{capability: "idempotent"})
	s.startBanksim()
	workers := map[string]*proc{"worker1": s.startWorkerNamed("worker1"), "worker2": s.startWorkerNamed("worker2")}
	s.startAPIs(2)
	m := s.merchant()
	acct := s.account(m, "TRY", "1000.00")

	s.waitPolling(workers, "worker1", "worker2") // both, before any payment

	const n = 40
	type payCase struct {
		key, amount, body, order string
		answers                  [2][]response
		problems                 [2]string
	}
	cases := make([]*payCase, n)
	orders := []string{"api1 then api2 while it runs", "api2 then api1 while it runs", "both at once", "api1, then api2 after the answer"}
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 10) // payments in flight at once
	for i := range cases {
		c := &payCase{key: fmt.Sprintf("multi-%02d", i), amount: fmt.Sprintf("%d.%02d", 1+i%9, i), order: orders[i%4]}
		c.body = payBody("inv-"+c.key, c.amount, "TRY", acct)
		cases[i] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			until := time.Now().Add(60 * time.Second)
			send := func(api int) { c.answers[api], c.problems[api] = s.payUntilCreated(api, m, c.key, c.body, until) }
			var both sync.WaitGroup
			later := func(api int, after time.Duration) {
				both.Add(1)
				go func() { defer both.Done(); time.Sleep(after); send(api) }()
			}
			switch i % 4 {
			case 0:
				later(0, 0)
				later(1, 15*time.Millisecond)
			case 1:
				later(1, 0)
				later(0, 15*time.Millisecond)
			case 2:
				later(0, 0)
				later(1, 0)
			case 3:
				send(0)
				send(1)
			}
			both.Wait()
		}()
	}
	wg.Wait()
	t.Logf("%d payments, each sent to both APIs, answered in %v", n, time.Since(start).Round(10*time.Millisecond))

	ids := map[string]bool{}
	inUse, accepted := 0, 0
	total := int64(0)
	for _, c := range cases {
		require.Empty(t, c.problems[0], "%s (%s)", c.key, c.order)
		require.Empty(t, c.problems[1], "%s (%s)", c.key, c.order)
		first := map[bool]int{} // final answers without / with Idempotent-Replayed
		var finals []response
		for api := range 2 {
			answers := c.answers[api]
			final := answers[len(answers)-1]
			finals = append(finals, final)
			first[final.Header.Get("Idempotent-Replayed") == "true"]++
			for _, r := range answers[:len(answers)-1] {
				switch r.Status {
				case http.StatusConflict:
					inUse++
				case http.StatusAccepted:
					accepted++
					require.Equal(t, final.json(t)["id"], r.json(t)["id"], "%s: a 202 names the payment of the final answer", c.key)
				}
			}
		}
		require.Equal(t, string(finals[0].Body), string(finals[1].Body), "%s (%s): both APIs answer the key byte for byte alike", c.key, c.order)
		require.LessOrEqual(t, first[false], 1, "%s (%s): one request ran the payment, every other answer is a replay", c.key, c.order)
		p := finals[0].json(t)
		id := p["id"].(string)
		require.False(t, ids[id], "%s: a payment of its own", c.key)
		ids[id] = true
		require.Equal(t, "succeeded", p["status"], c.key)
		n, charges := s.simCharges(id)
		require.Equal(t, 1, n, "%s (%s): exactly one charge", c.key, c.order)
		require.Equal(t, charges[0], p["provider_reference"], c.key)
		amount, err := payment.ParseAmount(c.amount, "TRY")
		require.NoError(t, err)
		total += amount
	}
	t.Logf("while a key ran on the other API: %d answers 409 idempotency_key_in_use, %d answers 202", inUse, accepted)
	require.Positive(t, inUse, "some same-key requests met the payment while it ran on the other API")
	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{payment.FormatAmount(100000-total, "TRY"), "0.00"}, []string{balance, reserved})
	s.verify()

	// Both workers ran payments: the workflow tasks of every payment were completed by one of
	// the two worker processes (never by an API), and each of them completed some.
	ran := map[string]int{}
	for _, c := range cases {
		_, completed, _ := s.workflowTasks(m, c.key)
		require.NotEmpty(t, completed, c.key)
		for _, id := range completed {
			who := whose(id, workers)
			require.NotEmpty(t, who, "%s: workflow task completed by %q, not a worker of this test", c.key, id)
			ran[who]++
		}
	}
	t.Logf("workflow tasks completed per worker: %v", ran)
	require.Positive(t, ran["worker1"], "worker1 ran workflow tasks")
	require.Positive(t, ran["worker2"], "worker2 ran workflow tasks")
	for _, p := range append(s.apis, workers["worker1"], workers["worker2"], s.sim) {
		p.requireRunning(t, "after the payments")
	}
}

// countingProxy passes a worker's provider calls on to the bank and counts its charges in flight.
// A charge whose caller died still reaches the bank, which books it: the worker never hears.
type countingProxy struct {
	srv      *httptest.Server
	target   string
	inFlight atomic.Int32
	charges  atomic.Int32
}

func newCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	p := &countingProxy{target: target}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(func() { p.srv.CloseClientConnections(); p.srv.Close() })
	return p
}

func (p *countingProxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	if r.Method == http.MethodPost && r.URL.Path == "/v1/charges" {
		p.charges.Add(1)
		p.inFlight.Add(1)
		defer p.inFlight.Add(-1)
	}
	req, err := http.NewRequestWithContext(context.WithoutCancel(r.Context()), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

// One of two workers is SIGKILLed while its charges are held at the bank (which books them after
// the worker died): the other worker finishes every payment, charging each once where the
// provider lets a re-sent charge be recognised; with capability none a payment whose attempt
// died is parked unknown, with its reservation kept. A fresh worker started afterwards takes
// work again.
func TestMultiWorkerKilledMidCharge(t *testing.T) {
	t.Parallel()
	for _, capability := range []string{"idempotent", "inquiry", "none"} {
		t.Run(capability, func(t *testing.T) {
			t.Parallel()
			s := newMultiStack(t, crashConfig{capability: capability, providerTimeout: "5s", syncWait: "300ms"})
			s.startBanksim()
			p1, p2 := newCountingProxy(t, s.simURL()), newCountingProxy(t, s.simURL())
			w1 := s.startWorkerNamed("worker1", "KASA_PROVIDER_URL", p1.srv.URL)
			w2 := s.startWorkerNamed("worker2", "KASA_PROVIDER_URL", p2.srv.URL)
			s.startAPIs(1)
			m := s.merchant()
			acct := s.account(m, "TRY", "1000.00")
			s.setFaults(`{"rules":[{"on":"charge","action":"delay","delay_ms":2000}]}`)

			keys, amounts := batchKeys("kill", 0, 12)
			batch := s.payBatch(m, acct, keys, amounts, time.Now().Add(30*time.Second))
			require.Eventually(t, func() bool { return p1.inFlight.Load() > 0 }, 15*time.Second, 5*time.Millisecond,
				"worker1 never charged\n%s", testkit.Tail(w1.log, 20))
			time.Sleep(200 * time.Millisecond) // more of its charges reach the bank
			held := p1.inFlight.Load()
			w1.kill()
			killed := time.Now()
			results := collect(t, batch, len(keys))

			workers := map[string]*proc{"worker1": w1, "worker2": w2}
			deadline := time.Now().Add(60 * time.Second)
			taken, succeeded, unknown := 0, 0, 0
			var spent, reserved int64
			for _, r := range results {
				p := s.waitPayment(m, r.id, deadline)
				n, charges := s.simCharges(r.id)
				amount, err := payment.ParseAmount(r.amount, "TRY")
				require.NoError(t, err)
				switch {
				case p["status"] == "succeeded":
					succeeded++
					spent += amount
					require.Equal(t, 1, n, "%s: exactly one charge", r.key)
					require.Equal(t, charges[0], p["provider_reference"], r.key)
				case capability == "none" && p["status"] == "unknown":
					// No inquiry and no idempotency: the attempt that died is never re-sent.
					unknown++
					reserved += amount
					require.LessOrEqual(t, n, 1, "%s: never two charges", r.key)
				default:
					t.Fatalf("%s: %v (%d charges)", r.key, p, n)
				}
				started, completed, timedOut := s.workflowTasks(m, r.key)
				if timedOut > 0 {
					// The killed worker's task went silent; worker2 ran the payment to its end. Its
					// steps run inside its workflow task, so the status can be read just before
					// that task's completion reaches the history.
					taken++
					require.True(t, slices.ContainsFunc(started, func(id string) bool { return whose(id, workers) == "worker1" }),
						"%s: the task that timed out was worker1's: started %v", r.key, started)
					require.Eventually(t, func() bool {
						_, completed, _ = s.workflowTasks(m, r.key)
						return len(completed) > 0 && whose(completed[len(completed)-1], workers) == "worker2"
					}, 10*time.Second, 50*time.Millisecond, "%s: the last task completed is worker2's: %v", r.key, completed)
				}
			}
			t.Logf("worker1 killed with %d charges held at the bank; %d payments taken over by worker2, all settled %v after the kill: %d succeeded, %d unknown",
				held, taken, time.Since(killed).Round(100*time.Millisecond), succeeded, unknown)
			require.Positive(t, taken, "the kill caught payments in the middle")
			if capability != "none" {
				require.Equal(t, len(results), succeeded)
			}
			balance, reservedNow := s.balances(m, acct)
			require.Equal(t, []string{payment.FormatAmount(100000-spent, "TRY"), payment.FormatAmount(reserved, "TRY")}, []string{balance, reservedNow})
			s.verify()

			// A fresh worker process polls and runs payments beside worker2.
			p3 := newCountingProxy(t, s.simURL())
			w3 := s.startWorkerNamed("worker3", "KASA_PROVIDER_URL", p3.srv.URL)
			workers["worker3"] = w3
			s.waitPolling(workers, "worker3")
			s.setFaults(`{"rules":[]}`)
			ran := map[string]int{}
			for round := 0; ran["worker3"] == 0; round++ {
				require.Less(t, round, 10, "the restarted worker never ran a payment: %v\n%s", ran, testkit.Tail(w3.log, 20))
				keys, amounts := batchKeys(fmt.Sprintf("after-%d", round), 0, 6)
				more := collect(t, s.payBatch(m, acct, keys, amounts, time.Now().Add(30*time.Second)), len(keys))
				for _, r := range more {
					p := s.waitPayment(m, r.id, time.Now().Add(30*time.Second))
					require.Equal(t, "succeeded", p["status"], "%s: %v", r.key, p)
					require.Equal(t, 1, s.simCount(r.id), r.key)
					_, completed, _ := s.workflowTasks(m, r.key)
					ran[whose(completed[len(completed)-1], workers)]++
				}
			}
			t.Logf("after the restart, payments completed by: %v", ran)
			require.Positive(t, p3.charges.Load(), "the restarted worker charged through its own connection")
			s.verify()
		})
	}
}

// An API process commits idempotency records and is SIGKILLed before it could start their
// workflows (its Temporal connection is cut first), while a second API keeps serving: every key
// retried on the second API completes once its lease has run out, a key nobody retries is
// started by the second API's sweeper, and new payments on it go through meanwhile.
func TestMultiAPIKilledBetweenRecordAndStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newMultiStack(t, crashConfig{capability: "idempotent", syncWait: "5s"})
	s.startBanksim()
	s.startWorkerNamed("worker1")
	s.startWorkerNamed("worker2")
	s.startAPIs(1) // api1 survives
	cut := newTCPProxy(t, s.temporal)
	s.startAPIs(1, "KASA_TEMPORAL_ADDRESS", cut.addr()) // api2 is killed
	victim := s.apis[1]
	m := s.merchant()
	mid := mustUUID(t, m.ID)
	acct := s.account(m, "TRY", "1000.00")

	type sent struct{ key, amount, body, id string }
	var keys []*sent
	burst := func(prefix string, n int) []*sent {
		var out []*sent
		for i := range n {
			k := &sent{key: fmt.Sprintf("%s-%02d", prefix, i), amount: fmt.Sprintf("%d.00", 1+i)}
			k.body = payBody("inv-"+k.key, k.amount, "TRY", acct)
			out = append(out, k)
			go func() { _, _ = s.payAt(1, m, k.key, k.body) }() // the answer may never come: api2 dies
		}
		require.Eventually(t, func() bool {
			for _, k := range out {
				if _, err := s.st.Record(ctx, mid, k.key); err != nil {
					return false
				}
			}
			return true
		}, 15*time.Second, 10*time.Millisecond, "api2 recorded the burst")
		keys = append(keys, out...)
		return out
	}
	burst("started", 6) // these reach Temporal: the kill finds them started, running or done
	cut.cut()
	stranded := burst("stranded", 10) // recorded, and no start can reach Temporal
	time.Sleep(300 * time.Millisecond)
	victim.kill()
	killed := time.Now()
	unstarted, leased := 0, 0
	for _, k := range stranded {
		rec, err := s.st.Record(ctx, mid, k.key)
		require.NoError(t, err)
		// A start that failed at once gave its lease up, and api1's sweeper may have started
		// that one already; the others died with api2, still trying.
		if !rec.WorkflowStarted {
			unstarted++
			if rec.LockedUntil.After(time.Now()) {
				leased++
			}
		}
	}
	t.Logf("api2 killed with %d of %d records unstarted, %d of them under its lease", unstarted, len(stranded), leased)
	require.Positive(t, unstarted, "the kill left records without a workflow")

	// Meanwhile api1 takes new payments as usual.
	for i := range 3 {
		r, err := s.payAt(0, m, fmt.Sprintf("fresh-%d", i), payBody(fmt.Sprintf("inv-fresh-%d", i), "1.00", "TRY", acct))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Equal(t, 1, s.simCount(r.json(t)["id"].(string)))
	}

	// Every key but the last three is retried on api1; those three are left to its sweeper.
	retried, swept := keys[:len(keys)-3], keys[len(keys)-3:]
	var wg sync.WaitGroup
	problems := make([]string, len(retried))
	for i, k := range retried {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers, problem := s.payUntilCreated(0, m, k.key, k.body, time.Now().Add(60*time.Second))
			if problems[i] = problem; problem == "" {
				var p struct{ ID string }
				_ = json.Unmarshal(answers[len(answers)-1].Body, &p)
				k.id = p.ID
			}
		}()
	}
	wg.Wait()
	for i, k := range retried {
		require.Empty(t, problems[i], k.key)
	}
	t.Logf("every retried key completed on api1 %v after the kill", time.Since(killed).Round(100*time.Millisecond))
	for _, k := range swept {
		rec, err := s.st.Record(ctx, mid, k.key)
		require.NoError(t, err)
		k.id = rec.OperationID.String()
		p := s.waitPayment(m, k.id, killed.Add(60*time.Second))
		require.Equal(t, "succeeded", p["status"], "%s: the sweeper starts a payment nobody retries: %v", k.key, p)
	}
	t.Logf("the sweeper completed the unretried keys %v after the kill", time.Since(killed).Round(100*time.Millisecond))

	total := int64(300) // the fresh payments
	for _, k := range keys {
		rec, err := s.st.Record(ctx, mid, k.key)
		require.NoError(t, err)
		require.Equal(t, store.RecordCompleted, rec.Status, k.key)
		require.Equal(t, rec.OperationID.String(), k.id, "%s: one operation per key", k.key)
		p := s.payment(m, k.id)
		require.Equal(t, "succeeded", p["status"], k.key)
		require.Equal(t, 1, s.simCount(k.id), "%s: exactly one charge", k.key)
		amount, err := payment.ParseAmount(k.amount, "TRY")
		require.NoError(t, err)
		total += amount
	}
	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{payment.FormatAmount(100000-total, "TRY"), "0.00"}, []string{balance, reserved})
	s.apis[0].requireRunning(t, "the surviving API")
	s.verify()
}

// localPorts are the local TCP ports of a process's sockets (Linux: its socket inodes found in
// /proc/net/tcp{,6}).
func localPorts(t *testing.T, pid int) map[int]bool {
	t.Helper()
	inodes := map[string]bool{}
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	ports := map[int]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || !inodes[f[9]] {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if port, err := strconv.ParseInt(hexPort, 16, 32); err == nil {
				ports[int(port)] = true
			}
		}
	}
	return ports
}

// metricSum adds up every sample of the named metrics in a Prometheus text exposition.
func metricSum(text string, names ...string) float64 {
	sum := 0.0
	for _, line := range strings.Split(text, "\n") {
		for _, name := range names {
			if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
				if v, err := strconv.ParseFloat(rest[strings.LastIndex(rest, " ")+1:], 64); err == nil {
					sum += v
				}
			}
		}
	}
	return sum
}

// Two `kasa relay` processes share one external broker; one is SIGKILLed while payments stream
// in after it did some of the work. Every outbox event reaches the merchant at least once, a
// repeated delivery carries the same body, and nothing arrives that is not in the outbox.
func TestMultiRelaysOneKilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newMultiStack(t, crashConfig{capability: "idempotent"})
	s.startBanksim()
	s.startWorkerNamed("worker1")
	s.startAPIs(1)
	natsURL, stopBroker, err := outbox.StartEmbedded(filepath.Join(t.TempDir(), "nats")) // external to both relays
	require.NoError(t, err)
	t.Cleanup(stopBroker)
	var relays []*proc
	var metricsAddrs []string
	for i := range 2 {
		addr := testkit.FreeAddr(t)
		r := startProc(t, s.dir, s.bin, fmt.Sprintf("relay%d", i+1), s.env("KASA_NATS_URL", natsURL, "KASA_RELAY_METRICS_ADDR", addr, "KASA_WEBHOOK_TIMEOUT", "2s", "KASA_WEBHOOK_PER_MERCHANT", "16"), "relay")
		r.waitHTTP("http://" + addr + "/healthz")
		relays, metricsAddrs = append(relays, r), append(metricsAddrs, addr)
	}
	work := func(i int, metrics ...string) float64 { // what relay i has done so far
		r, err := httpCall("GET", "http://"+metricsAddrs[i]+"/metrics", "", "")
		if err != nil {
			return 0
		}
		return metricSum(string(r.Body), metrics...)
	}
	const published, consumed, attempted = "kasa_outbox_published_total", "kasa_webhook_events_consumed_total", "kasa_webhook_attempts_total"

	// The merchant holds every request from the 11th on for a while, until relay1 is dead: the
	// kill finds relay1 with deliveries in flight, which it never records as delivered.
	var mu sync.Mutex
	inFlight := map[int]string{} // the sending port of each held request -> its event id
	release := make(chan struct{})
	hook := testkit.NewHook(t, testkit.HookOptions{EventIDHeader: outbox.HeaderEventID, SignatureHeader: outbox.HeaderSignature,
		Respond: func(n int, _ http.ResponseWriter, r *http.Request) {
			if n <= 10 {
				return
			}
			_, port, _ := strings.Cut(r.RemoteAddr, ":")
			p, _ := strconv.Atoi(port)
			mu.Lock()
			inFlight[p] = r.Header.Get(outbox.HeaderEventID)
			mu.Unlock()
			select { // shorter than the senders' timeout: a held request is never a failed one
			case <-release:
			case <-r.Context().Done():
			case <-time.After(1500 * time.Millisecond):
			}
			mu.Lock()
			delete(inFlight, p)
			mu.Unlock()
		}})
	heldFrom := func(p *proc) []string { // the events of the requests held from p
		ports := localPorts(t, p.pid())
		mu.Lock()
		defer mu.Unlock()
		var ids []string
		for port, id := range inFlight {
			if ports[port] {
				ids = append(ids, id)
			}
		}
		return ids
	}
	r := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":"Relays","webhook_url":%q}`, hook.URL))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	m := merchant{ID: r.json(t)["id"].(string), APIKey: r.json(t)["api_key"].(string)}
	acct := s.account(m, "TRY", "1000.00")

	const n = 40
	var ids []string
	var killedAt int
	var held []string // events relay1 was delivering when it died
	for i := range n {
		// A loaded machine may answer 202 before the sync wait ends: the client polls with its key.
		answers, problem := s.payUntilCreated(0, m, fmt.Sprintf("relayed-%02d", i), payBody(fmt.Sprintf("inv-relayed-%02d", i), "1.00", "TRY", acct), time.Now().Add(time.Minute))
		require.Empty(t, problem)
		r := answers[len(answers)-1]
		ids = append(ids, r.json(t)["id"].(string))
		if killedAt == 0 && work(0, published) > 0 {
			held = heldFrom(relays[0])
		}
		if killedAt == 0 && len(held) > 0 {
			// In the middle of the stream, having published and consumed some of it.
			t.Logf("relay1 before the kill: %v published, %v consumed, %v delivery attempts, %d held at the merchant",
				work(0, published), work(0, consumed), work(0, attempted), len(held))
			relays[0].kill()
			killedAt = i
			close(release)
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NotZero(t, killedAt, "relay1 never published and held a delivery before the stream ended")
	killed := time.Now()

	// The events are the outbox's rows: one per payment here, all succeeded.
	events := map[string]string{} // event id -> payment id
	pg := connect(t, s.dbURL)
	rows, err := pg.Query(ctx, `SELECT id::text, aggregate_id::text FROM outbox`)
	require.NoError(t, err)
	for rows.Next() {
		var id, agg string
		require.NoError(t, rows.Scan(&id, &agg))
		events[id] = agg
	}
	require.NoError(t, rows.Err())
	require.Len(t, events, n, "one event per payment")

	bodies := map[string][]string{} // event id -> every body delivered for it
	require.Eventually(t, func() bool {
		clear(bodies)
		for _, req := range hook.Requests() {
			bodies[req.EventID] = append(bodies[req.EventID], string(req.Body))
		}
		if len(bodies) < len(events) {
			return false
		}
		for _, id := range held {
			if len(bodies[id]) < 2 {
				return false
			}
		}
		return true
	}, 90*time.Second, 100*time.Millisecond, "every event is delivered after the kill, and what relay1 held again (its lease runs out)\n%s", testkit.Tail(relays[1].log, 20))
	time.Sleep(500 * time.Millisecond) // a late duplicate, if any, arrives too
	clear(bodies)
	for _, req := range hook.Requests() {
		bodies[req.EventID] = append(bodies[req.EventID], string(req.Body))
	}
	twice := 0
	for id, bs := range bodies {
		agg, ok := events[id]
		require.True(t, ok, "event %s delivered but not in the outbox", id)
		for _, b := range bs[1:] {
			require.Equal(t, bs[0], b, "event %s: a repeated delivery carries the same body", id)
		}
		if len(bs) > 1 {
			twice++
		}
		w := testkit.DecodeWebhook(t, []byte(bs[0]))
		require.Equal(t, id, w.ID)
		require.Equal(t, agg, w.Data.ID, "event %s is about its payment", id)
		require.Equal(t, "payment.succeeded", w.Type)
	}
	require.Len(t, bodies, len(events))
	got := slices.Sorted(slices.Values(ids))
	var announced []string
	for _, agg := range events {
		announced = append(announced, agg)
	}
	slices.Sort(announced)
	require.Equal(t, got, announced, "every payment announced")
	t.Logf("relay1 killed after payment %d; every event delivered %v later, %d of %d delivered more than once",
		killedAt, time.Since(killed).Round(100*time.Millisecond), twice, len(events))
	relays[1].requireRunning(t, "the surviving relay")
}
