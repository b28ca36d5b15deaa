package worker

import (
	"context"
	"log/slog"
	"time"
)

// PolicyReportInterval is how often a running worker reports its charge policy; a report older
// than three of these no longer counts as a live worker's.
const PolicyReportInterval = 20 * time.Second

// ReportPolicy calls report (the store's record of this worker's charge policy) at once and then
// every interval until ctx ends: workers starting meanwhile check theirs against it, and imports
// wait out its booking window.
func ReportPolicy(ctx context.Context, interval time.Duration, report func(context.Context) error, log *slog.Logger) {
	every(ctx, interval, func(ctx context.Context) {
		if err := report(ctx); err != nil && ctx.Err() == nil {
			log.Warn("report the worker's charge policy", "error", err)
		}
	})
}
