package deploy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// make fuzz runs what make fuzz-targets lists: the list must hold every fuzz function in the
// repository, found here by parsing the test files rather than by the Makefile's grep.
func TestMakeFuzzListsEveryTarget(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	var want []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, name := range fuzzFuncs(f) {
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			want = append(want, "./"+rel+" "+name)
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, want)

	got := strings.Split(strings.TrimSpace(runMake(t, "-s", "fuzz-targets")), "\n")
	sort.Strings(want)
	sort.Strings(got)
	require.Equal(t, want, got, "make fuzz-targets (and so make fuzz) misses or invents a fuzz target")
}

// fuzzFuncs names the file's fuzz targets: top-level FuzzXxx(*testing.F) functions.
func fuzzFuncs(f *ast.File) []string {
	var names []string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Fuzz") || len(fn.Type.Params.List) != 1 {
			continue
		}
		star, ok := fn.Type.Params.List[0].Type.(*ast.StarExpr)
		if !ok {
			continue
		}
		if sel, ok := star.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "F" {
			names = append(names, fn.Name.Name)
		}
	}
	return names
}

// make test-fast runs the workflows package's tests, which start the Temporal dev server, and
// tools/devenv's, which start the real Temporal Server: on a fresh checkout it must build both
// first, as make test does.
func TestMakeTestFastBuildsWhatItsTestsStart(t *testing.T) {
	out := runMake(t, "-n", "test-fast", "BIN="+t.TempDir())
	for _, pkg := range []string{"github.com/temporalio/cli/cmd/temporal@", "go.temporal.io/server/cmd/server@", "go.temporal.io/server/cmd/tools/sql@"} {
		require.Contains(t, out, pkg, "make test-fast on a checkout without ./bin does not build what its tests start")
	}
}

// runMake runs make with args at the repository's root and returns what it printed.
func runMake(t *testing.T, args ...string) string {
	cmd := exec.Command("make", append([]string{"--no-print-directory"}, args...)...)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

// make help lists every target the README shows, and make size prints its ratio: both are
// commands the README names.
func TestMakeHelpAndSize(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	help := runMake(t, "help")
	targets := regexp.MustCompile("`make ([a-z-]+)`").FindAllStringSubmatch(string(readme), -1)
	require.NotEmpty(t, targets)
	for _, m := range targets {
		require.Regexp(t, `(?m)^\s+`+regexp.QuoteMeta(m[1])+`\s`, help, "make help does not list make %s", m[1])
	}
	require.Regexp(t, `^service \d+, tools \d+ \(tools/bench \d+\): tools / service = \d+\.\d\d\n$`, runMake(t, "-s", "size"))
}

// make fuzz runs every target and passes when they do: here one input each (FUZZTIME=1x).
func TestMakeFuzzRunsEveryTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every fuzz target")
	}
	out := runMake(t, "fuzz", "FUZZTIME=1x")
	for _, line := range strings.Split(strings.TrimSpace(runMake(t, "-s", "fuzz-targets")), "\n") {
		pkg, name, _ := strings.Cut(line, " ")
		require.Contains(t, out, "== "+pkg+" "+name+" (1x)", "make fuzz skipped %s", line)
	}
	require.NotContains(t, out, "fuzz targets that failed")
}
