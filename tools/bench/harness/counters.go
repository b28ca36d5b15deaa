package harness

import (
	"context"
	"net/url"
	"strings"
	"time"

	"github.com/kasa-pay/kasa/store/pgstats"
)

// measuredDatabases are kasa's database and the real Temporal Server's persistence and visibility.
var measuredDatabases = []string{"kasa", "temporal", "temporal_visibility"}

// databaseCounters reads what grows in the measured databases (pgstats.Server.Counters), and
// kasaBackends maps the server's backends to whether they serve dbURL's database, for StackCPU
// to tell kasa's part of PostgreSQL's CPU.
func databaseCounters(ctx context.Context, dbURL string) (count func(context.Context) (map[string]int64, error), kasaBackends func() map[int]bool, closeStats func(), err error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, nil, nil, err
	}
	srv, err := pgstats.Open(ctx, dbURL)
	if err != nil {
		return nil, nil, nil, err
	}
	kasaBackends = func() map[int]bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m, _ := srv.Backends(ctx, strings.TrimPrefix(u.Path, "/"))
		return m
	}
	count = func(ctx context.Context) (map[string]int64, error) { return srv.Counters(ctx, measuredDatabases) }
	return count, kasaBackends, srv.Close, nil
}
