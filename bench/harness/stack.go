package harness

import (
	"context"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
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
	dir     string   // the child's data directory
	cleanup []func() // run in reverse order by stop
}

// stop stops the child and removes its directory, unless keep (after a failed run, for a look).
func (s *stack) stop(keep bool) {
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
	if keep {
		progress("kept %s (its dev.log and temporal.log) for a look", s.dir)
	} else {
		_ = os.RemoveAll(s.dir)
	}
}

// startStack starts this binary's `kasa dev` in a temporary data directory on free ports
// (Temporal UI off, logs at warn) and waits until it is ready. The child gets none of the
// user's KASA_* settings (it must not touch their database or Temporal) but the Temporal CLI's
// path and what cfg passes on.
func startStack(ctx context.Context, cfg Config) (_ *stack, err error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kasa-bench-")
	if err != nil {
		return nil, err
	}
	s := &stack{dir: dir}
	defer func() {
		if err != nil {
			s.stop(false)
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
		fmt.Sprintf("KASA_DATABASE_MAX_CONNS=%d", cfg.MaxConns),
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
	// Stopping sends SIGTERM, and SIGKILL a minute later if the child is still running.
	stopCtx, stopChild := context.WithCancel(context.WithoutCancel(ctx))
	cmd := exec.CommandContext(stopCtx, bin, "dev")
	cmd.Env, cmd.Stdout, cmd.Stderr, cmd.WaitDelay = env, logFile, logFile, time.Minute
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	dieWithParent(cmd)
	var startErr error
	exited := make(chan struct{})
	go func() {
		// The parent-death signal follows the thread that started the child, and Go ends a
		// thread only when a goroutine locked to it returns: this one returns once the child has.
		runtime.LockOSThread()
		defer close(exited)
		if startErr = cmd.Start(); startErr == nil {
			_ = cmd.Wait()
		}
	}()
	s.cleanup = append(s.cleanup, func() { stopChild(); <-exited; logFile.Close() })
	progress("starting a throwaway kasa dev in %s", dir)

	// The child writes dev.json, which says where its servers are, once all of them run.
	var st struct {
		AdminToken      string `json:"admin_token"`
		SecretKey       string `json:"secret_key"`
		DatabaseURL     string `json:"database_url"`
		TemporalAddress string `json:"temporal_address"`
	}
	s.APIURL, s.SimURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	failed := func(why string) error {
		b, _ := os.ReadFile(logFile.Name())
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		return fmt.Errorf("kasa dev %s; its log:\n%s", why, strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
	for deadline := time.Now().Add(3 * time.Minute); !ready(filepath.Join(dir, "dev.json"), &st, s.APIURL); {
		select {
		case <-exited:
			if startErr != nil {
				return nil, startErr
			}
			return nil, failed("exited while starting")
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, failed("did not start within 3 minutes")
		}
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
	s.AdminToken, s.DatabaseURL, s.Verify, s.CPU = st.AdminToken, st.DatabaseURL, db.Verify, bench.StackCPU(cmd.Process.Pid)
	s.Preload = func(ctx context.Context, merchants []string, n int) error {
		_, err := preload(ctx, st.DatabaseURL, merchants, n, preloadChunk, func(done, total int) { progress("preloaded %d/%d", done, total) })
		return err
	}
	s.Settle = func(ctx context.Context) error { return settle(ctx, st.DatabaseURL) }
	return s, nil
}

// ready reads the child's dev.json into st, and asks its API's /readyz.
func ready(devJSON string, st any, apiURL string) bool {
	b, err := os.ReadFile(devJSON)
	if err != nil || json.Unmarshal(b, st) != nil {
		return false
	}
	r, err := http.Get(apiURL + "/readyz")
	if err != nil {
		return false
	}
	r.Body.Close()
	return r.StatusCode == http.StatusOK
}

// The harness reaches the measured database through psql alone: store stays the only package
// that speaks to PostgreSQL from Go.

//go:embed preload.sql
var preloadSQL []byte

//go:embed settle.sql
var settleSQL []byte

// preloadChunk is how many rows one preload transaction loads.
const preloadChunk = 100_000

// preload bulk-loads n failed payments with their completed idempotency records for the
// merchants (see preload.sql), in transactions of chunk rows, then settles the database. Row i's
// idempotency key is prefix+i.
func preload(ctx context.Context, dbURL string, merchants []string, n, chunk int, progress func(done, total int)) (prefix string, err error) {
	if len(merchants) == 0 {
		return "", errors.New("preload: no merchants")
	}
	prefix = fmt.Sprintf("preload-%08x-", rand.Uint32()) // repeated preloads never collide
	for first := 0; first < n; first += chunk {
		last := min(first+chunk, n)
		_, err := bench.PSQL(ctx, dbURL, preloadSQL, "-1", "-v", "merchants={"+strings.Join(merchants, ",")+"}",
			"-v", "prefix="+prefix, "-v", "first="+strconv.Itoa(first), "-v", "last="+strconv.Itoa(last))
		if err != nil {
			return prefix, fmt.Errorf("preload rows %d-%d: %w", first, last-1, err)
		}
		progress(last, n)
	}
	return prefix, settle(ctx, dbURL)
}

// settle runs settle.sql: the vacuum and checkpoint a bulk load leaves for later, done now.
func settle(ctx context.Context, dbURL string) error {
	if _, err := bench.PSQL(ctx, dbURL, settleSQL); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	return nil
}
