package harness

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/bench"
)

// `kasa bench --store-path` refuses a malformed merchant list, and a short run writes its
// report as markdown and JSON, correct.
func TestStorePathCommand(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{{"--store-path", "--merchants", "x"}, {"--store-path", "--merchants", "0"}, {"--store-path", "--nope"}} {
		require.ErrorIs(t, StorePath(ctx, args, Config{}), ErrUsage, "%v", args)
	}
	out := t.TempDir()
	require.NoError(t, StorePath(ctx, []string{"--store-path", "--out", out, "--duration", "1s", "--warmup", "300ms",
		"--concurrency", "2", "--merchants", "1,3", "--pgbench=false"}, Config{}))
	mds, err := filepath.Glob(filepath.Join(out, "*-store-path.md"))
	require.NoError(t, err)
	require.Len(t, mds, 1)
	md, err := os.ReadFile(mds[0])
	require.NoError(t, err)
	require.Contains(t, string(md), "| store path | 3 |")
	js, err := os.ReadFile(strings.TrimSuffix(mds[0], ".md") + ".json")
	require.NoError(t, err)
	var rep bench.StorePathReport
	require.NoError(t, json.Unmarshal(js, &rep))
	require.True(t, rep.Correct)
	require.Len(t, rep.Runs, 2)
	require.Positive(t, rep.Runs[0].Payments)
	require.Positive(t, rep.Ratios["one/3"])
}
