package devenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLockOwner reads lock files naming real processes: this one (alive, not postgres), a reaped
// child (no process), a child left unreaped (a zombie), a process working in the data directory
// that is not postgres, and two processes named postgres, one working in the data directory and
// one elsewhere.
func TestLockOwner(t *testing.T) {
	dataDir := t.TempDir()

	reaped := exec.Command("true")
	require.NoError(t, reaped.Run())

	zombie := exec.Command("true")
	require.NoError(t, zombie.Start())
	t.Cleanup(func() { _ = zombie.Wait() })
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(zombie.Process.Pid) + "/stat")
		return strings.Contains(string(b), ") Z ")
	}, 5*time.Second, 10*time.Millisecond, "the unreaped child becomes a zombie")

	fake := filepath.Join(t.TempDir(), "postgres")
	sleep, err := os.ReadFile("/bin/sleep")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(fake, sleep, 0o755))
	startIn := func(exe, dir string) int {
		cmd := exec.Command(exe, "60")
		cmd.Dir = dir
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd.Process.Pid
	}
	live, other, notPostgres := startIn(fake, dataDir), startIn(fake, t.TempDir()), startIn("/bin/sleep", dataDir)

	lock := func(pid int) string { return strconv.Itoa(pid) + "\n" + dataDir + "\n1700000000\n5432\n" }
	tests := []struct {
		name    string
		noFile  bool
		content string
		want    lockState
		wantPID int
	}{
		{name: "no lock file", noFile: true, want: lockAbsent},
		{name: "alive, not postgres", content: lock(os.Getpid()), want: lockStale, wantPID: os.Getpid()},
		{name: "no such process", content: lock(reaped.Process.Pid), want: lockStale, wantPID: reaped.Process.Pid},
		{name: "zombie", content: lock(zombie.Process.Pid), want: lockStale, wantPID: zombie.Process.Pid},
		{name: "postgres in the data directory", content: lock(live), want: lockLive, wantPID: live},
		{name: "single-user postgres in the data directory", content: lock(-live), want: lockLive, wantPID: live},
		{name: "postgres in another directory", content: lock(other), want: lockStale, wantPID: other},
		{name: "not postgres, in the data directory", content: lock(notPostgres), want: lockStale, wantPID: notPostgres},
		{name: "empty: a server is starting", content: "", want: lockUnknown},
		{name: "not a pid", content: "postgres\n", want: lockUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "postmaster.pid")
			if !tt.noFile {
				require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o600))
			}
			state, pid := lockOwner(path, dataDir)
			require.Equal(t, tt.want, state)
			require.Equal(t, tt.wantPID, pid)
		})
	}
}

// TestWaitDetached: a start waits while a process is attached to the shared memory postmaster.pid
// names (a backend outliving its killed postmaster), and goes on once it has detached.
func TestWaitDetached(t *testing.T) {
	const ipcPrivate, ipcCreat, ipcRmid = 0, 0o1000, 0
	id, _, errno := syscall.Syscall(syscall.SYS_SHMGET, ipcPrivate, 4096, ipcCreat|0o600)
	require.Zero(t, errno)
	t.Cleanup(func() { _, _, _ = syscall.Syscall(syscall.SYS_SHMCTL, id, ipcRmid, 0) })
	addr, _, errno := syscall.Syscall(syscall.SYS_SHMAT, id, 0, 0)
	require.Zero(t, errno)
	n, err := shmAttached(0, int64(id))
	require.NoError(t, err)
	require.Equal(t, 1, n)

	pidFile := filepath.Join(t.TempDir(), "postmaster.pid")
	lock := fmt.Sprintf("1\n/data\n1700000000\n5432\n/data\n127.0.0.1\n%9d %9d\nready   \n", 0, id)
	require.NoError(t, os.WriteFile(pidFile, []byte(lock), 0o600))
	done := make(chan error, 1)
	go func() { done <- waitDetached(context.Background(), pidFile) }()
	select {
	case err := <-done:
		t.Fatalf("waitDetached returned while the segment was attached: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	_, _, errno = syscall.Syscall(syscall.SYS_SHMDT, addr, 0, 0)
	require.Zero(t, errno)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("waitDetached still waits after the detach")
	}
}

// One launcher per data directory: a second lock is refused, naming the holder, until the first
// is let go.
func TestLockDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dev.lock")
	unlock, err := LockDir(path, "kasa dev")
	require.NoError(t, err)
	_, err = LockDir(path, "kasa dev")
	require.ErrorContains(t, err, "another kasa dev runs on")
	require.ErrorContains(t, err, strconv.Itoa(os.Getpid()))
	unlock()
	unlock, err = LockDir(path, "kasa dev")
	require.NoError(t, err)
	unlock()
}

// postmaster.pid names a segment by key and id. A segment with the id under another key is
// another owner's (ids are reused, after a reboot say): the start does not wait for it, as
// postgres itself would not. A key above 2^31 is negative to the kernel (key_t is an int), and
// postgres writes it as an unsigned long: the same segment, waited for.
func TestWaitDetachedNamesTheSegmentByKey(t *testing.T) {
	const ipcCreat, ipcExcl, ipcRmid = 0o1000, 0o2000, 0
	tests := []struct {
		name     string
		key      int32 // the segment's
		fileKey  int32 // the key postmaster.pid names
		waitsFor bool
	}{
		{name: "another key", key: 0x6b617361, fileKey: 0x6b617362},
		{name: "a key above 2^31", key: -0x6b617361, fileKey: -0x6b617361, waitsFor: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			offset := int32(os.Getpid() % 1000) // tests of other packages make segments too
			key := uintptr(uint32(tt.key + offset))
			fileKey := uint64(int64(tt.fileKey + offset)) // as postgres writes it: (unsigned long) key
			id, _, errno := syscall.Syscall(syscall.SYS_SHMGET, key, 4096, ipcCreat|ipcExcl|0o600)
			require.Zero(t, errno)
			t.Cleanup(func() { _, _, _ = syscall.Syscall(syscall.SYS_SHMCTL, id, ipcRmid, 0) })
			addr, _, errno := syscall.Syscall(syscall.SYS_SHMAT, id, 0, 0)
			require.Zero(t, errno)
			detach := func() { _, _, _ = syscall.Syscall(syscall.SYS_SHMDT, addr, 0, 0) }
			t.Cleanup(detach)

			pidFile := filepath.Join(t.TempDir(), "postmaster.pid")
			lock := fmt.Sprintf("1\n/data\n1700000000\n5432\n/data\n127.0.0.1\n%9d %9d\nready   \n", fileKey, id)
			require.NoError(t, os.WriteFile(pidFile, []byte(lock), 0o600))
			done := make(chan error, 1)
			go func() { done <- waitDetached(context.Background(), pidFile) }()
			select {
			case err := <-done:
				require.False(t, tt.waitsFor, "waitDetached returned while its segment was attached: %v", err)
				require.NoError(t, err)
				return
			case <-time.After(500 * time.Millisecond):
				require.True(t, tt.waitsFor, "waitDetached waits for a segment of another key")
			}
			detach()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("waitDetached still waits after the detach")
			}
		})
	}
}
