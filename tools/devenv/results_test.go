package devenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A second report on a day gets a name of its own rather than writing over the first.
func TestFreeBaseKeepsEarlierReports(t *testing.T) {
	dir := t.TempDir()
	for _, want := range []string{"day", "day-2", "day-3"} {
		base := FreeBase(dir, "day")
		require.Equal(t, filepath.Join(dir, want), base)
		require.NoError(t, os.WriteFile(base+".md", nil, 0o644))
	}
}
