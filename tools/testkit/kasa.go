package testkit

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// kasaDir holds the kasa binary of one test process: built at the first KasaBinary, removed by
// Main (or RemoveKasaBinary) once the tests ran.
var kasaDir string

var buildKasa = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kasa-test-bin-")
	if err != nil {
		return "", err
	}
	kasaDir = dir
	path := filepath.Join(dir, "kasa")
	_, err = devenv.Command{}.Run(context.Background(), "go", "build", "-o", path, "github.com/kasa-pay/kasa/cmd/kasa")
	return path, err
})

// KasaBinary is ./bin/kasa as make build makes it (every subcommand), built once per test
// process from the module's cmd/kasa, whatever the package's directory.
func KasaBinary(t testing.TB) string {
	t.Helper()
	path, err := buildKasa()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// RemoveKasaBinary removes what KasaBinary built; for a TestMain that does not use Main.
func RemoveKasaBinary() {
	if kasaDir != "" {
		_ = os.RemoveAll(kasaDir)
	}
}
