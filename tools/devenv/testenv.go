package devenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// TestEnv is the infrastructure one test package shares: a PostgreSQL database and a Temporal
// dev server, started once in TestMain. KASA_TEST_DATABASE_URL and KASA_TEST_TEMPORAL_ADDRESS
// point at existing servers instead.
type TestEnv struct {
	DatabaseURL     string
	TemporalAddress string
	// TemporalServerAddress is a real multi-service Temporal Server's frontend (namespace
	// "default"), on a PostgreSQL of its own; empty unless asked for.
	TemporalServerAddress string
	stops                 []func() error
	dir                   string
}

// TestNeeds says what a test package uses.
type TestNeeds struct{ Temporal, TemporalServer bool }

// StartTestEnv starts what is missing. Missing binaries are an error that says how to fix it:
// integration tests never skip.
func StartTestEnv(ctx context.Context, needs TestNeeds) (*TestEnv, error) {
	e := &TestEnv{
		DatabaseURL:           os.Getenv("KASA_TEST_DATABASE_URL"),
		TemporalAddress:       os.Getenv("KASA_TEST_TEMPORAL_ADDRESS"),
		TemporalServerAddress: os.Getenv("KASA_TEST_TEMPORAL_SERVER_ADDRESS"),
	}
	var err error
	if e.dir, err = os.MkdirTemp("", "kasa-test-"); err != nil {
		return nil, err
	}
	if e.DatabaseURL == "" {
		pg, err := StartPostgres(ctx, PostgresOptions{Dir: filepath.Join(e.dir, "pg"), Ephemeral: true})
		if err != nil {
			e.Stop()
			return nil, fmt.Errorf("%w (or set KASA_TEST_DATABASE_URL)", err)
		}
		e.DatabaseURL = pg.URL
		e.stops = append(e.stops, pg.Stop)
	}
	if needs.Temporal && e.TemporalAddress == "" {
		t, err := StartTemporal(ctx, TemporalOptions{})
		if err != nil {
			e.Stop()
			return nil, fmt.Errorf("%w (or set KASA_TEST_TEMPORAL_ADDRESS)", err)
		}
		e.TemporalAddress = t.Address
		e.stops = append(e.stops, t.Stop)
	}
	if needs.TemporalServer && e.TemporalServerAddress == "" {
		// On a PostgreSQL of its own, so that its load and its databases stay apart from the
		// application database the tests inspect.
		pg, err := StartPostgres(ctx, PostgresOptions{Dir: filepath.Join(e.dir, "temporal-pg"), Ephemeral: true})
		var ts *TemporalServer
		if err == nil {
			e.stops = append(e.stops, pg.Stop)
			ts, err = StartTemporalServer(ctx, pg, TemporalServerOptions{Dir: filepath.Join(e.dir, "temporal-server")})
		}
		if err != nil {
			e.Stop()
			return nil, fmt.Errorf("%w (or set KASA_TEST_TEMPORAL_SERVER_ADDRESS)", err)
		}
		e.TemporalServerAddress = ts.Address()
		e.stops = append(e.stops, ts.Stop)
	}
	return e, nil
}

// Stop stops whatever StartTestEnv started and removes its files.
func (e *TestEnv) Stop() {
	for i := len(e.stops) - 1; i >= 0; i-- {
		_ = e.stops[i]()
	}
	_ = os.RemoveAll(e.dir)
}
