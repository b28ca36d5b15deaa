package harness

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/kasa-pay/kasa/bench"
	"github.com/kasa-pay/kasa/internal/devenv"
	"github.com/kasa-pay/kasa/store"
)

// stack is a throwaway `kasa dev` child and what the suite needs of it.
type stack struct {
	bench.Stack
	stop func()
	keep bool // a failed run keeps the child's data directory
}

// childState is what the child writes to its dev.json: where its servers are.
type childState struct {
	AdminToken      string `json:"admin_token"`
	SecretKey       string `json:"secret_key"`
	DatabaseURL     string `json:"database_url"`
	TemporalAddress string `json:"temporal_address"`
}

// startStack starts this binary's `kasa dev` in a temporary data directory on free ports
// (Temporal UI off, logs at warn) and waits until it is ready. The child gets none of the
// user's KASA_* settings (it must not touch their database or Temporal) but the Temporal CLI's
// path and what cfg passes on.
func startStack(ctx context.Context, cfg Config, pprofAddr string) (*stack, error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kasa-bench-")
	if err != nil {
		return nil, err
	}
	s := &stack{}
	var cleanup []func()
	s.stop = func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}
	cleanup = append(cleanup, func() {
		if s.keep {
			fmt.Fprintf(os.Stderr, "kasa bench: kept %s (its dev.log and temporal.log) for a look\n", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	fail := func(err error) (*stack, error) {
		s.stop()
		return nil, err
	}
	var ports [3]int
	for i := range ports {
		if ports[i], err = devenv.FreePort(); err != nil {
			return fail(err)
		}
	}
	env := []string{
		"KASA_DATA_DIR=" + dir, "KASA_LOG_LEVEL=warn", "KASA_TEMPORAL_UI_PORT=0",
		fmt.Sprintf("KASA_API_ADDR=127.0.0.1:%d", ports[0]), fmt.Sprintf("KASA_BANKSIM_ADDR=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("KASA_TEMPORAL_PORT=%d", ports[2]), "KASA_PROVIDER_CAPABILITY=" + cfg.Capability,
		fmt.Sprintf("KASA_DATABASE_MAX_CONNS=%d", cfg.MaxConns), "KASA_DEBUG_PPROF_ADDR=" + pprofAddr,
		fmt.Sprintf("KASA_TEMPORAL_GZIP=%t", cfg.Gzip), // the child's clients and the ceilings' client alike
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KASA_") || strings.HasPrefix(kv, "KASA_TEMPORAL_CLI=") {
			env = append(env, kv)
		}
	}
	logFile, err := os.Create(filepath.Join(dir, "dev.log"))
	if err != nil {
		return fail(err)
	}
	cmd := exec.Command(bin, "dev")
	cmd.Env, cmd.Stderr = env, logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	dieWithParent(cmd)
	exited, started := make(chan struct{}), make(chan error, 1)
	go func() {
		// The parent-death signal follows the thread that started the child, and Go ends a
		// thread only when a goroutine locked to it returns: this one returns once the child has.
		runtime.LockOSThread()
		defer close(exited)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return fail(err)
	}
	cleanup = append(cleanup, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
	})
	fmt.Fprintf(os.Stderr, "kasa bench: starting a throwaway kasa dev in %s\n", dir)
	banner := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Ctrl-C stops everything") {
				close(banner)
			}
		}
	}()
	select {
	case <-banner:
	case <-exited:
		return fail(fmt.Errorf("kasa dev exited while starting; its log:\n%s", tailFile(logFile.Name())))
	case <-time.After(3 * time.Minute):
		return fail(fmt.Errorf("kasa dev did not start within 3 minutes; its log:\n%s", tailFile(logFile.Name())))
	case <-ctx.Done():
		return fail(ctx.Err())
	}

	var st childState
	b, err := os.ReadFile(filepath.Join(dir, "dev.json"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		return fail(fmt.Errorf("read the child's dev.json: %w", err))
	}
	key, err := hex.DecodeString(st.SecretKey)
	if err != nil {
		return fail(fmt.Errorf("the child's secret key: %w", err))
	}
	db, err := store.Open(ctx, store.Options{URL: st.DatabaseURL, SecretKey: key})
	if err != nil {
		return fail(err)
	}
	cleanup = append(cleanup, db.Close)
	if s.Temporal, err = cfg.Dial(ctx, st.TemporalAddress); err != nil {
		return fail(fmt.Errorf("temporal at %s: %w", st.TemporalAddress, err))
	}
	cleanup = append(cleanup, s.Temporal.Close)

	s.APIURL, s.SimURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	s.AdminToken, s.DatabaseURL = st.AdminToken, st.DatabaseURL
	s.Verify = db.Verify
	s.Preload = func(ctx context.Context, merchants []string, n int) error {
		return preloadShown(ctx, st.DatabaseURL, merchants, n)
	}
	s.Sizes = func(ctx context.Context) ([]bench.TableSize, error) {
		ts, err := db.Sizes(ctx)
		out := make([]bench.TableSize, len(ts))
		for i, t := range ts {
			out[i] = bench.TableSize(t)
		}
		return out, err
	}
	s.Settle = func(ctx context.Context) error { return settle(ctx, st.DatabaseURL) }
	s.CPU = bench.StackCPU(cmd.Process.Pid)
	if err := waitReady(ctx, s.APIURL+"/readyz"); err != nil {
		return fail(err)
	}
	return s, nil
}

// preloadShown is preload with its progress redrawn in place on a terminal (nothing in between
// into a file) and its time reported.
func preloadShown(ctx context.Context, dbURL string, merchants []string, n int) error {
	started := time.Now()
	fi, err := os.Stderr.Stat()
	terminal := err == nil && fi.Mode()&os.ModeCharDevice != 0
	_, err = preload(ctx, dbURL, merchants, n, preloadChunk, func(done, total int) {
		if terminal {
			fmt.Fprintf(os.Stderr, "\rkasa bench: preloaded %d/%d", done, total)
		}
	})
	if terminal {
		fmt.Fprintln(os.Stderr)
	}
	if err == nil {
		fmt.Fprintf(os.Stderr, "kasa bench: preloaded %d payments in %s\n", n, time.Since(started).Round(time.Second))
	}
	return err
}

func waitReady(ctx context.Context, url string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if r, err := http.Get(url); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s never answered 200", url)
}

// tailFile is the last 30 lines of a file.
func tailFile(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}
