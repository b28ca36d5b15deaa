// Package devenv starts the throwaway infrastructure kasa needs on a developer's machine and in
// tests: a PostgreSQL cluster from the machine's binaries and the Temporal CLI dev server.
package devenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PostgresOptions say where and how to run a local cluster.
type PostgresOptions struct {
	Dir      string // data directory; created and initialised when empty
	Port     int    // 0 picks a free port
	Database string // created when missing; default "kasa"
	// Ephemeral turns durability off (fsync, full-page writes): for test clusters only.
	Ephemeral bool
	// Settings are extra server settings, "name=value" each (-c), such as the preloaded
	// pg_stat_statements that kasa bench counts statements with.
	Settings []string
	Logger   *slog.Logger
	// Restart, when set, starts the server again when it exits on its own (Supervisor.Restart).
	Restart *Backoff
}

// Postgres is a running cluster that this process started and will stop.
type Postgres struct {
	URL    string
	Port   int
	c      *Child
	bindir string
}

// StartPostgres initialises (once) and starts a cluster. As root it runs the server as the
// `postgres` OS user, because initdb and postgres refuse to run as root.
func StartPostgres(ctx context.Context, o PostgresOptions) (*Postgres, error) {
	o.Database = cmp.Or(o.Database, "kasa")
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	bindir, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	cred, err := clusterOwner(dir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := initCluster(ctx, bindir, dir, o.Logger); err != nil {
			return nil, err
		}
	}
	if err := clearStaleLocks(ctx, dir, o.Logger); err != nil {
		return nil, err
	}
	if o.Port == 0 {
		if o.Port, err = FreePort(); err != nil {
			return nil, err
		}
	} else if err := WaitAddrFree(ctx, "127.0.0.1:"+strconv.Itoa(o.Port), "PostgreSQL's port"); err != nil {
		return nil, err // another server would answer for this one, which cannot bind it
	}
	args := []string{"-D", dir, "-p", strconv.Itoa(o.Port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200",
		// As deployed (docs/deployment.md): full-page images after each checkpoint are about half
		// of a long run's WAL, and lz4 shrinks them for little CPU.
		"-c", "wal_compression=lz4"}
	if o.Ephemeral {
		args = append(args, "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off")
	}
	for _, kv := range o.Settings {
		args = append(args, "-c", kv)
	}
	// Its log is <dir>.log beside the data directory. SIGINT is its fast shutdown: abort the
	// transactions, checkpoint, exit (SIGTERM would wait for every client to leave).
	sup := NewSupervisor(filepath.Dir(dir), o.Logger)
	sup.StopSignal, sup.Credential, sup.Restart = syscall.SIGINT, cred, o.Restart
	c, err := sup.Start(filepath.Base(dir), os.Environ(), filepath.Join(bindir, "postgres"), args...)
	if err != nil {
		return nil, err
	}
	p := &Postgres{URL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", o.Port, o.Database), Port: o.Port, c: c, bindir: bindir}
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = c.waitReady(readyCtx, "pg_isready answered", func(ctx context.Context) error {
		_, err := p.run(ctx, "pg_isready", "-q")
		return err
	})
	if err == nil {
		err = p.createDB(ctx, o.Database)
	}
	if err != nil {
		p.Stop()
		return nil, fmt.Errorf("postgres did not become ready: %w", err)
	}
	o.Logger.Info("PostgreSQL ready", "port", o.Port, "dir", dir)
	return p, nil
}

// initCluster runs initdb in dir.init beside dir and renames the result to dir (then empty), so
// that dir holds a cluster only once initdb has finished: a start stopped halfway (killed on its
// first run) leaves dir.init, which the next one removes, never a cluster that cannot start.
func initCluster(ctx context.Context, bindir, dir string, log *slog.Logger) error {
	tmp := dir + ".init"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	cred, err := clusterOwner(tmp)
	if err != nil {
		return err
	}
	log.Info("initialising PostgreSQL cluster", "dir", dir)
	out, err := (Command{Credential: cred, Dir: "/"}).Run(ctx, filepath.Join(bindir, "initdb"), "-D", tmp, "-U", "postgres",
		"--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync")
	if err != nil {
		return fmt.Errorf("initdb %s: %w\n%s", tmp, err, out)
	}
	// dir is there, empty (clusterOwner made it): os.Rename does not replace a directory.
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("PostgreSQL cluster initialised in %s, but %s is not empty: %w", tmp, dir, err)
	}
	return os.Rename(tmp, dir)
}

// run runs one of the cluster's client programs (pg_isready, createdb, psql) as its superuser.
func (p *Postgres) run(ctx context.Context, tool string, args ...string) (string, error) {
	return Command{}.Run(ctx, filepath.Join(p.bindir, tool), append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-U", "postgres"}, args...)...)
}

// createDB creates the database unless it exists.
func (p *Postgres) createDB(ctx context.Context, name string, args ...string) error {
	_, err := p.run(ctx, "createdb", append(args, name)...)
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		return fmt.Errorf("createdb %s: %w", name, err)
	}
	return nil
}

// psql runs sql on the database db.
func (p *Postgres) psql(ctx context.Context, db, sql string) error {
	_, err := p.run(ctx, "psql", "-d", db, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql)
	return err
}

// Stop asks for a fast shutdown (SIGINT: abort transactions, checkpoint, exit) and waits for it;
// after 30 seconds the server is killed.
func (p *Postgres) Stop() error { return p.c.stopClean(30 * time.Second) }

// Crash shuts the cluster down in immediate mode (SIGQUIT to the postmaster: every backend is
// killed, nothing is checkpointed, the next start runs crash recovery), as a crash would.
func (p *Postgres) Crash() error { return p.c.Down(syscall.SIGQUIT) }

// Process is the server's process, for a launcher that watches it.
func (p *Postgres) Process() *Child { return p.c }

// postgresBinDir is the directory of initdb and the server: initdb on PATH is often a link to it.
func postgresBinDir() (string, error) {
	initdb, err := PostgresTool("initdb")
	if err != nil {
		matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
		if len(matches) == 0 {
			return "", errors.New("PostgreSQL binaries (initdb, postgres) not found: install PostgreSQL 15+ " +
				"(Debian: apt-get install postgresql) or set KASA_DATABASE_URL to an existing server")
		}
		initdb = matches[len(matches)-1]
	}
	if resolved, err := filepath.EvalSymlinks(initdb); err == nil {
		initdb = resolved
	}
	return filepath.Dir(initdb), nil
}

// clusterOwner creates dir and returns the credential to run the cluster with: the current user,
// or the `postgres` OS user when we are root (who then owns dir).
func clusterOwner(dir string) (*syscall.Credential, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("running as root, but no `postgres` OS user to run PostgreSQL as: create one (useradd postgres) or run as a normal user")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	// The postgres user must be able to reach dir through its parents.
	for p := filepath.Dir(dir); p != "/"; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if st.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(p, st.Mode().Perm()|0o011); err != nil {
				return nil, err
			}
		}
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// PostgresTool finds a PostgreSQL program (initdb, createdb, psql, pgbench...): in pg_config's
// bindir, where Debian keeps the ones not on PATH, else on PATH.
func PostgresTool(name string) (string, error) {
	if dir, err := (Command{}).Run(context.Background(), "pg_config", "--bindir"); err == nil {
		if p := filepath.Join(strings.TrimSpace(dir), name); isFile(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("PostgreSQL client program %s not found: install PostgreSQL 15+ "+
		"(Debian: apt-get install postgresql) or put $(pg_config --bindir) on PATH", name)
}
