package devenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
)

// TemporalCLIVersion is the pinned CLI the Makefile installs into ./bin.
const TemporalCLIVersion = "v1.5.1"

// TemporalOptions say how to run the Temporal CLI dev server.
type TemporalOptions struct {
	Port      int    // frontend gRPC port; 0 picks a free one
	UIPort    int    // Web UI port; 0 runs headless
	DBFile    string // sqlite file for persistent state; empty keeps everything in memory
	Namespace string
	LogDir    string // the server's log goes to LogDir/temporal.log, appended; empty: discarded
	Logger    *slog.Logger
}

// Temporal is a running dev server that this process started and will stop. It is a Supervisor's
// child: when this process dies, the server is interrupted too.
type Temporal struct {
	Address string
	UIURL   string
	child   *Child
}

// RelaxedGOGC is the GOGC of the dev server (see StartTemporal), and of kasa dev and kasa bench,
// unless the environment sets one: four times the live heap between collections, not two.
const RelaxedGOGC = 400

// SearchAttributes are registered on every dev server: operators filter payments by them.
var SearchAttributes = []string{"PaymentStatus=Keyword", "MerchantId=Keyword", "PaymentSummary=Keyword"}

// SQLitePragmas are the dev server's SQLite settings when it keeps its state in a file. In WAL
// mode a commit is safe from a crash of the server's process whatever `synchronous` says; `off`
// risks the file only on an operating system crash or power loss, and saves the fsync at each
// checkpoint that every start waited behind. Production runs Temporal on a database of its own.
var SQLitePragmas = []string{"journal_mode=wal", "synchronous=off"}

// DynamicConfig is the dev server's tuning (`--dynamic-config-value KEY=VALUE`); the real server
// that devenv starts gets it too. Each value was measured on the payment path: docs/performance.md
// ("The Temporal dev server") has why and the figures.
var DynamicConfig = []string{
	// Else the CLI reads the cluster metadata from its one SQLite connection ~10 times a workflow.
	"system.forceSearchAttributesCacheRefreshOnRead=false",
	// The default (20 polls a second) delays every hop through the transfer queue.
	"history.transferProcessorMaxPollRPS=1000",
	// Most payments have closed when their start task is read: one visibility row, not two. A
	// payment shows in the Web UI's list up to 0.2 s later.
	"history.visibilityProcessorMaxPollRPS=5",
	"history.visibilityTaskBatchSize=1000",
	// A read's visibility writes no longer queue at once in front of the starts.
	"history.visibilityProcessorSchedulerWorkerCount=1",
	// One partition: with few pollers, several partitions left multi-second tails.
	"matching.numTaskqueueReadPartitions=1",
	"matching.numTaskqueueWritePartitions=1",
}

// StartTemporal starts the dev server with the latency settings measured on this machine
// (docs/performance.md) and waits until it answers.
func StartTemporal(ctx context.Context, o TemporalOptions) (*Temporal, error) {
	cli, err := FindTemporalCLI()
	if err != nil {
		return nil, err
	}
	if o.Port == 0 {
		if o.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	o.Namespace = cmp.Or(o.Namespace, "default")
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	addr := "127.0.0.1:" + strconv.Itoa(o.Port)
	t := &Temporal{Address: addr}
	args := []string{"server", "start-dev", "--ip", "127.0.0.1", "--port", strconv.Itoa(o.Port), "--namespace", o.Namespace,
		"--log-level", "warn", "--dynamic-config-value", "frontend.enableServerVersionCheck=false"}
	for _, kv := range DynamicConfig {
		args = append(args, "--dynamic-config-value", kv)
	}
	for _, sa := range SearchAttributes {
		args = append(args, "--search-attribute", sa)
	}
	// A server already on a port would answer for this one, which cannot bind it.
	addrs := []string{addr, "Temporal's port"}
	if o.UIPort != 0 {
		t.UIURL = "http://127.0.0.1:" + strconv.Itoa(o.UIPort)
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(o.UIPort), "the Temporal UI's port")
		args = append(args, "--ui-port", strconv.Itoa(o.UIPort))
	} else {
		args = append(args, "--headless")
	}
	if err := WaitAddrFree(ctx, addrs...); err != nil {
		return nil, err
	}
	if o.DBFile != "" {
		if err := os.MkdirAll(filepath.Dir(o.DBFile), 0o755); err != nil {
			return nil, err
		}
		args = append(args, "--db-filename", o.DBFile)
		for _, p := range SQLitePragmas {
			args = append(args, "--sqlite-pragma", p)
		}
	}
	sup := NewSupervisor(o.LogDir, o.Logger)
	sup.StopSignal = syscall.SIGINT // the CLI's Ctrl-C: a clean shutdown
	if t.child, err = sup.Start("temporal", relaxedEnv(), cli, args...); err != nil {
		return nil, fmt.Errorf("start temporal dev server: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = t.child.waitReady(ctx, "it answered at "+addr, func(ctx context.Context) error {
		c, err := client.DialContext(ctx, client.Options{HostPort: addr, Namespace: o.Namespace, Logger: log.NewStructuredLogger(o.Logger)})
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		t.child.Stop(10 * time.Second)
		return nil, fmt.Errorf("temporal dev server (%s): %w", cli, err)
	}
	return t, nil
}

// relaxedEnv is this process's environment with GOGC=RelaxedGOGC unless it sets one: a Temporal
// server's small live heap churns, and its frequent collections showed in the payments' p99.
func relaxedEnv() []string {
	env := os.Environ()
	if _, set := os.LookupEnv("GOGC"); !set {
		env = append(env, "GOGC="+strconv.Itoa(RelaxedGOGC))
	}
	return env
}

// Stop interrupts the dev server and waits for it to exit; it is killed after 30 seconds.
func (t *Temporal) Stop() error { return t.child.stopClean(30 * time.Second) }

// Crash kills the dev server (SIGKILL), as a crash would, and waits until it is gone.
func (t *Temporal) Crash() error { return t.child.Kill() }

// Process is the dev server's process, for a launcher that watches it.
func (t *Temporal) Process() *Child { return t.child }

// StartUI runs the Temporal Web UI server (bin/temporal-ui) on 127.0.0.1:port, pointed at the
// frontend at address, with its configuration under dir.
func StartUI(ctx context.Context, sup *Supervisor, bin, dir, address, namespace string, port int) (*Child, error) {
	if err := os.MkdirAll(filepath.Join(dir, "config"), 0o755); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`# Written by kasa at each start: edits are lost.
temporalGrpcAddress: %s
host: 127.0.0.1
port: %d
enableUi: true
defaultNamespace: %s
cors:
  cookieInsecure: true
`, address, port, namespace)
	if err := os.WriteFile(filepath.Join(dir, "config", "base.yaml"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	return sup.startServing(ctx, "temporal-ui", fmt.Sprintf("http://127.0.0.1:%d/", port), bin,
		"--root", dir, "--config", "config", "--env", "kasa", "start")
}

// FindTemporalCLI looks for the pinned CLI: $KASA_TEMPORAL_CLI, ./bin/temporal in the repository,
// bin/temporal beside the running executable, then PATH.
func FindTemporalCLI() (string, error) {
	if p := cmp.Or(os.Getenv("KASA_TEMPORAL_CLI"), findBin("temporal")); p != "" {
		return p, nil
	}
	return "", errors.New("temporal CLI not found: run `make temporal-cli` (go install " +
		"github.com/temporalio/cli/cmd/temporal@" + TemporalCLIVersion + " into ./bin), set KASA_TEMPORAL_CLI, " +
		"or point KASA_TEMPORAL_ADDRESS at a running server")
}
