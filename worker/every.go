package worker

import (
	"context"
	"time"
)

// every runs fn at once, then every interval, until ctx ends: the worker's periodic duties
// (the ledger check, idempotency-record retention) share this loop.
func every(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		fn(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
