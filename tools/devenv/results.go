package devenv

import (
	"fmt"
	"os"
	"path/filepath"
)

// FreeBase is dir/stem, or dir/stem-2, -3... when a report of that name (stem.md) is there:
// a second run on a day keeps the first's report.
func FreeBase(dir, stem string) string {
	base := filepath.Join(dir, stem)
	for i := 2; ; i++ {
		if _, err := os.Stat(base + ".md"); err != nil {
			return base
		}
		base = filepath.Join(dir, fmt.Sprintf("%s-%d", stem, i))
	}
}
