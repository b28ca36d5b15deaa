package tests

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/bench"
	"github.com/kasa-pay/kasa/tools/devenv"
)

// `kasa bench` measures a throwaway kasa dev of its own and checks its correctness: one run,
// then the suite `make bench` runs (tiny durations), with its files.
func TestBenchCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := kasaBinary(t, dir)
	cli, err := devenv.FindTemporalCLI()
	require.NoError(t, err)
	run := func(args ...string) (stdout, stderr string) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"bench"}, args...)...)
		cmd.Env = kasaEnv(map[string]string{"KASA_TEMPORAL_CLI": cli})
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		require.NoError(t, cmd.Run(), "kasa bench %v:\n%s", args, errOut.String())
		return out.String(), errOut.String()
	}

	_, help := run("-h")
	require.Contains(t, help, "-suite")
	require.Contains(t, help, "-preload")

	out, errOut := run("--duration", "2s", "--warmup", "1s", "--merchants", "3", "--payers", "2", "--concurrency", "4")
	require.Contains(t, out, "| payments | closed | 4 |")
	require.Contains(t, out, "201 succeeded")
	require.Contains(t, errOut, "correct: no double charge, kasa verify ok")

	results := filepath.Join(dir, "results")
	run("--suite", "--duration", "2s", "--warmup", "1s", "--merchants", "5", "--concurrency", "4", "--preload", "2000",
		"--out", results)

	files, err := filepath.Glob(filepath.Join(results, "*.json"))
	require.NoError(t, err)
	require.Len(t, files, 1)
	b, err := os.ReadFile(files[0])
	require.NoError(t, err)
	var rep bench.Report
	require.NoError(t, json.Unmarshal(b, &rep))
	require.True(t, rep.Correct, "no double charge, no invariant violation")
	require.Equal(t, "idempotent", rep.Capability, "the measured kasa's provider capability")
	require.Zero(t, rep.Doubles)
	require.Positive(t, rep.Checked)
	names := map[string]bench.Result{}
	for _, r := range rep.Runs {
		names[strings.SplitN(r.Path, " (", 2)[0]] = r
	}
	for _, n := range []string{bench.RunHTTP + " #1", bench.RunTOwn + " #1", bench.RunTLean + " #2", bench.RunSpread + " #1", bench.RunSpread + " #2", bench.RunHot + " #1", bench.RunReplay + " #2",
		bench.RunOpenHalf, bench.RunReplayLarge + " #1", bench.RunSpreadLarge + " #2", bench.RunTLarge + " #1", bench.RunTLarge + " #2", bench.RunHLarge + " #1", bench.RunHLarge + " #2", bench.RunHTTP + " #2"} {
		require.Contains(t, names, n)
		require.Positive(t, names[n].Requests, n)
		require.NotNil(t, names[n].CPU, "every suite run reports its CPU: %s", n)
	}
	// What a payment run's window cost in CPU, found in each of the stack's processes.
	spread := names[bench.RunSpread+" #1"]
	require.Equal(t, "new payment", spread.CPU.Per)
	for _, class := range []string{bench.ClassKasa, bench.ClassPostgres, bench.ClassTemporal} {
		require.Positive(t, spread.CPU.MS[class], class)
	}
	require.Positive(t, rep.PGBench["payment"].TPS)
	require.Positive(t, rep.PGBench["replay"].TPS)
	require.Len(t, rep.Targets, 7)
	for _, tg := range rep.Targets {
		require.Positive(t, tg.Value, tg.Name)
	}
	text, err := os.ReadFile(strings.TrimSuffix(files[0], ".json") + ".md")
	require.NoError(t, err)
	require.Contains(t, string(text), "| 3 one hot merchant vs many |")
	require.Contains(t, string(text), "Provider capability: idempotent. kasa's workflow shape")
	require.Regexp(t, `\| [0-9]+ \| new payment \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|`, string(text), "the CPU of a payment run, by process class")
	require.Regexp(t, `\| [0-9]+ \| workflow \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|`, string(text), "the CPU of a T run")
}

// A kasa bench killed outright (SIGKILL, or SIGPIPE when its output is piped into head) takes its
// throwaway kasa dev with it, and so that one's PostgreSQL and Temporal.
func TestBenchKilledLeavesNothingRunning(t *testing.T) {
	t.Parallel()
	dir := crashDir(t)
	bin := kasaBinary(t, dir)
	cli, err := devenv.FindTemporalCLI()
	require.NoError(t, err)
	tmp := filepath.Join(dir, "tmp") // the stack's directory, so its PostgreSQL and Temporal mention dir
	require.NoError(t, os.MkdirAll(tmp, 0o755))

	cmd := exec.Command(bin, "bench", "--duration", "5m", "--warmup", "0s", "--merchants", "1", "--payers", "1", "--concurrency", "1")
	cmd.Env = append(kasaEnv(map[string]string{"KASA_TEMPORAL_CLI": cli}), "TMPDIR="+tmp)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	loading := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			if !once && strings.Contains(sc.Text(), "setting up") { // the stack is up
				once = true
				close(loading)
			}
		}
	}()
	select {
	case <-loading:
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("kasa bench's stack did not start within 3 minutes")
	}
	running := processesMentioning(dir + "/")
	require.GreaterOrEqual(t, len(running), 3, "kasa bench, its kasa dev, PostgreSQL and Temporal: %v", running)

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	require.Eventually(t, func() bool { return len(processesMentioning(dir+"/")) == 0 }, 90*time.Second, 200*time.Millisecond,
		"left running after kasa bench was killed: %v", processesMentioning(dir+"/"))
}

// When its kasa dev cannot start, kasa bench fails with that kasa dev's own reason.
func TestBenchShowsWhyItsStackDidNotStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := kasaBinary(t, dir)
	missing := filepath.Join(dir, "no-such-temporal")

	cmd := exec.Command(bin, "bench", "--duration", "1s", "--warmup", "0s", "--merchants", "1")
	cmd.Env = append(kasaEnv(map[string]string{"KASA_TEMPORAL_CLI": missing}), "TMPDIR="+dir)
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "kasa dev exited while starting")
	require.Contains(t, string(out), missing, "the child's log names what it could not start")
	left, err := filepath.Glob(filepath.Join(dir, "kasa-bench-*"))
	require.NoError(t, err)
	require.Empty(t, left, "the failed stack's directory is removed")
}
