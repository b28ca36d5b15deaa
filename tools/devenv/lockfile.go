package devenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A PostgreSQL server keeps lock files naming its postmaster's pid: postmaster.pid in the data
// directory and .s.PGSQL.<port>.lock beside its socket (the data directory too, here). A killed
// server leaves them behind, and postgres refuses to start while the pid they name answers
// kill(pid, 0): a zombie nobody has reaped yet, or a process of the postgres user that reused
// the pid. clearStaleLocks removes the ones that are provably stale before a start.

// lockState is what a lock file says about its owner.
type lockState int

const (
	lockAbsent  lockState = iota
	lockLive              // a postgres process working in the data directory holds it
	lockStale             // its pid is gone, a zombie, or not a postgres working in the data directory
	lockUnknown           // not a pid, or a process we may not inspect: postgres decides itself
)

// lockOwner says whether the lock file at path belongs to a live server of the cluster in
// dataDir, and which pid it names.
func lockOwner(path, dataDir string) (lockState, int) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return lockAbsent, 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid == 0 {
		return lockUnknown, 0 // empty while a server starts, or not postgres's
	}
	if pid < 0 {
		pid = -pid // a single-user backend writes its pid negated
	}
	proc := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(proc + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return lockStale, pid
	}
	if err != nil {
		return lockUnknown, pid
	}
	// The state follows the command name, which is in parentheses and may hold any byte.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return lockStale, pid // it has exited; only its parent has not collected it
	}
	exe, err := os.Readlink(proc + "/exe")
	var cwd string
	if err == nil {
		cwd, err = os.Readlink(proc + "/cwd")
	}
	if errors.Is(err, os.ErrNotExist) {
		return lockStale, pid // it exited meanwhile, or is a kernel thread
	}
	if err != nil {
		return lockUnknown, pid // another user's
	}
	if real, err := filepath.EvalSymlinks(dataDir); err == nil {
		dataDir = real
	}
	// The postmaster and every backend work in their data directory.
	if filepath.Base(strings.TrimSuffix(exe, " (deleted)")) == "postgres" && cwd == dataDir {
		return lockLive, pid
	}
	return lockStale, pid
}

// clearStaleLocks removes the lock files a killed server left in dir, so that a start right after
// a SIGKILL works, and fails when a server still runs on dir. A file is removed only when its pid
// is provably not a postgres of dir, and once no process is attached to the shared memory that
// postmaster.pid names: backends outliving their postmaster keep it attached until they notice,
// and postgres refuses to start beside them.
func clearStaleLocks(ctx context.Context, dir string, log *slog.Logger) error {
	if runtime.GOOS != "linux" {
		return nil // no /proc to tell: postgres decides alone
	}
	pidFile := filepath.Join(dir, "postmaster.pid")
	sockets, _ := filepath.Glob(filepath.Join(dir, ".s.PGSQL.*.lock"))
	for _, path := range append([]string{pidFile}, sockets...) {
		// A server whose launcher was killed a moment ago is still stopping: give it time.
		var state lockState
		var pid int
		if err := poll(ctx, ExitGrace, func() bool { state, pid = lockOwner(path, dir); return state != lockLive }); err != nil {
			return err
		}
		switch state {
		case lockLive:
			return fmt.Errorf("PostgreSQL (pid %d) is already running on %s: stop it (kill -INT %d) or use another data directory", pid, dir, pid)
		case lockUnknown:
			return nil
		case lockStale:
			if path == pidFile {
				if err := waitDetached(ctx, pidFile); err != nil {
					return err
				}
			}
			log.Info("removing the lock file of a stopped PostgreSQL", "file", path, "pid", pid)
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// waitDetached waits, for a few seconds, until no process is attached to the System V shared
// memory segment whose key and id are on the seventh line of postmaster.pid.
func waitDetached(ctx context.Context, pidFile string) error {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return err
	}
	// Postgres writes the key, a key_t (int), as an unsigned long: one above 2^31 as 2^64 - n.
	var key uint64
	var id int64
	if lines := strings.Split(string(b), "\n"); len(lines) < 7 {
		return nil // the server died before it made its shared memory
	} else if _, err := fmt.Sscan(lines[6], &key, &id); err != nil {
		return nil
	}
	var n int
	var serr error
	if err := poll(ctx, 10*time.Second, func() bool { n, serr = shmAttached(int32(key), id); return serr != nil || n == 0 }); err != nil {
		return err
	}
	if serr != nil || n == 0 {
		return serr
	}
	return fmt.Errorf("%d processes of a killed PostgreSQL server still use its shared memory (id %d): stop the postgres processes working in %s", n, id, filepath.Dir(pidFile))
}

// shmAttached counts the processes attached to the shared memory segment key and id (0 once it
// is gone). An id is reused once its segment is gone: under another key it is not the server's.
func shmAttached(key int32, id int64) (int, error) {
	b, err := os.ReadFile("/proc/sysvipc/shm")
	if err != nil {
		return 0, err
	}
	wantKey, wantID := strconv.FormatInt(int64(key), 10), strconv.FormatInt(id, 10)
	for _, line := range strings.Split(string(b), "\n") {
		// key shmid perms size cpid lpid nattch ... (the key signed, as the kernel's key_t)
		if f := strings.Fields(line); len(f) > 6 && f[0] == wantKey && f[1] == wantID {
			return strconv.Atoi(f[6])
		}
	}
	return 0, nil
}

// LockDir takes the lock file at path for this process, or says which process holds it: one
// launcher per data directory. The kernel lets go of it when the process ends, however it ends,
// so a crash leaves no lock behind. unlock releases it.
func LockDir(path, what string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another %s runs on %s (pid %s): stop it first", what, filepath.Dir(path), strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}
