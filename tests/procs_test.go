package tests

// Process helpers for the crash tests: the kasa binary built once, kasa processes started and
// SIGKILLed for real, a database of their own per test, and two fault-injecting proxies.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// kasaBinary returns a kasa executable under dir (a hard link to the package's build), so that
// every process a test starts has dir in its command line and processesMentioning(dir) finds it.
func kasaBinary(t *testing.T, dir string) string {
	t.Helper()
	shared := testkit.KasaBinary(t)
	// Not dir/kasa: the processes run in dir, and config.Load would read a file named "kasa" in
	// the working directory as its YAML configuration (see the report of the crash tests).
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	bin := filepath.Join(dir, "bin", "kasa")
	if _, err := os.Stat(bin); err == nil {
		return bin // a second run on the same directory: the same link (rewriting it would write the shared build)
	}
	if err := os.Link(shared, bin); err != nil {
		b, err := os.ReadFile(shared)
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

var processesMentioning, pidsMentioning = devenv.ProcessesMentioning, devenv.PIDsMentioning

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

// proc is one running kasa process, started by the tools' process layer (devenv.Supervisor).
type proc struct {
	t    *testing.T
	name string
	c    *devenv.Child
	log  string
	from int64 // where this process's part of the log begins
}

// startProc runs `bin args...` in dir with env, logging to dir/<name>.log (appended across restarts).
func startProc(t *testing.T, dir, bin, name string, env []string, args ...string) *proc {
	t.Helper()
	return startProcIn(t, dir, dir, bin, name, env, args...)
}

// startProcIn is startProc with the process's working directory apart: "" runs it in the
// test's own, inside the repository, where kasa dev and kasa cluster find the tools of ./bin.
func startProcIn(t *testing.T, workDir, dir, bin, name string, env []string, args ...string) *proc {
	t.Helper()
	s := devenv.NewSupervisor(dir, nil)
	s.WorkDir = workDir
	var from int64
	if st, err := os.Stat(filepath.Join(dir, name+".log")); err == nil {
		from = st.Size()
	}
	c, err := s.Start(name, env, bin, args...)
	require.NoError(t, err)
	p := &proc{t: t, name: name, c: c, log: c.LogPath, from: from}
	t.Cleanup(func() {
		p.terminate()
		if t.Failed() {
			t.Logf("---- %s log (tail) ----\n%s", name, testkit.Tail(p.log, 40))
		}
	})
	return p
}

// pid is the process id of the process.
func (p *proc) pid() int { return p.c.PID() }

// requireRunning fails the test when the process has exited, with its exit error and log.
func (p *proc) requireRunning(t *testing.T, what string) {
	t.Helper()
	if p.exited() {
		t.Fatalf("%s: %s exited: %v\n%s", what, p.name, p.c.Err(), testkit.Tail(p.log, 30))
	}
}

// waitHTTP waits until url answers 200, failing at once if the process died.
func (p *proc) waitHTTP(url string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(p.t, devenv.WaitHTTP(ctx, url, p.c))
}

func (p *proc) exited() bool { return !p.c.Running() }

// kill SIGKILLs the process and waits until it is gone: no deferred function, no graceful
// shutdown, no flushed buffer.
func (p *proc) kill() {
	p.t.Helper()
	p.requireRunning(p.t, "before the kill")
	require.NoError(p.t, p.c.Kill())
	var exit *exec.ExitError
	require.ErrorAs(p.t, p.c.Err(), &exit)
	ws := exit.Sys().(syscall.WaitStatus)
	require.True(p.t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%s: %v", p.name, p.c.Err())
}

// stopCleanly sends SIGTERM and requires the process to exit 0 within the time given.
func (p *proc) stopCleanly(within time.Duration) {
	p.t.Helper()
	require.NoError(p.t, syscall.Kill(p.pid(), syscall.SIGTERM))
	select {
	case <-p.c.Done():
	case <-time.After(within):
		p.t.Fatalf("%s did not stop within %s of SIGTERM\n%s", p.name, within, testkit.Tail(p.log, 30))
	}
	require.NoError(p.t, p.c.Err(), "%s must exit cleanly on SIGTERM\n%s", p.name, testkit.Tail(p.log, 30))
}

// terminate stops the process gracefully (SIGTERM), killing it after 15s.
func (p *proc) terminate() { p.c.Stop(15 * time.Second) }

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
	held   atomic.Pointer[heldAnswers]
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
		go func() { p.answer(c, d); c.Close() }()
	}
}

// answer copies what the target sends to the client; a chunk with the held marker in it waits
// for release.
func (p *tcpProxy) answer(c, d net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := d.Read(buf)
		if n > 0 {
			if h := p.held.Load(); h != nil && bytes.Contains(buf[:n], h.marker) {
				<-h.release
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// holdAnswers keeps every answer of the target that carries marker until release: the
// statement it answers has run (and committed) at the server while its client has not heard it.
func (p *tcpProxy) holdAnswers(marker string) {
	p.held.Store(&heldAnswers{marker: []byte(marker), release: make(chan struct{})})
}

// release passes on the answers held, and stops holding.
func (p *tcpProxy) release() {
	if h := p.held.Swap(nil); h != nil {
		close(h.release)
	}
}

// heldAnswers is what a tcpProxy holds: answers carrying marker, until release is closed.
type heldAnswers struct {
	marker  []byte
	release chan struct{}
}

func (p *tcpProxy) cut() {
	p.release()
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
	path    string        // the POST whose answers are swallowed; empty: /v1/charges; "*/x": paths ending in /x
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
	matches := r.URL.Path == path
	if suffix, ok := strings.CutPrefix(path, "*"); ok { // "*/capture": any authorization's capture
		matches = strings.HasSuffix(r.URL.Path, suffix)
	}
	swallow := r.Method == http.MethodPost && matches && p.swallow.Add(-1) >= 0
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
