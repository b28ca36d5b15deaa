package harness

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The harness reaches the measured database through psql alone: store stays the only package
// that speaks to PostgreSQL from Go.

//go:embed preload.sql
var preloadSQL []byte

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
		_, err := psql(ctx, dbURL, preloadSQL, "-1", "-v", "merchants={"+strings.Join(merchants, ",")+"}",
			"-v", "prefix="+prefix, "-v", "first="+strconv.Itoa(first), "-v", "last="+strconv.Itoa(last), "-f", "-")
		if err != nil {
			return prefix, fmt.Errorf("preload rows %d-%d: %w", first, last-1, err)
		}
		progress(last, n)
	}
	return prefix, settle(ctx, dbURL)
}

// settle does now what a bulk of writes leaves for later, so that it does not happen during
// whatever is measured next: autovacuum's pass with the planner statistics, and the checkpoint
// of their WAL (which needs superuser or pg_checkpoint; without it the server checkpoints in its
// own time).
func settle(ctx context.Context, dbURL string) error {
	if _, err := psql(ctx, dbURL, nil, "-c", "VACUUM (ANALYZE)"); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	_, _ = psql(ctx, dbURL, nil, "-c", "CHECKPOINT")
	return nil
}

// psql runs psql without ~/.psqlrc, stopping at the first error, with stdin when given.
func psql(ctx context.Context, dbURL string, stdin []byte, args ...string) (string, error) {
	bin, err := pgTool("psql")
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dbURL}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("psql: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// pgTool finds a PostgreSQL client program: on PATH, else in pg_config's bindir.
func pgTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found: install the PostgreSQL client programs or put $(pg_config --bindir) on PATH", name)
}
