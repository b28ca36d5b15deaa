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
	cleanup []func() // run in reverse order by stop
	keep    bool     // a failed run keeps the child's data directory
}

func (s *stack) stop() {
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
}

// startStack starts this binary's `kasa dev` in a temporary data directory on free ports
// (Temporal UI off, logs at warn) and waits until it is ready. The child gets none of the
// user's KASA_* settings (it must not touch their database or Temporal) but the Temporal CLI's
// path and what cfg passes on.
func startStack(ctx context.Context, cfg Config, pprofAddr string) (_ *stack, err error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kasa-bench-")
	if err != nil {
		return nil, err
	}
	s := &stack{}
	s.cleanup = append(s.cleanup, func() {
		if s.keep {
			progress("kept %s (its dev.log and temporal.log) for a look", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	var ports [3]int
	for i := range ports {
		if ports[i], err = devenv.FreePort(); err != nil {
			return nil, err
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
		return nil, err
	}
	cmd := exec.Command(bin, "dev")
	cmd.Env, cmd.Stderr = env, logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	dieWithParent(cmd)
	exited, started := make(chan struct{}), make(chan error, 1)
	go func() {
		// The parent-death signal follows the thread that started the child, and Go ends a
		// thread only when a goroutine locked to it returns: this one returns once the child has.
		runtime.LockOSThread()
		defer close(exited)
		started <- cmd.Start()
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	s.cleanup = append(s.cleanup, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
	})
	progress("starting a throwaway kasa dev in %s", dir)
	banner := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Ctrl-C stops everything") {
				close(banner)
			}
		}
	}()
	logTail := func() string {
		b, _ := os.ReadFile(logFile.Name())
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		return strings.Join(lines[max(0, len(lines)-30):], "\n")
	}
	select {
	case <-banner:
	case <-exited:
		return nil, fmt.Errorf("kasa dev exited while starting; its log:\n%s", logTail())
	case <-time.After(3 * time.Minute):
		return nil, fmt.Errorf("kasa dev did not start within 3 minutes; its log:\n%s", logTail())
	case <-ctx.Done():
		return nil, ctx.Err()
	}

	// The child's dev.json says where its servers are.
	var st struct {
		AdminToken      string `json:"admin_token"`
		SecretKey       string `json:"secret_key"`
		DatabaseURL     string `json:"database_url"`
		TemporalAddress string `json:"temporal_address"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "dev.json"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		return nil, fmt.Errorf("read the child's dev.json: %w", err)
	}
	key, err := hex.DecodeString(st.SecretKey)
	if err != nil {
		return nil, fmt.Errorf("the child's secret key: %w", err)
	}
	db, err := store.Open(ctx, store.Options{URL: st.DatabaseURL, SecretKey: key})
	if err != nil {
		return nil, err
	}
	s.cleanup = append(s.cleanup, db.Close)
	if s.Temporal, err = cfg.Dial(ctx, st.TemporalAddress); err != nil {
		return nil, fmt.Errorf("temporal at %s: %w", st.TemporalAddress, err)
	}
	s.cleanup = append(s.cleanup, s.Temporal.Close)

	s.APIURL, s.SimURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	s.AdminToken, s.DatabaseURL, s.Verify, s.CPU = st.AdminToken, st.DatabaseURL, db.Verify, bench.StackCPU(cmd.Process.Pid)
	s.Preload = func(ctx context.Context, merchants []string, n int) error {
		started := time.Now()
		_, err := preload(ctx, st.DatabaseURL, merchants, n, preloadChunk, func(done, total int) { progress("preloaded %d/%d", done, total) })
		if err == nil {
			progress("preloaded %d payments in %s", n, time.Since(started).Round(time.Second))
		}
		return err
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
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if r, err := http.Get(s.APIURL + "/readyz"); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("%s/readyz never answered 200", s.APIURL)
		}
	}
}
