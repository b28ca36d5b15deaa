package testkit

import (
	"context"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// PGTool is the path of a PostgreSQL client program (createdb, psql...); the test fails with
// how to install it when there is none.
func PGTool(t testing.TB, name string) string {
	t.Helper()
	p, err := devenv.PostgresTool(name)
	require.NoError(t, err)
	return p
}

// OwnDatabase creates an empty database of the test's own on the package's PostgreSQL server
// and returns its URL; it is dropped when the test ends. Whatever runs on it (a sweeper in a
// kasa process, Verify) sees only this test's rows.
func (e *Env) OwnDatabase(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(e.DatabaseURL)
	require.NoError(t, err)
	name := "test_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	args := []string{"-h", u.Hostname(), "-p", u.Port()}
	if user := u.User.Username(); user != "" {
		args = append(args, "-U", user)
	}
	_, err = devenv.Command{}.Run(context.Background(), PGTool(t, "createdb"), append(args, name)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		if _, err := (devenv.Command{}).Run(context.Background(), PGTool(t, "dropdb"), append(args, "--force", name)...); err != nil {
			t.Logf("dropdb %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}

// Tail is the last n lines of a log file, for a failure message; a file that cannot be read
// gives the reason instead.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// FreeAddr is a loopback address with a free port, for a server the test starts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	port, err := devenv.FreePort()
	require.NoError(t, err)
	return "127.0.0.1:" + strconv.Itoa(port)
}

// Runner is a loop (relay, consumer, sender...) that runs until its context is cancelled.
type Runner interface{ Run(context.Context) error }

// RunUntilEnd runs each runner in its own goroutine until the test ends; then it cancels them
// and fails the test if they have not all stopped within 20 s.
func RunUntilEnd(t testing.TB, runners ...Runner) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Go(func() { _ = r.Run(ctx) })
	}
	t.Cleanup(func() {
		cancel()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("the runners did not stop within 20s of their context's cancellation")
		}
	})
}
