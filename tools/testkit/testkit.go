// Package testkit is what kasa's integration tests share: the PostgreSQL database and Temporal
// dev server a test package starts once (Main, from TestMain; or Start, for one test), fixtures
// (a merchant with a funded account, a settled payment) and helpers (PostgreSQL client programs,
// a database of a test's own, log tails, free addresses).
//
// Missing infrastructure fails the tests loudly, with the fix in the message: nothing here skips.
package testkit

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/devenv"
)

// SecretKey encrypts the merchants' webhook secrets in every test database: one key for every
// package, so that packages pointed at one server (KASA_TEST_DATABASE_URL) read each other's rows.
var SecretKey = bytes.Repeat([]byte{7}, 32)

// SecretKeyHex is SecretKey as KASA_SECRET_KEY takes it, for kasa processes a test starts.
var SecretKeyHex = hex.EncodeToString(SecretKey)

// Options say what a test package uses besides PostgreSQL.
type Options struct {
	Temporal       bool // a Temporal dev server, and a client of it
	TemporalServer bool // a real multi-service Temporal Server too (Env.TemporalServerAddress)
}

// Env is the infrastructure of a test package: a migrated database with a store open on it and,
// when asked for, a Temporal dev server with a client.
type Env struct {
	DatabaseURL           string
	TemporalAddress       string
	TemporalServerAddress string // the real server's frontend, namespace "default"
	Store                 *store.Store
	Temporal              client.Client // nil without Options.Temporal
	stops                 []func()
}

// Main is a package's TestMain: it starts the infrastructure, hands it to setup (which keeps
// what the tests use in package variables), runs the tests, stops everything and exits.
func Main(m *testing.M, o Options, setup func(*Env)) {
	code := run(m, o, setup)
	RemoveKasaBinary()
	os.Exit(code)
}

func run(m *testing.M, o Options, setup func(*Env)) int {
	e, err := start(context.Background(), o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: cannot start the test infrastructure: %v\n", filepath.Base(os.Args[0]), err)
		return 1
	}
	defer e.stop()
	setup(e)
	return m.Run()
}

// Start is Main for one test: the infrastructure lives until the test ends.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	e, err := start(context.Background(), o)
	if err != nil {
		t.Fatalf("cannot start the test infrastructure: %v", err)
	}
	t.Cleanup(e.stop)
	return e
}

func start(ctx context.Context, o Options) (*Env, error) {
	infra, err := devenv.StartTestEnv(ctx, devenv.TestNeeds{Temporal: o.Temporal, TemporalServer: o.TemporalServer})
	if err != nil {
		return nil, err
	}
	e := &Env{DatabaseURL: infra.DatabaseURL, TemporalAddress: infra.TemporalAddress, TemporalServerAddress: infra.TemporalServerAddress, stops: []func(){infra.Stop}}
	if e.Store, err = store.Open(ctx, store.Options{URL: e.DatabaseURL, SecretKey: SecretKey, Migrate: true}); err != nil {
		e.stop()
		return nil, fmt.Errorf("database: %w", err)
	}
	e.stops = append(e.stops, e.Store.Close)
	if o.Temporal {
		if e.Temporal, err = client.Dial(client.Options{HostPort: e.TemporalAddress, Logger: QuietTemporalLogger()}); err != nil {
			e.stop()
			return nil, fmt.Errorf("temporal: %w", err)
		}
		e.stops = append(e.stops, e.Temporal.Close)
	}
	return e, nil
}

// stop closes the clients, then stops the servers.
func (e *Env) stop() {
	for _, stop := range slices.Backward(e.stops) {
		stop()
	}
}

// QuietTemporalLogger discards the Temporal SDK's logs, which tests do not read.
func QuietTemporalLogger() tlog.Logger {
	return tlog.NewStructuredLogger(slog.New(slog.DiscardHandler))
}
