package devenv

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	commandpb "go.temporal.io/api/command/v1"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TemporalServerVersion is the pinned Temporal Server the Makefile builds into ./bin
// (temporal-server and temporal-sql-tool); its schemas come from the same module version.
const TemporalServerVersion = "v1.29.1"

// TemporalServerOptions say how to run a real, multi-service Temporal Server on a devenv
// PostgreSQL. Only Dir is required.
type TemporalServerOptions struct {
	// Dir holds the generated configuration and the server's log; created when missing. The
	// server's state lives in PostgreSQL, so a start on the same cluster finds it again.
	Dir string
	// Port is the frontend's gRPC port; 0 picks a free one. The other services' ports are always
	// picked free: only the frontend is reached from outside.
	Port int
	// Namespace is registered when missing; default "default".
	Namespace string
	// HistoryShards is fixed when the databases are first set up (default 4): a later start with
	// another number is refused by the server.
	HistoryShards int
	Logger        *slog.Logger
	// Restart, when set, starts the server again when it exits on its own (Supervisor.Restart).
	Restart *Backoff
	// TLS, when set, turns mutual TLS on: the frontend and the services between themselves
	// present Cert and accept only clients whose certificate chains to CA.
	TLS *TemporalTLS
}

// TemporalTLS are a TLS server's PEM files: Cert must name ServerName and serve as a client's
// certificate too (the services call each other with it).
type TemporalTLS struct {
	CA, Cert, Key, ServerName string
}

// clientConfig is how a client of the server with these files connects.
func (t *TemporalTLS) clientConfig() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(t.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s holds no PEM certificate", t.CA)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: t.ServerName, MinVersion: tls.VersionTLS12}, nil
}

// TemporalServer is a running Temporal Server (frontend, history, matching and worker services in
// one process) that this process started and will stop. Stop, Crash and Restart are meant for one
// goroutine at a time.
type TemporalServer struct {
	opts    TemporalServerOptions
	pg      *Postgres
	bin     string // the server's binary
	addr    string
	c       *Child // the latest process
	stopped bool
}

// TemporalServerDynamicConfig is the real server's dynamic config beyond DynamicConfig (the dev
// server's tuning, which applies here too).
var TemporalServerDynamicConfig = []string{
	// Visibility's SQL schema keeps workflow ids in varchar(255), and kasa's ids need up to that.
	"limit.maxIDLength=255",
	// A start from a process that also polls the task queue gets its first workflow task in the
	// start's answer, without a trip through matching.
	"system.enableEagerWorkflowStart=true",
}

const (
	temporalRole  = "temporal" // its password too
	temporalDB    = "temporal"
	visibilityDB  = "temporal_visibility"
	probeWorkflow = "kasa-devenv-probe"
	readyTimeout  = 2 * time.Minute
)

// StartTemporalServer sets up the server's databases on pg, writes its configuration and starts
// it; it returns once the server is usable (waitReady).
func StartTemporalServer(ctx context.Context, pg *Postgres, o TemporalServerOptions) (*TemporalServer, error) {
	if o.Dir == "" {
		return nil, errors.New("temporal server: no Dir for its configuration and log")
	}
	var err error
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return nil, err
	}
	server, sqlTool, err := FindTemporalServer()
	if err != nil {
		return nil, err
	}
	schemas, err := temporalSchemaDir()
	if err != nil {
		return nil, err
	}
	o.Namespace = cmp.Or(o.Namespace, "default")
	o.HistoryShards = cmp.Or(o.HistoryShards, 4)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Port == 0 {
		if o.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := refuseLiveServer(ctx, o.Dir); err != nil {
		return nil, err
	}
	setupStart := time.Now()
	if err := setupTemporalDatabases(ctx, pg, sqlTool, schemas); err != nil {
		return nil, err
	}
	o.Logger.Info("Temporal databases ready", "took", time.Since(setupStart).Round(time.Millisecond))
	s := &TemporalServer{opts: o, pg: pg, bin: server, addr: "127.0.0.1:" + strconv.Itoa(o.Port)}
	if err := s.writeConfig(); err != nil {
		return nil, err
	}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Address is the frontend's gRPC address (host:port).
func (s *TemporalServer) Address() string { return s.addr }

// Namespace is the namespace the server was started with.
func (s *TemporalServer) Namespace() string { return s.opts.Namespace }

// PID is the server process's id (to measure its CPU and memory).
func (s *TemporalServer) PID() int { return s.c.PID() }

// LogPath is the file the server writes its log to.
func (s *TemporalServer) LogPath() string { return filepath.Join(s.opts.Dir, "temporal-server.log") }

// Stop asks the server to shut down (SIGTERM: the services leave the membership ring and release
// their shards) and waits for it; after 30 seconds it is killed.
func (s *TemporalServer) Stop() error {
	if s.stopped {
		return nil
	}
	s.stopped = true
	return s.c.stopClean(30 * time.Second)
}

// Crash kills the server (SIGKILL), as a crash would: its shards and membership are left for the
// next start to take over.
func (s *TemporalServer) Crash() error {
	if s.stopped {
		return nil
	}
	s.stopped = true
	return s.c.Kill()
}

// Restart starts a stopped or crashed server again with the same configuration and ports, and
// waits until it is usable.
func (s *TemporalServer) Restart(ctx context.Context) error {
	if !s.stopped {
		return errors.New("temporal server: restart of a running server")
	}
	if err := refuseLiveServer(ctx, s.opts.Dir); err != nil {
		return err
	}
	return s.start(ctx)
}

// start empties the server's membership table, then starts it. A server that stopped leaves its
// services' addresses there, heartbeats within the last 20 seconds count as alive, and a new
// server on other ports then waited about 50 seconds trying to join the old ones before it
// served. Only this process runs a server on these databases, and none runs now.
func (s *TemporalServer) start(ctx context.Context) error {
	if err := s.pg.psql(ctx, temporalDB, "DELETE FROM cluster_membership"); err != nil {
		return fmt.Errorf("clear the Temporal Server's membership table: %w", err)
	}
	sup := NewSupervisor(s.opts.Dir, s.opts.Logger)
	sup.WorkDir, sup.Restart = s.opts.Dir, s.opts.Restart
	began := time.Now()
	c, err := sup.Start("temporal-server", relaxedEnv(), s.bin, "--root", s.opts.Dir, "--config", "config", "--env", "kasa",
		"--allow-no-auth", "start")
	if err != nil {
		return err
	}
	s.c, s.stopped = c, false
	serving, err := s.waitReady(ctx)
	if err != nil {
		_ = s.Stop()
		return fmt.Errorf("temporal server did not become ready: %w", err)
	}
	s.opts.Logger.Info("Temporal Server ready", "address", s.addr, "namespace", s.opts.Namespace,
		"serving_after", serving.Sub(began).Round(time.Millisecond), "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// waitReady sets up the namespace and search attributes and proves the server usable. SERVING
// on the frontend is not enough: for some seconds after, the history shards are still being
// acquired and the namespace is not yet in every service's cache, and starts fail or hang. It
// returns when the frontend first answered.
func (s *TemporalServer) waitReady(ctx context.Context) (serving time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var c client.Client
	if err := s.c.waitReady(ctx, "it answered at "+s.addr, func(ctx context.Context) (err error) {
		o := client.Options{HostPort: s.addr, Namespace: s.opts.Namespace, Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))}
		if s.opts.TLS != nil {
			if o.ConnectionOptions.TLS, err = s.opts.TLS.clientConfig(); err != nil {
				return err
			}
		}
		c, err = client.DialContext(ctx, o)
		return err
	}); err != nil {
		return serving, err
	}
	defer c.Close()
	serving = time.Now()
	for _, step := range []struct {
		what string
		f    func(context.Context, client.Client) error
	}{
		{"the namespace was registered", s.registerNamespace},
		{"the search attributes were added", s.addSearchAttributes},
		{"a visibility query on them answered", s.queryVisibility},
		{"a probe workflow ran", s.probe},
	} {
		if err := s.c.waitReady(ctx, step.what, func(ctx context.Context) error { return step.f(ctx, c) }); err != nil {
			return serving, err
		}
	}
	return serving, nil
}

// queryVisibility fails until the frontend knows the search attributes in the namespace.
func (s *TemporalServer) queryVisibility(ctx context.Context, c client.Client) error {
	var terms []string
	for _, sa := range SearchAttributes {
		name, _, _ := strings.Cut(sa, "=")
		terms = append(terms, name+" = 'probe'")
	}
	_, err := c.WorkflowService().ListWorkflowExecutions(ctx, &workflowservice.ListWorkflowExecutionsRequest{
		Namespace: s.opts.Namespace, PageSize: 1, Query: strings.Join(terms, " AND ")})
	return err
}

func (s *TemporalServer) registerNamespace(ctx context.Context, c client.Client) error {
	_, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: s.opts.Namespace})
	if _, ok := errors.AsType[*serviceerror.NamespaceNotFound](err); !ok {
		return err
	}
	_, err = c.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
		Namespace:                        s.opts.Namespace,
		WorkflowExecutionRetentionPeriod: durationpb.New(72 * time.Hour),
	})
	if _, ok := errors.AsType[*serviceerror.NamespaceAlreadyExists](err); err != nil && !ok {
		return err
	}
	// Described here once the frontend's namespace cache has it.
	return errors.New("namespace registered, not yet described")
}

func (s *TemporalServer) addSearchAttributes(ctx context.Context, c client.Client) error {
	have, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: s.opts.Namespace})
	if err != nil {
		return err
	}
	missing := map[string]enumspb.IndexedValueType{}
	for _, sa := range SearchAttributes {
		name, kind, _ := strings.Cut(sa, "=")
		if _, ok := have.CustomAttributes[name]; !ok {
			missing[name] = enumspb.IndexedValueType(enumspb.IndexedValueType_shorthandValue[kind])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	_, err = c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace: s.opts.Namespace, SearchAttributes: missing})
	if _, ok := errors.AsType[*serviceerror.AlreadyExists](err); err != nil && !ok {
		return err
	}
	return errors.New("search attributes added, not yet listed")
}

// probe runs a workflow through the whole server by hand, without a worker: a start (history),
// its first workflow task polled (transfer queue, matching) and completed with the workflow's
// completion.
func (s *TemporalServer) probe(ctx context.Context, c client.Client) error {
	id := probeWorkflow + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	queue := &taskqueuepb.TaskQueue{Name: id, Kind: enumspb.TASK_QUEUE_KIND_NORMAL}
	ws := c.WorkflowService()
	if _, err := ws.StartWorkflowExecution(ctx, &workflowservice.StartWorkflowExecutionRequest{
		Namespace: s.opts.Namespace, WorkflowId: id, WorkflowType: &commonpb.WorkflowType{Name: probeWorkflow},
		TaskQueue: queue, RequestId: id, Identity: "kasa-devenv",
		WorkflowRunTimeout: durationpb.New(time.Minute), WorkflowTaskTimeout: durationpb.New(10 * time.Second),
	}); err != nil {
		return err
	}
	task, err := ws.PollWorkflowTaskQueue(ctx, &workflowservice.PollWorkflowTaskQueueRequest{
		Namespace: s.opts.Namespace, TaskQueue: queue, Identity: "kasa-devenv"})
	if err != nil {
		return err
	}
	if len(task.TaskToken) == 0 {
		return errors.New("probe workflow's task not delivered")
	}
	_, err = ws.RespondWorkflowTaskCompleted(ctx, &workflowservice.RespondWorkflowTaskCompletedRequest{
		Namespace: s.opts.Namespace, TaskToken: task.TaskToken, Identity: "kasa-devenv",
		Commands: []*commandpb.Command{{
			CommandType: enumspb.COMMAND_TYPE_COMPLETE_WORKFLOW_EXECUTION,
			Attributes: &commandpb.Command_CompleteWorkflowExecutionCommandAttributes{
				CompleteWorkflowExecutionCommandAttributes: &commandpb.CompleteWorkflowExecutionCommandAttributes{}},
		}},
	})
	return err
}

// refuseLiveServer fails when a server runs on dir (its supervisor may have started it again
// since a crash): two servers on the same databases would take each other's shards. One whose
// launcher was killed a moment ago is still stopping on its parent's death: it gets ExitGrace.
func refuseLiveServer(ctx context.Context, dir string) error {
	var pids []int
	if err := poll(ctx, ExitGrace, func() bool { pids = PIDsMentioning(" --root " + dir + " "); return len(pids) == 0 }); err != nil {
		return err
	}
	if len(pids) > 0 {
		return fmt.Errorf("Temporal Server (pid %d) is already running on %s: stop it (kill %d) and start again", pids[0], dir, pids[0])
	}
	return nil
}

// setupTemporalDatabases creates the role and the two databases when missing and brings their
// schemas to the tool's latest version: both steps are idempotent, so a start on a cluster set up
// before (or an older schema) costs only the tool's checks.
func setupTemporalDatabases(ctx context.Context, pg *Postgres, sqlTool, schemas string) error {
	role := fmt.Sprintf("CREATE ROLE %[1]s LOGIN PASSWORD '%[1]s'", temporalRole)
	if err := pg.psql(ctx, "postgres", role); err != nil && !strings.Contains(err.Error(), "already exists") {
		return fmt.Errorf("create role %s: %w", temporalRole, err)
	}
	// The tool also reads SQL_* variables; the flags say everything.
	tool := Command{Env: slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SQL_") })}
	for _, db := range [][2]string{{temporalDB, "temporal"}, {visibilityDB, "visibility"}} {
		db, schema := db[0], db[1]
		if err := pg.createDB(ctx, db, "-O", temporalRole); err != nil {
			return err
		}
		base := []string{"--plugin", "postgres12", "--endpoint", "127.0.0.1", "--port", strconv.Itoa(pg.Port),
			"--user", temporalRole, "--password", temporalRole, "--database", db}
		for _, args := range [][]string{
			{"setup-schema", "--version", "0.0"},
			{"update-schema", "--schema-dir", filepath.Join(schemas, schema, "versioned")},
		} {
			if out, err := tool.Run(ctx, sqlTool, append(base, args...)...); err != nil {
				return fmt.Errorf("temporal-sql-tool %s on %s: %w\n%s", args[0], db, err, out)
			}
		}
	}
	return nil
}

// serverConfig is the server's configuration, written at each start.
//
//go:embed temporal-server.yaml.tmpl
var serverConfigText string

var serverConfig = template.Must(template.New("config").Parse(serverConfigText))

// writeConfig writes the server's config (Dir/config/kasa.yaml) and dynamic config, with free
// ports for every service but the frontend's gRPC.
func (s *TemporalServer) writeConfig() error {
	dir := filepath.Join(s.opts.Dir, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	used := map[int]bool{s.opts.Port: true, s.pg.Port: true}
	services := []struct {
		Name             string
		GRPC, Membership int
	}{{Name: "frontend", GRPC: s.opts.Port}, {Name: "history"}, {Name: "matching"}, {Name: "worker"}}
	for i := range services {
		for _, port := range []*int{&services[i].GRPC, &services[i].Membership} {
			for *port == 0 {
				p, err := FreePort()
				if err != nil {
					return err
				}
				if !used[p] {
					*port, used[p] = p, true
				}
			}
		}
	}
	dynamic := filepath.Join(dir, "dynamicconfig.yaml")
	var b bytes.Buffer
	b.WriteString("# Written by kasa's devenv at each start: edits are lost.\n")
	for _, kv := range slices.Concat(DynamicConfig, TemporalServerDynamicConfig) {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "%s:\n  - value: %s\n", k, v)
	}
	if err := os.WriteFile(dynamic, b.Bytes(), 0o644); err != nil {
		return err
	}
	b.Reset()
	if err := serverConfig.Execute(&b, map[string]any{
		"Shards": s.opts.HistoryShards, "PGPort": s.pg.Port, "Database": temporalDB, "VisibilityDatabase": visibilityDB,
		"User": temporalRole, "Services": services, "Port": s.opts.Port, "DynamicConfig": dynamic, "TLS": s.opts.TLS,
	}); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "kasa.yaml"), b.Bytes(), 0o644)
}

// FindTemporalServer looks for the pinned server, $KASA_TEMPORAL_SERVER or where findBin finds
// it, and its schema tool: beside the server first.
func FindTemporalServer() (server, sqlTool string, err error) {
	server = cmp.Or(os.Getenv("KASA_TEMPORAL_SERVER"), findBin("temporal-server"))
	sqlTool = findBin("temporal-sql-tool", filepath.Dir(server))
	if server == "" || sqlTool == "" {
		return "", "", errors.New("temporal-server or temporal-sql-tool not found: run `make temporal-server` " +
			"(go install go.temporal.io/server/cmd/server@" + TemporalServerVersion + " and cmd/tools/sql into ./bin), " +
			"or set KASA_TEMPORAL_SERVER to the server binary with temporal-sql-tool beside it")
	}
	return server, sqlTool, nil
}

// temporalSchemaDir is schema/postgresql/v12 of the server's module in the module cache, where
// `go install` of the server leaves it.
func temporalSchemaDir() (string, error) {
	out, err := Command{}.Run(context.Background(), "go", "env", "GOMODCACHE")
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE (to find the Temporal Server's schemas): %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(out), "go.temporal.io", "server@"+TemporalServerVersion,
		"schema", "postgresql", "v12")
	if _, err := os.Stat(filepath.Join(dir, "temporal", "versioned")); err != nil {
		return "", fmt.Errorf("the Temporal Server's schemas are not in %s: run `make temporal-server` "+
			"(it leaves the module in the module cache)", dir)
	}
	return dir, nil
}
