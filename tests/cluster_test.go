package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/internal/devenv"
)

// TestClusterRunsEveryProcessAsAChild is `make run-cluster`: `kasa cluster` starts PostgreSQL,
// the real Temporal Server, NATS and the kasa processes as its children; a payment made on one
// API and replayed on the other is one charge; SIGTERM ends it with status 0 and no child left.
func TestClusterRunsEveryProcessAsAChild(t *testing.T) {
	t.Parallel()
	data, err := os.MkdirTemp("", "kasa-cluster-test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(data) })
	// Under data: every process of the cluster has data in its command line.
	bin := kasaBinary(t, data)

	ports := make([]int, 2)
	for i := range ports {
		ports[i], err = devenv.FreePort()
		require.NoError(t, err)
	}
	api1 := fmt.Sprintf("127.0.0.1:%d", ports[0])
	sim := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	cmd := exec.Command(bin, "cluster")
	cmd.Env = kasaEnv(map[string]string{
		"KASA_DATA_DIR":     data,
		"KASA_API_ADDR":     api1,
		"KASA_BANKSIM_ADDR": strings.TrimPrefix(sim, "http://"),
	})
	var logs clusterLog
	cmd.Stderr = &logs
	pipe, err := cmd.StdoutPipe()
	require.NoError(t, err)
	began := time.Now()
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
			}
		}
		if left := processesMentioning(data + "/"); len(left) > 0 {
			for _, pid := range pidsMentioning(data + "/") {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	banner := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		var b strings.Builder
		for sc.Scan() {
			b.WriteString(sc.Text() + "\n")
			if strings.HasPrefix(strings.TrimSpace(sc.Text()), "curl -sS http") { // the banner's last line
				banner <- b.String()
			}
		}
	}()
	var text string
	select {
	case text = <-banner:
	case err := <-exited:
		t.Fatalf("kasa cluster exited before its banner: %v\n%s", err, logs.String())
	case <-time.After(4 * time.Minute):
		t.Fatalf("kasa cluster printed no banner within 4 minutes:\n%s", logs.String())
	}
	t.Logf("kasa cluster: banner after %s", time.Since(began).Round(time.Millisecond))

	// The banner names both APIs; each is ready by the time it is printed.
	var apis []string
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "API" {
			apis = append(apis, f[2])
		}
	}
	require.Len(t, apis, 2, "%s", text)
	require.Equal(t, "http://"+api1, apis[0], "the first API is on KASA_API_ADDR")
	require.NotEqual(t, apis[0], apis[1])
	for _, a := range apis {
		r := httpDo(t, "GET", a+"/readyz", "", "")
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", a, r.Body)
	}

	var st devState
	b, err := os.ReadFile(filepath.Join(data, "cluster", "cluster.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &st))
	require.Contains(t, text, st.AdminToken)
	require.Contains(t, text, st.DemoAPIKey)

	// Every child of kasa cluster, and theirs: none may outlive it.
	children := descendants(cmd.Process.Pid)
	require.GreaterOrEqual(t, len(children), 8, "postgres, temporal, nats, banksim, 2 workers, relay, 2 APIs")

	// A payment on API 1, replayed with the same key on API 2: one answer, one charge.
	body := payBody("cluster-inv-1", "100.00", "TRY", st.DemoAccountID)
	first := httpDo(t, "POST", apis[0]+"/v1/payments", st.DemoAPIKey, body, "Idempotency-Key", "cluster-1")
	// A loaded machine can outlast the sync wait (202), then the key is in use (409) until done.
	for deadline := time.Now().Add(60 * time.Second); first.Status != http.StatusCreated && time.Now().Before(deadline); {
		require.Contains(t, []int{http.StatusAccepted, http.StatusConflict}, first.Status, "%s", first.Body)
		time.Sleep(250 * time.Millisecond)
		first = httpDo(t, "POST", apis[0]+"/v1/payments", st.DemoAPIKey, body, "Idempotency-Key", "cluster-1")
	}
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	p := first.json(t)
	require.Equal(t, "succeeded", p["status"], "%s", first.Body)
	replay := httpDo(t, "POST", apis[1]+"/v1/payments", st.DemoAPIKey, body, "Idempotency-Key", "cluster-1")
	require.Equal(t, http.StatusCreated, replay.Status, "%s", replay.Body)
	require.JSONEq(t, string(first.Body), string(replay.Body), "the replay on the other API answers the same")
	charges := httpDo(t, "GET", sim+"/_sim/charges?reference="+p["id"].(string), "", "")
	require.Equal(t, http.StatusOK, charges.Status, "%s", charges.Body)
	require.EqualValues(t, 1, charges.json(t)["count"], "one charge at the bank: %s", charges.Body)

	// The Web UI reads the cluster's visibility: the payment's workflow is listed there.
	ui := ""
	for _, line := range strings.Split(text, "\n") {
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

	stopped := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "kasa cluster exits 0 on SIGTERM:\n%s", logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("kasa cluster did not stop within 30s of SIGTERM:\n%s", logs.String())
	}
	t.Logf("kasa cluster: stopped %s after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	for _, pid := range children {
		require.False(t, alive(pid), "child %d outlived kasa cluster", pid)
	}
	require.Empty(t, processesMentioning(data+"/"), "no process of the cluster may survive it")
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

// clusterLog is kasa cluster's stderr, written by exec's copier while the test reads it.
type clusterLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *clusterLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *clusterLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
