package tests

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// cluster is one `kasa cluster` run by a test, up to its banner.
type cluster struct {
	p      *proc
	data   string // its KASA_DATA_DIR
	banner string
	apis   []string // every API's URL, from the banner
	sim    string   // the simulator's URL
	state  devState // what it kept in cluster.json
}

// startCluster runs `kasa cluster` on free ports and waits for its banner; the test's end stops
// it and kills whatever of it is left.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	data, err := os.MkdirTemp("", "kasa-cluster-test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(data) })
	return startClusterIn(t, data, nil)
}

// startClusterIn is startCluster on the data directory given (a second run finds the first's
// data), with more settings.
func startClusterIn(t *testing.T, data string, settings map[string]string) *cluster {
	t.Helper()
	// Under data: every process of the cluster has data in its command line.
	bin := kasaBinary(t, data)
	var err error

	ports := make([]int, 2)
	for i := range ports {
		ports[i], err = devenv.FreePort()
		require.NoError(t, err)
	}
	api1 := fmt.Sprintf("127.0.0.1:%d", ports[0])
	c := &cluster{data: data, sim: fmt.Sprintf("http://127.0.0.1:%d", ports[1])}
	began := time.Now()
	vars := map[string]string{
		"KASA_DATA_DIR":     data,
		"KASA_API_ADDR":     api1,
		"KASA_BANKSIM_ADDR": strings.TrimPrefix(c.sim, "http://"),
	}
	maps.Copy(vars, settings)
	c.p = startProcIn(t, "", data, bin, "cluster", kasaEnv(vars), "cluster")
	t.Cleanup(func() {
		for _, pid := range pidsMentioning(data + "/") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	c.p.waitLog("curl -sS http", 4*time.Minute) // the banner's last line
	c.banner = c.logs()
	t.Logf("kasa cluster: banner after %s", time.Since(began).Round(time.Millisecond))

	// The banner names both APIs; each is ready by the time it is printed.
	for _, line := range strings.Split(c.banner, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "API" {
			c.apis = append(c.apis, f[2])
		}
	}
	require.Len(t, c.apis, 2, "%s", c.banner)
	require.Equal(t, "http://"+api1, c.apis[0], "the first API is on KASA_API_ADDR")
	b, err := os.ReadFile(filepath.Join(data, "cluster", "cluster.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &c.state))
	return c
}

// TestClusterRunsEveryProcessAsAChild is `make run-cluster`: `kasa cluster` starts PostgreSQL,
// the real Temporal Server, NATS and the kasa processes as its children; a payment made on one
// API and replayed on the other is one charge; SIGTERM ends it with status 0 and no child left.
func TestClusterRunsEveryProcessAsAChild(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	require.NotEqual(t, c.apis[0], c.apis[1])
	for _, a := range c.apis {
		r := httpDo(t, "GET", a+"/readyz", "", "")
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", a, r.Body)
	}

	require.Contains(t, c.banner, c.state.AdminToken)
	require.Contains(t, c.banner, c.state.DemoAPIKey)

	// Every child of kasa cluster, and theirs: none may outlive it.
	children := descendants(c.p.pid())
	require.GreaterOrEqual(t, len(children), 8, "postgres, temporal, nats, banksim, 2 workers, relay, 2 APIs")

	// A payment on API 1, replayed with the same key on API 2: one answer, one charge.
	body := payBody("cluster-inv-1", "100.00", "TRY", c.state.DemoAccountID)
	first := httpDo(t, "POST", c.apis[0]+"/v1/payments", c.state.DemoAPIKey, body, "Idempotency-Key", "cluster-1")
	// A loaded machine can outlast the sync wait (202), then the key is in use (409) until done.
	for deadline := time.Now().Add(60 * time.Second); first.Status != http.StatusCreated && time.Now().Before(deadline); {
		require.Contains(t, []int{http.StatusAccepted, http.StatusConflict}, first.Status, "%s", first.Body)
		time.Sleep(250 * time.Millisecond)
		first = httpDo(t, "POST", c.apis[0]+"/v1/payments", c.state.DemoAPIKey, body, "Idempotency-Key", "cluster-1")
	}
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	p := first.json(t)
	require.Equal(t, "succeeded", p["status"], "%s", first.Body)
	replay := httpDo(t, "POST", c.apis[1]+"/v1/payments", c.state.DemoAPIKey, body, "Idempotency-Key", "cluster-1")
	require.Equal(t, http.StatusCreated, replay.Status, "%s", replay.Body)
	require.JSONEq(t, string(first.Body), string(replay.Body), "the replay on the other API answers the same")
	n, _ := bankCharges(t, c.sim, p["id"].(string))
	require.Equal(t, 1, n, "one charge at the bank")

	// A manual payment authorized on API 2 and captured in part on API 1, with workers apart.
	r := httpDo(t, "POST", c.apis[1]+"/v1/payments", c.state.DemoAPIKey, manualBody("cluster-inv-2", "50.00", c.state.DemoAccountID),
		"Idempotency-Key", "cluster-2")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "requires_capture", r.json(t)["status"])
	r = httpDo(t, "POST", c.apis[0]+"/v1/payments/"+r.json(t)["id"].(string)+"/capture", c.state.DemoAPIKey, `{"amount":"20.00"}`,
		"Idempotency-Key", "cluster-2-capture", "Content-Type", "application/json")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "20.00", r.json(t)["amount_captured"])

	// The Web UI reads the cluster's visibility: the payment's workflow is listed there.
	ui := ""
	for _, line := range strings.Split(c.banner, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "Temporal" && f[1] == "UI" {
			ui = f[2]
		}
	}
	require.True(t, strings.HasPrefix(ui, "http://"), "the banner names the Web UI (make temporal-ui): %q", ui)
	listed := ui + "/api/v1/namespaces/default/workflows?query=" + url.QueryEscape("WorkflowType = 'PaymentWorkflow'")
	require.Eventually(t, func() bool {
		r, err := httpCall("GET", listed, "", "")
		return err == nil && r.Status == http.StatusOK && strings.Contains(string(r.Body), "cluster-1")
	}, 30*time.Second, 200*time.Millisecond, "the payment's workflow in the Web UI")

	c.stop(t, children)
}

// make run-cluster again on the same data with another KASA_PROVIDER_CAPABILITY (docs/operations.md:
// it honours it): the cluster owns its database, so its workers take the new money settings instead
// of refusing them as a deployment's worker would, and a payment then follows them.
func TestClusterRunAgainWithAnotherCapability(t *testing.T) {
	t.Parallel()
	data, err := os.MkdirTemp("", "kasa-cluster-test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(data) })
	first := startClusterIn(t, data, map[string]string{"KASA_PROVIDER_CAPABILITY": "idempotent"})
	first.stop(t, descendants(first.p.pid()))

	again := startClusterIn(t, data, map[string]string{"KASA_PROVIDER_CAPABILITY": "none"})
	require.Contains(t, again.banner, "capability none", "%s", again.banner)
	body := payBody("cluster-again-inv", "10.00", "TRY", again.state.DemoAccountID)
	r := httpDo(t, "POST", again.apis[0]+"/v1/payments", again.state.DemoAPIKey, body, "Idempotency-Key", "cluster-again")
	for deadline := time.Now().Add(60 * time.Second); r.Status != http.StatusCreated && time.Now().Before(deadline); {
		require.Contains(t, []int{http.StatusAccepted, http.StatusConflict}, r.Status, "%s", r.Body)
		time.Sleep(250 * time.Millisecond)
		r = httpDo(t, "POST", again.apis[0]+"/v1/payments", again.state.DemoAPIKey, body, "Idempotency-Key", "cluster-again")
	}
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	n, _ := bankCharges(t, again.sim, r.json(t)["id"].(string))
	require.Equal(t, 1, n, "one charge at the bank")
	again.stop(t, descendants(again.p.pid()))
}

// TestClusterRestartsAKilledProcess: SIGKILL of one worker and one API of a running cluster stops
// nothing else: payments keep succeeding through the other API, each charged once, and kasa
// cluster reports each death and starts the process again (a new pid, its port answering).
func TestClusterRestartsAKilledProcess(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	workerMetrics := regexp.MustCompile(`worker-1 (http://\S+/metrics)`).FindStringSubmatch(c.banner)
	require.NotNil(t, workerMetrics, "the banner names worker-1's metrics: %s", c.banner)

	// Payments one after another through API 1, for as long as the test runs the kills.
	var (
		mu   sync.Mutex
		ids  []string
		fail error
	)
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id, err := c.pay(c.apis[0], fmt.Sprintf("restart-%03d", i))
			mu.Lock()
			if err != nil {
				fail = err
			} else {
				ids = append(ids, id)
			}
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	progress := func() (int, error) { mu.Lock(); defer mu.Unlock(); return len(ids), fail }
	// at least n payments taken, or one failed
	paid := func(n int) bool { k, err := progress(); return err != nil || k >= n }
	require.Eventually(t, func() bool { return paid(2) }, 2*time.Minute, 100*time.Millisecond, "payments flow")
	before, err := progress()
	require.NoError(t, err)

	killed := map[string]int{"worker-1": c.pid(t, "worker-1"), "api-2": c.pid(t, "api-2")}
	for name, pid := range killed {
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL), name)
	}
	for name, pid := range killed {
		report := regexp.MustCompile(name + ` exited.* pid=` + strconv.Itoa(pid) + `.*signal: killed`)
		require.Eventually(t, func() bool { return report.MatchString(c.logs()) }, 30*time.Second,
			100*time.Millisecond, "kasa cluster reports %s's death", name)
		require.Eventually(t, func() bool {
			again := c.lastStart(name)
			return again != pid && alive(again) && slices.Contains(descendants(c.p.pid()), again)
		}, time.Minute, 100*time.Millisecond, "%s started again", name)
	}
	for _, url := range []string{c.apis[1] + "/readyz", workerMetrics[1]} {
		require.Eventually(t, func() bool {
			r, err := httpCall("GET", url, "", "")
			return err == nil && r.Status == http.StatusOK
		}, time.Minute, 200*time.Millisecond, "%s answers again", url)
	}
	require.Eventually(t, func() bool { return paid(before + 3) }, 2*time.Minute, 100*time.Millisecond,
		"payments go on through API 1")
	close(stop)
	<-done
	require.NoError(t, fail)
	again, err := c.pay(c.apis[1], "restart-api-2")
	require.NoError(t, err, "the restarted API takes payments")
	ids = append(ids, again)
	c.p.requireRunning(t, "after a child's death")

	for _, id := range ids {
		var p struct{ Status string }
		require.Eventually(t, func() bool {
			r, err := httpCall("GET", c.apis[0]+"/v1/payments/"+id, c.state.DemoAPIKey, "")
			return err == nil && r.Status == http.StatusOK && json.Unmarshal(r.Body, &p) == nil && p.Status != "processing"
		}, 2*time.Minute, 250*time.Millisecond, "payment %s finishes", id)
		require.Equal(t, "succeeded", p.Status, id)
		n, _ := bankCharges(t, c.sim, id)
		require.Equal(t, 1, n, "one charge at the bank: %s", id)
	}
	t.Logf("%d payments, %d of them after the kills", len(ids), len(ids)-before)
	c.stop(t, descendants(c.p.pid()))
}

// pay pays 1.00 TRY with key on api, retrying the same key through 503s, a key in use and lost
// connections (a process may be restarting) until the API takes it; it returns the payment's id.
func (c *cluster) pay(api, key string) (string, error) {
	body := payBody("inv-"+key, "1.00", "TRY", c.state.DemoAccountID)
	last := ""
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		r, err := httpCall("POST", api+"/v1/payments", c.state.DemoAPIKey, body, "Idempotency-Key", key)
		switch {
		case err != nil:
			last = err.Error()
		case r.Status == http.StatusCreated || r.Status == http.StatusAccepted:
			var p struct{ ID string }
			return p.ID, json.Unmarshal(r.Body, &p)
		case r.Status == http.StatusConflict || r.Status == http.StatusServiceUnavailable:
			last = fmt.Sprintf("%d %s", r.Status, r.Body)
		default:
			return "", fmt.Errorf("%s: %d %s", key, r.Status, r.Body)
		}
	}
	return "", fmt.Errorf("%s: not taken within 90s (last: %s)", key, last)
}

// pid is the process id of the named child, from kasa cluster's log.
func (c *cluster) pid(t *testing.T, name string) int {
	t.Helper()
	pid := c.lastStart(name)
	require.NotZero(t, pid, "kasa cluster logged no start of %s:\n%s", name, c.logs())
	return pid
}

// lastStart is the pid kasa cluster last logged starting the named child with; 0 for none.
func (c *cluster) lastStart(name string) int {
	m := regexp.MustCompile(`msg="started `+name+`" pid=(\d+)`).FindAllStringSubmatch(c.logs(), -1)
	if len(m) == 0 {
		return 0
	}
	pid, _ := strconv.Atoi(m[len(m)-1][1])
	return pid
}

// stop sends kasa cluster SIGTERM: it exits 0 and leaves none of children, nor any process of
// the cluster, behind.
func (c *cluster) stop(t *testing.T, children []int) {
	t.Helper()
	stopped := time.Now()
	c.p.stopCleanly(30 * time.Second)
	t.Logf("kasa cluster: stopped %s after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	for _, pid := range children {
		require.False(t, alive(pid), "child %d outlived kasa cluster", pid)
	}
	require.Empty(t, processesMentioning(c.data+"/"), "no process of the cluster may survive it")
}

// descendants lists the live processes under pid, children of children included.
func descendants(pid int) []int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after its closing parenthesis.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) >= 2 {
			parent[p], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// alive says whether pid is a live process (a zombie has exited).
func alive(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	return err == nil && !strings.Contains(string(stat), ") Z ")
}

// logs is what this kasa cluster wrote, its banner and its log (not an earlier run's).
func (c *cluster) logs() string {
	b, _ := os.ReadFile(c.p.log)
	return string(b[min(c.p.from, int64(len(b))):])
}

// PostgreSQL and the Temporal Server dying under a running cluster (SIGKILL) are reported and
// started again, as its other children are, and the cluster takes payments again.
func TestClusterRestartsItsPostgresAndTemporalServer(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	for _, name := range []string{"temporal-server", "postgres"} {
		pid := c.pid(t, name)
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL), name)
		report := regexp.MustCompile(name + ` exited.* pid=` + strconv.Itoa(pid) + `.*signal: killed`)
		require.Eventually(t, func() bool { return report.MatchString(c.logs()) }, 30*time.Second,
			100*time.Millisecond, "kasa cluster reports %s's death", name)
		_, err := c.pay(c.apis[0], "after-"+name)
		require.NoError(t, err, "payments are taken again after %s's restart", name)
	}
	c.p.requireRunning(t, "after its dependencies' deaths")
	c.stop(t, descendants(c.p.pid()))
}

// `kasa cluster` alone is SIGKILLed and started again at once on its data directory, as a
// supervisor would: every child of the first goes (they stop on their parent's death), and the
// new start waits for them, its Temporal Server's among them, rather than refusing the directory.
func TestClusterStartsAgainAtOnceAfterItAloneIsKilled(t *testing.T) {
	t.Parallel()
	first := startCluster(t)
	children := descendants(first.p.pid())
	require.GreaterOrEqual(t, len(children), 8, "postgres, temporal, nats, banksim, 2 workers, relay, 2 APIs")
	first.p.kill()

	again := startClusterIn(t, first.data, nil)
	for _, pid := range children {
		require.False(t, alive(pid), "child %d of the killed kasa cluster still runs", pid)
	}
	_, err := again.pay(again.apis[0], "after-launcher-kill")
	require.NoError(t, err)
	again.stop(t, descendants(again.p.pid()))
}

// A child that does not stop on SIGTERM (here: stopped by SIGSTOP) is killed after its grace
// period, and kasa cluster then exits non-zero, naming it.
func TestClusterExitsNonZeroWhenAChildIsKilledOnStop(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	require.NoError(t, syscall.Kill(c.pid(t, "banksim"), syscall.SIGSTOP))
	require.NoError(t, syscall.Kill(c.p.pid(), syscall.SIGTERM))
	select {
	case <-c.p.c.Done():
	case <-time.After(2 * time.Minute):
		t.Fatalf("kasa cluster did not stop\n%s", c.logs())
	}
	require.Error(t, c.p.c.Err(), "a non-zero exit\n%s", c.logs())
	require.Regexp(t, `banksim \(pid \d+\) did not stop within .*: killed`, c.logs())
	require.Empty(t, processesMentioning(c.data+"/"), "no process of the cluster may survive it")
}
