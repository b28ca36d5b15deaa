package devenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
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

// TemporalServerOptions say how to run a real, multi-service Temporal Server on a devenv PostgreSQL.
// Only Dir is required.
type TemporalServerOptions struct {
	// Dir holds the generated configuration and the server's log; created when missing. The
	// server's state lives in PostgreSQL, so a start on the same cluster finds it again.
	Dir string
	// ServerPath and SQLToolPath default to FindTemporalServer().
	ServerPath, SQLToolPath string
	// SchemaDir holds the server module's postgresql/v12 schemas; default: the module cache's copy
	// of TemporalServerVersion (where `make temporal-server` leaves it).
	SchemaDir string
	// Port is the frontend's gRPC port; 0 picks a free one. The other services' ports are always
	// picked free: only the frontend is reached from outside.
	Port int
	// HTTPPort is the frontend's HTTP API port; 0 leaves it off.
	HTTPPort int
	// MetricsPort serves the server's Prometheus metrics on /metrics; 0 leaves them off.
	MetricsPort int
	// Namespace is registered when missing; default "default", with Retention (default 72h).
	Namespace string
	Retention time.Duration
	// HistoryShards is fixed when the databases are first set up (default 4): a later start with
	// another number is refused by the server.
	HistoryShards int
	// Database and VisibilityDatabase are created in the cluster when missing, owned by the role
	// `temporal`; defaults "temporal" and "temporal_visibility".
	Database, VisibilityDatabase string
	// LogLevel of the server's log (Dir/temporal-server.log); default "warn".
	LogLevel string
	// ReadyTimeout bounds the wait for a usable server; default 2 minutes.
	ReadyTimeout time.Duration
	Logger       *slog.Logger
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
	pgPort  int
	addr    string
	config  string // the directory of the generated config
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
	temporalRole     = "temporal"
	temporalPassword = "temporal"
	probeWorkflow    = "kasa-devenv-probe"
)

// StartTemporalServer sets up the server's databases on pg (once: later starts find them and only
// apply what the schema tool has not), writes its configuration, starts it, registers the
// namespace and the search attributes when missing, and returns once a workflow runs to the end on
// it and the namespace's search attributes answer in visibility queries.
func StartTemporalServer(ctx context.Context, pg *Postgres, o TemporalServerOptions) (*TemporalServer, error) {
	if o.Dir == "" {
		return nil, errors.New("temporal server: no Dir for its configuration and log")
	}
	var err error
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return nil, err
	}
	if o.ServerPath == "" || o.SQLToolPath == "" {
		server, tool, err := FindTemporalServer()
		if err != nil {
			return nil, err
		}
		if o.ServerPath == "" {
			o.ServerPath = server
		}
		if o.SQLToolPath == "" {
			o.SQLToolPath = tool
		}
	}
	if o.SchemaDir == "" {
		if o.SchemaDir, err = temporalSchemaDir(); err != nil {
			return nil, err
		}
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Retention == 0 {
		o.Retention = 72 * time.Hour
	}
	if o.HistoryShards == 0 {
		o.HistoryShards = 4
	}
	if o.Database == "" {
		o.Database = "temporal"
	}
	if o.VisibilityDatabase == "" {
		o.VisibilityDatabase = "temporal_visibility"
	}
	if o.LogLevel == "" {
		o.LogLevel = "warn"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 2 * time.Minute
	}
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
	if err := setupTemporalDatabases(ctx, pg, o); err != nil {
		return nil, err
	}
	o.Logger.Info("Temporal databases ready", "took", time.Since(setupStart).Round(time.Millisecond))
	s := &TemporalServer{opts: o, pgPort: pg.Port, addr: "127.0.0.1:" + strconv.Itoa(o.Port), config: filepath.Join(o.Dir, "config")}
	if err := s.writeConfig(pg); err != nil {
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
	if err := s.c.Stop(30 * time.Second); err != nil {
		return err
	}
	if err := s.c.Err(); err != nil {
		return fmt.Errorf("temporal server: %w", err)
	}
	return nil
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

func (s *TemporalServer) start(ctx context.Context) error {
	if err := s.forgetMembers(ctx); err != nil {
		return err
	}
	sup := NewSupervisor(s.opts.Dir, s.opts.Logger)
	sup.WorkDir, sup.Restart = s.opts.Dir, s.opts.Restart
	env := os.Environ()
	// The same reason as the dev server's (StartTemporal): rarer collections, a shorter tail.
	if _, set := os.LookupEnv("GOGC"); !set {
		env = append(env, "GOGC="+strconv.Itoa(RelaxedGOGC))
	}
	began := time.Now()
	c, err := sup.Start("temporal-server", env, s.opts.ServerPath, "--root", s.opts.Dir, "--config", "config", "--env", "kasa",
		"--allow-no-auth", "start")
	if err != nil {
		return err
	}
	s.c, s.stopped = c, false
	serving, err := s.waitReady(ctx)
	if err != nil {
		_ = s.Stop()
		return fmt.Errorf("temporal server did not become ready (log: %s): %w\n%s", s.LogPath(), err, tailFile(s.LogPath(), 15))
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
	ctx, cancel := context.WithTimeout(ctx, s.opts.ReadyTimeout)
	defer cancel()
	var last error
	step := func(what string, f func(context.Context) error) error {
		for {
			callCtx, cancelCall := context.WithTimeout(ctx, 10*time.Second)
			err := f(callCtx)
			cancelCall()
			if err == nil {
				return nil
			}
			last = fmt.Errorf("%s: %w", what, err)
			select {
			case <-s.c.Done():
				return fmt.Errorf("temporal server exited (%v); last: %v", s.c.Err(), last)
			case <-ctx.Done():
				return fmt.Errorf("%w; last: %v", ctx.Err(), last)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	var c client.Client
	if err := step("dial", func(ctx context.Context) (err error) {
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
	if err := step("register namespace", func(ctx context.Context) error { return s.registerNamespace(ctx, c) }); err != nil {
		return serving, err
	}
	if err := step("add search attributes", func(ctx context.Context) error { return s.addSearchAttributes(ctx, c) }); err != nil {
		return serving, err
	}
	// A visibility query on the attributes fails until the frontend knows them in this namespace.
	if err := step("query visibility", func(ctx context.Context) error {
		var terms []string
		for _, sa := range SearchAttributes {
			name, _, _ := strings.Cut(sa, "=")
			terms = append(terms, name+" = 'probe'")
		}
		_, err := c.WorkflowService().ListWorkflowExecutions(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: s.opts.Namespace, PageSize: 1, Query: strings.Join(terms, " AND ")})
		return err
	}); err != nil {
		return serving, err
	}
	return serving, step("run a probe workflow", func(ctx context.Context) error { return s.probe(ctx, c) })
}

func (s *TemporalServer) registerNamespace(ctx context.Context, c client.Client) error {
	_, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: s.opts.Namespace})
	var notFound *serviceerror.NamespaceNotFound
	if !errors.As(err, &notFound) {
		return err
	}
	_, err = c.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
		Namespace:                        s.opts.Namespace,
		WorkflowExecutionRetentionPeriod: durationpb.New(s.opts.Retention),
	})
	var exists *serviceerror.NamespaceAlreadyExists
	if err != nil && !errors.As(err, &exists) {
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
		if _, ok := have.CustomAttributes[name]; ok {
			continue
		}
		t, ok := enumspb.IndexedValueType_shorthandValue[kind]
		if !ok {
			return fmt.Errorf("search attribute %s: unknown type %q", name, kind)
		}
		missing[name] = enumspb.IndexedValueType(t)
	}
	if len(missing) == 0 {
		return nil
	}
	_, err = c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace: s.opts.Namespace, SearchAttributes: missing})
	var exists *serviceerror.AlreadyExists
	if err != nil && !errors.As(err, &exists) {
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
	if _, err := poll(ctx, ExitGrace, func() bool { pids = PIDsMentioning(" --root " + dir + " "); return len(pids) == 0 }); err != nil {
		return err
	}
	if len(pids) > 0 {
		return fmt.Errorf("Temporal Server (pid %d) is already running on %s: stop it (kill %d) and start again", pids[0], dir, pids[0])
	}
	return nil
}

// forgetMembers empties the server's membership table before a start. A server that stopped
// leaves its services' addresses there, heartbeats within the last 20 seconds count as alive, and
// a new server on other ports then waited about 50 seconds trying to join the old ones before it
// served. Only this process runs a server on these databases, and none runs now.
func (s *TemporalServer) forgetMembers(ctx context.Context) error {
	psql, err := PostgresTool("psql")
	if err != nil {
		return err
	}
	if _, err := (Command{}).Run(ctx, psql, "-h", "127.0.0.1", "-p", strconv.Itoa(s.pgPort), "-U", "postgres",
		"-d", s.opts.Database, "-v", "ON_ERROR_STOP=1", "-q", "-c", "DELETE FROM cluster_membership"); err != nil {
		return fmt.Errorf("clear the Temporal Server's membership table: %w", err)
	}
	return nil
}

// setupTemporalDatabases creates the role and the two databases when missing and brings their
// schemas to the tool's latest version: both steps are idempotent, so a start on a cluster set up
// before (or an older schema) costs only the tool's checks.
func setupTemporalDatabases(ctx context.Context, pg *Postgres, o TemporalServerOptions) error {
	psql, err := PostgresTool("psql")
	if err != nil {
		return err
	}
	port := strconv.Itoa(pg.Port)
	role := fmt.Sprintf(`DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%[1]s') THEN
    CREATE ROLE %[1]s LOGIN PASSWORD '%[2]s';
  END IF;
END $$;`, temporalRole, temporalPassword)
	if _, err := (Command{}).Run(ctx, psql, "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-d", "postgres",
		"-v", "ON_ERROR_STOP=1", "-q", "-c", role); err != nil {
		return fmt.Errorf("create role %s: %w", temporalRole, err)
	}
	createdb, err := PostgresTool("createdb")
	if err != nil {
		return err
	}
	for _, db := range []struct{ name, schema string }{
		{o.Database, "temporal"}, {o.VisibilityDatabase, "visibility"},
	} {
		_, err := Command{}.Run(ctx, createdb, "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-O", temporalRole, db.name)
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			return fmt.Errorf("createdb %s: %w", db.name, err)
		}
		base := []string{"--plugin", "postgres12", "--endpoint", "127.0.0.1", "--port", port,
			"--user", temporalRole, "--password", temporalPassword, "--database", db.name}
		for _, args := range [][]string{
			{"setup-schema", "--version", "0.0"},
			{"update-schema", "--schema-dir", filepath.Join(o.SchemaDir, db.schema, "versioned")},
		} {
			// The tool also reads SQL_* variables; the flags say everything.
			tool := Command{Env: withoutPrefix(os.Environ(), "SQL_")}
			if out, err := tool.Run(ctx, o.SQLToolPath, append(base, args...)...); err != nil {
				return fmt.Errorf("temporal-sql-tool %s on %s: %w\n%s", args[0], db.name, err, out)
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

type serverService struct {
	Name                   string
	GRPC, Membership, HTTP int
}

// writeConfig writes the server's config (Dir/config/kasa.yaml) and dynamic config, with free
// ports for every service but the frontend's gRPC.
func (s *TemporalServer) writeConfig(pg *Postgres) error {
	if err := os.MkdirAll(s.config, 0o755); err != nil {
		return err
	}
	used := map[int]bool{s.opts.Port: true, s.opts.HTTPPort: true, s.opts.MetricsPort: true, pg.Port: true}
	free := func() (int, error) {
		for {
			p, err := FreePort()
			if err != nil || !used[p] {
				used[p] = true
				return p, err
			}
		}
	}
	var services []serverService
	for _, name := range []string{"frontend", "history", "matching", "worker"} {
		svc := serverService{Name: name, GRPC: s.opts.Port}
		var err error
		if name != "frontend" {
			if svc.GRPC, err = free(); err != nil {
				return err
			}
		} else {
			svc.HTTP = s.opts.HTTPPort
		}
		if svc.Membership, err = free(); err != nil {
			return err
		}
		services = append(services, svc)
	}
	dynamic := filepath.Join(s.config, "dynamicconfig.yaml")
	var b bytes.Buffer
	b.WriteString("# Written by kasa's devenv at each start: edits are lost.\n")
	for _, kv := range append(append([]string(nil), DynamicConfig...), TemporalServerDynamicConfig...) {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "%s:\n  - value: %s\n", k, v)
	}
	if err := os.WriteFile(dynamic, b.Bytes(), 0o644); err != nil {
		return err
	}
	b.Reset()
	if err := serverConfig.Execute(&b, map[string]any{
		"LogLevel": s.opts.LogLevel, "Shards": s.opts.HistoryShards, "PGPort": pg.Port,
		"Database": s.opts.Database, "VisibilityDatabase": s.opts.VisibilityDatabase,
		"User": temporalRole, "Password": temporalPassword, "MetricsPort": s.opts.MetricsPort,
		"Services": services, "Port": s.opts.Port, "DynamicConfig": dynamic, "TLS": s.opts.TLS,
	}); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.config, "kasa.yaml"), b.Bytes(), 0o644)
}

// FindTemporalServer looks for the pinned server and its schema tool: $KASA_TEMPORAL_SERVER (the
// server; the tool beside it), ./bin in the repository, beside the running executable, then PATH.
func FindTemporalServer() (server, sqlTool string, err error) {
	var dirs []string
	if p := os.Getenv("KASA_TEMPORAL_SERVER"); p != "" {
		dirs = append(dirs, filepath.Dir(p))
		server = p
	}
	if root, ok := repoRoot(); ok {
		dirs = append(dirs, filepath.Join(root, "bin"))
	}
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	find := func(name string) string {
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p
			}
		}
		p, _ := exec.LookPath(name)
		return p
	}
	if server == "" {
		server = find("temporal-server")
	}
	sqlTool = find("temporal-sql-tool")
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
			"(it leaves the module in the module cache) or set TemporalServerOptions.SchemaDir", dir)
	}
	return dir, nil
}

func withoutPrefix(env []string, prefix string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, prefix) {
			out = append(out, kv)
		}
	}
	return out
}

// tailFile is the last n lines of a file, for error messages.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
