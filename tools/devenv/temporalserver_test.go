package devenv_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

var (
	probeStatus   = temporal.NewSearchAttributeKeyKeyword("PaymentStatus")
	probeMerchant = temporal.NewSearchAttributeKeyKeyword("MerchantId")
)

func greet(_ context.Context, name string) (string, error) { return "hello " + name, nil }

// greetWorkflow marks itself in both search attributes, then runs one activity.
func greetWorkflow(ctx workflow.Context, name string) (string, error) {
	if err := workflow.UpsertTypedSearchAttributes(ctx, probeStatus.ValueSet("succeeded"), probeMerchant.ValueSet(name)); err != nil {
		return "", err
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second})
	var out string
	err := workflow.ExecuteActivity(ctx, "Greet", name).Get(ctx, &out)
	return out, err
}

// TestTemporalServerRunsWorkflows: on a fresh PostgreSQL the real server comes up with its
// databases, namespace and search attributes; a workflow with an activity runs to the end on an
// SDK worker and is found by a visibility query on its search attributes. After a stop, and after
// a kill, the server starts again on the same databases and still lists it.
func TestTemporalServerRunsWorkflows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tmp := t.TempDir()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(tmp, "pg"), Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })

	began := time.Now()
	opts := devenv.TemporalServerOptions{Dir: filepath.Join(tmp, "temporal"), Logger: slog.Default()}
	srv, err := devenv.StartTemporalServer(ctx, pg, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the server's log:\n%s", testkit.Tail(srv.LogPath(), 30))
		}
		_ = srv.Stop()
	})
	t.Logf("fresh start to ready (databases, schemas, server, namespace): %v, RSS %d MB", time.Since(began).Round(time.Millisecond), rssMB(t, srv.PID()))

	// The server ignores unknown dynamic config keys with a warning: every key kasa sets is one it has.
	server, _, err := devenv.FindTemporalServer()
	require.NoError(t, err)
	out, err := exec.Command(server, "validate-dynamic-config", filepath.Join(opts.Dir, "config", "dynamicconfig.yaml")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotRegexp(t, "warning|error", string(out))

	c, err := client.Dial(client.Options{HostPort: srv.Address(), Namespace: srv.Namespace()})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })

	merchant := "m-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	runWorkflow := func(t *testing.T) {
		queue := "devenv-" + merchant
		w := worker.New(c, queue, worker.Options{})
		w.RegisterWorkflowWithOptions(greetWorkflow, workflow.RegisterOptions{Name: "Greet"})
		w.RegisterActivityWithOptions(greet, activity.RegisterOptions{Name: "Greet"})
		require.NoError(t, w.Start())
		defer w.Stop()
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "greet-" + merchant, TaskQueue: queue}, "Greet", merchant)
		require.NoError(t, err)
		var out string
		require.NoError(t, run.Get(ctx, &out))
		require.Equal(t, "hello "+merchant, out)
	}
	listed := func(t *testing.T) {
		query := fmt.Sprintf("PaymentStatus = 'succeeded' AND MerchantId = '%s'", merchant)
		require.Eventually(t, func() bool {
			resp, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: srv.Namespace(), Query: query})
			return err == nil && len(resp.Executions) == 1 &&
				resp.Executions[0].Status == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED &&
				resp.Executions[0].Execution.WorkflowId == "greet-"+merchant
		}, 10*time.Second, 100*time.Millisecond, "the completed workflow listed by its search attributes")
	}
	t.Run("refuses a live directory", func(t *testing.T) {
		// A server left running (its parent killed) would share the databases with a new one.
		_, err := devenv.StartTemporalServer(ctx, pg, opts)
		require.ErrorContains(t, err, fmt.Sprintf("Temporal Server (pid %d) is already running on %s", srv.PID(), opts.Dir))
	})

	t.Run("workflow", func(t *testing.T) {
		ran := time.Now()
		runWorkflow(t)
		t.Logf("first workflow with an activity: %v", time.Since(ran).Round(time.Millisecond))
		listed(t)
	})

	t.Run("restart after stop", func(t *testing.T) {
		require.NoError(t, srv.Stop())
		began := time.Now()
		require.NoError(t, srv.Restart(ctx))
		t.Logf("restart after stop to ready: %v", time.Since(began).Round(time.Millisecond))
		listed(t)
	})

	t.Run("restart after crash", func(t *testing.T) {
		require.NoError(t, srv.Crash())
		began := time.Now()
		require.NoError(t, srv.Restart(ctx))
		t.Logf("restart after a kill to ready: %v", time.Since(began).Round(time.Millisecond))
		listed(t)
	})

	t.Run("new server on the same databases", func(t *testing.T) {
		require.NoError(t, srv.Stop())
		began := time.Now()
		again, err := devenv.StartTemporalServer(ctx, pg, opts)
		require.NoError(t, err)
		srv = again
		took := time.Since(began)
		t.Logf("new start on set-up databases to ready: %v, RSS %d MB", took.Round(time.Millisecond), rssMB(t, srv.PID()))
		// Its services listen on other ports than the last server's, which must not be waited for.
		require.Less(t, took, 20*time.Second, "a new server does not wait for the stopped one's members")
		c.Close()
		c, err = client.Dial(client.Options{HostPort: srv.Address(), Namespace: srv.Namespace()})
		require.NoError(t, err)
		listed(t)
		runWorkflow(t)
		t.Logf("RSS after two workflows and four starts: %d MB", rssMB(t, srv.PID()))
	})
}

// rssMB is a process's resident set size in MB.
func rssMB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			require.NoError(t, err)
			return kb / 1024
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

// TestTemporalServerVersionMatchesMakefile: the schemas devenv reads are those of the version the
// Makefile builds.
func TestTemporalServerVersionMatchesMakefile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^TEMPORAL_SERVER_VERSION := (\S+)$`).FindSubmatch(b)
	require.NotNil(t, m, "TEMPORAL_SERVER_VERSION in the Makefile")
	require.Equal(t, devenv.TemporalServerVersion, string(m[1]))
}

// A server its supervisor started again after a crash is still found by a new start on the same
// directory: it is the live server there, whatever pid the first start recorded.
func TestTemporalServerRestartedBySupervisorRefusesASecondStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tmp := t.TempDir()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(tmp, "pg"), Ephemeral: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	opts := devenv.TemporalServerOptions{Dir: filepath.Join(tmp, "temporal"), Logger: slog.Default(),
		Restart: &devenv.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Reset: time.Minute}}
	srv, err := devenv.StartTemporalServer(ctx, pg, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })

	first := srv.PID()
	require.NoError(t, syscall.Kill(first, syscall.SIGKILL))
	require.Eventually(t, func() bool { return srv.PID() != first }, 30*time.Second, 50*time.Millisecond, "started again")
	_, err = devenv.StartTemporalServer(ctx, pg, opts)
	require.ErrorContains(t, err, fmt.Sprintf("Temporal Server (pid %d) is already running on %s", srv.PID(), opts.Dir))
}
