package testkit

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// kasaBuild is the kasa binary of one test process: built at the first KasaBinary, removed by
// Main (or RemoveKasaBinary) once the tests ran.
var kasaBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// KasaBinary is ./bin/kasa as make build makes it (every subcommand), built once per test
// process from the module's cmd/kasa, whatever the package's directory.
func KasaBinary(t testing.TB) string {
	t.Helper()
	kasaBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "kasa-test-bin-")
		if err != nil {
			kasaBuild.err = err
			return
		}
		kasaBuild.dir = dir
		path := filepath.Join(dir, "kasa")
		if _, err := (devenv.Command{}).Run(context.Background(), "go", "build", "-o", path, "github.com/kasa-pay/kasa/cmd/kasa"); err != nil {
			kasaBuild.err = err
			return
		}
		kasaBuild.path = path
	})
	if kasaBuild.err != nil {
		t.Fatal(kasaBuild.err)
	}
	return kasaBuild.path
}

// RemoveKasaBinary removes what KasaBinary built; for a TestMain that does not use Main.
func RemoveKasaBinary() {
	if kasaBuild.dir != "" {
		_ = os.RemoveAll(kasaBuild.dir)
	}
}
