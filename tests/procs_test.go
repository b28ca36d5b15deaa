package tests

// Process helpers for the crash tests: the kasa binary built once, kasa processes started and
// SIGKILLed for real, a database of their own per test, and two fault-injecting proxies.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// kasaBuild is the kasa binary shared by every test of the run: built once while any test uses
// it, removed when the last one is done.
var kasaBuild struct {
	sync.Mutex
	dir, path string
	users     int
}

// kasaBinary returns a kasa executable under dir (a hard link to the shared build), so that
// every process a test starts has dir in its command line and processesMentioning(dir) finds it.
func kasaBinary(t *testing.T, dir string) string {
	t.Helper()
	kasaBuild.Lock()
	defer kasaBuild.Unlock()
	if kasaBuild.path == "" {
		bdir, err := os.MkdirTemp("", "kasa-crash-bin-")
		require.NoError(t, err)
		path := filepath.Join(bdir, "kasa")
		out, err := exec.Command("go", "build", "-o", path, "../cmd/kasa").CombinedOutput()
		if err != nil {
			os.RemoveAll(bdir)
			t.Fatalf("go build ../cmd/kasa: %v\n%s", err, out)
		}
		kasaBuild.dir, kasaBuild.path = bdir, path
	}
	kasaBuild.users++
	t.Cleanup(func() {
		kasaBuild.Lock()
		defer kasaBuild.Unlock()
		if kasaBuild.users--; kasaBuild.users == 0 {
			os.RemoveAll(kasaBuild.dir)
			kasaBuild.dir, kasaBuild.path = "", ""
		}
	})
	// Not dir/kasa: the processes run in dir, and config.Load would read a file named "kasa" in
	// the working directory as its YAML configuration (see the report of the crash tests).
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	bin := filepath.Join(dir, "bin", "kasa")
	if err := os.Link(kasaBuild.path, bin); err != nil {
		b, err := os.ReadFile(kasaBuild.path)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(bin, b, 0o755))
	}
	return bin
}

// crashDir is a test's directory: every process the test starts mentions it, and none may be
// left running when the test ends.
func crashDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	// Registered first, so it runs after every other cleanup of the test has stopped its processes.
	t.Cleanup(func() {
		if left := processesMentioning(dir + "/"); len(left) > 0 {
			t.Errorf("processes of the test are still running:\n%s", strings.Join(left, "\n"))
			for _, pid := range pidsMentioning(dir + "/") {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return dir
}

// pidsMentioning lists the pids of live processes whose command line contains s.
func pidsMentioning(s string) []int {
	var pids []int
	for _, p := range processesMentioning(s) {
		if pid, err := strconv.Atoi(p[:strings.Index(p, ":")]); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// kasaEnv is the environment of a kasa process: ours only, never the developer's KASA_* settings.
func kasaEnv(vars map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KASA_") {
			out = append(out, kv)
		}
	}
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	return out
}

// proc is one running kasa process.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // set when done is closed
}

// startProc runs `bin args...` in dir with env, logging to dir/<name>.log (appended across restarts).
func startProc(t *testing.T, dir, bin, name string, env []string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(t, err)
	fmt.Fprintf(f, "---- %s: %s %s\n", time.Now().Format(time.RFC3339Nano), name, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, f, f
	require.NoError(t, cmd.Start())
	p := &proc{t: t, name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.terminate()
		if t.Failed() {
			t.Logf("---- %s log (tail) ----\n%s", name, testkit.Tail(logPath, 40))
		}
	})
	return p
}

// requireRunning fails the test when the process has exited, with its exit error and log (read
// only once it has exited: p.err is written by the goroutine that waits for it).
func (p *proc) requireRunning(t *testing.T, what string) {
	t.Helper()
	if p.exited() {
		t.Fatalf("%s: %s exited: %v\n%s", what, p.name, p.err, testkit.Tail(p.log, 30))
	}
}

// waitHTTP waits until url answers 200, failing at once if the process died.
func (p *proc) waitHTTP(url string) {
	p.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		p.requireRunning(p.t, "waiting for "+url)
		if r, err := httpCall("GET", url, "", ""); err == nil && r.Status == http.StatusOK {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.t.Fatalf("%s never answered 200\n%s", url, testkit.Tail(p.log, 30))
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill SIGKILLs the process and waits until it is gone: no deferred function, no graceful
// shutdown, no flushed buffer.
func (p *proc) kill() {
	p.t.Helper()
	p.requireRunning(p.t, "before the kill")
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Fatalf("%s did not die within 10s of SIGKILL", p.name)
	}
	var exit *exec.ExitError
	require.ErrorAs(p.t, p.err, &exit)
	ws := exit.Sys().(syscall.WaitStatus)
	require.True(p.t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%s: %v", p.name, p.err)
}

// terminate stops the process gracefully (SIGTERM), killing it after 15s.
func (p *proc) terminate() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// runKasa runs a one-shot kasa command and returns its combined output and exit code.
func runKasa(t *testing.T, dir, bin string, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode()
	}
	require.NoError(t, err, "%s", out)
	return string(out), 0
}

// openStore opens a store on a test's own database, for reading effects and verifying invariants.
func openStore(t *testing.T, dbURL string) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), store.Options{URL: dbURL, SecretKey: testkit.SecretKey, MaxConns: 4})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	return st
}

// tcpProxy forwards TCP connections to a target until cut: then it refuses new connections and
// drops the open ones, like a network partition.
type tcpProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cutOff bool
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &tcpProxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(p.cut)
	return p
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		d, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cutOff {
			p.mu.Unlock()
			c.Close()
			d.Close()
			return
		}
		p.conns = append(p.conns, c, d)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(d, c); d.Close() }()
		go func() { _, _ = io.Copy(c, d); c.Close() }()
	}
}

func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutOff = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// chargeProxy stands between the worker and the bank simulator. While armed, it forwards a charge
// to the bank (the money moves) but never passes the answer back: the caller is left waiting
// until it goes away, as when a worker dies after the bank acted and before it heard about it.
type chargeProxy struct {
	srv     *httptest.Server
	target  string
	swallow atomic.Int32  // charge answers still to swallow
	charged chan struct{} // one value per swallowed answer, once the bank has answered
	path    string        // the POST whose answers are swallowed; empty: /v1/charges
}

func newChargeProxy(t *testing.T, target string) *chargeProxy {
	t.Helper()
	p := &chargeProxy{target: target, charged: make(chan struct{}, 8)}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(func() { p.srv.CloseClientConnections(); p.srv.Close() })
	return p
}

func (p *chargeProxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	req, err := http.NewRequestWithContext(context.WithoutCancel(r.Context()), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	path := p.path
	if path == "" {
		path = "/v1/charges"
	}
	swallow := r.Method == http.MethodPost && r.URL.Path == path && p.swallow.Add(-1) >= 0
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if swallow {
		p.charged <- struct{}{}
		<-r.Context().Done() // the caller is gone: it never learns the outcome
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}
