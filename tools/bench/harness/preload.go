package harness

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/kasa-pay/kasa/tools/bench"
)

//go:embed preload.sql
var preloadSQL []byte

// preloadChunk is how many rows one preload transaction loads.
const preloadChunk = 100_000

// preload bulk-loads n failed payments with their completed idempotency records for the merchants
// (preload.sql) in transactions of chunk rows, then settles the database. Row i's key is prefix+i.
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
	return prefix, bench.Settle(ctx, dbURL)
}
