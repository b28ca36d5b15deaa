//go:build !production

package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"

	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/tools/bench/harness"
)

// runBench is `kasa bench`, which lives in tools/bench/harness.
func runBench(ctx context.Context, cfg config.Config, _ *slog.Logger) error {
	relaxGC()
	run := harness.Main
	if slices.Contains(os.Args[2:], "--store-path") { // kasa's store steps without Temporal
		run = harness.StorePath
	}
	err := run(ctx, os.Args[2:], harness.Config{
		Capability: cfg.Provider.Capability, MaxConns: cfg.Database.MaxConns, Gzip: cfg.Temporal.Gzip,
		Dial: func(ctx context.Context, address string) (client.Client, error) {
			// The SDK logs every ceiling worker's start and stop at info: not bench output.
			o, err := temporalOptions(cfg, newLogger("warn"))
			if err != nil {
				return nil, err
			}
			o.HostPort = address
			return client.DialContext(ctx, o)
		},
	})
	switch {
	case errors.Is(err, harness.ErrUsage):
		return exitError(2)
	case errors.Is(err, harness.ErrIncorrect):
		return exitError(1)
	}
	return err
}
