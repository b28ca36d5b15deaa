//go:build linux

package bench

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// StackCPU counts the processes under the root by their executable's name, and nothing outside it.
func TestStackCPUFollowsTheProcessTree(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer devnull.Close()
	// Each in a process group of its own, ended whole: killing only the shell would leave its
	// busy child running.
	start := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(name, args...)
		cmd.Stdout = devnull
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
		return cmd
	}
	root := start("sh", "-c", "yes & wait") // the busy `yes` is the root's child
	outside := start("cat", "/dev/zero")    // busy too, but not under the root
	cpu := StackCPU(root.Process.Pid, nil, nil)
	require.NotNil(t, cpu)

	first := cpu()
	var last map[string]time.Duration
	require.Eventually(t, func() bool {
		last = cpu()
		return last["yes"]-first["yes"] >= 50*time.Millisecond
	}, 10*time.Second, 50*time.Millisecond, "the root's busy child is counted under its name")
	require.Contains(t, last, ClassKasa, "the root itself is the kasa class")
	procs := readProcs()
	var children []int
	for pid, p := range procs {
		if p.Comm == "yes" && descends(procs, pid, root.Process.Pid) {
			children = append(children, pid)
		}
	}
	require.Len(t, children, 1)
	require.NotContains(t, last, "cat", "a process outside the tree is not counted")
	split := StackCPU(root.Process.Pid, nil, func() map[int]bool { return map[int]bool{children[0]: true} })()
	require.Equal(t, split["yes"], split[postgresKasa], "a database backend's time is also counted as a part: of kasa's database")
	require.Positive(t, split[postgresKasa])
	require.NotContains(t, split, postgresOthers)
	own, ok := readProcs()[outside.Process.Pid]
	require.True(t, ok)
	require.Positive(t, own.UTime+own.STime, "the process left out did use CPU")
	require.Positive(t, StackCPU(root.Process.Pid, []int{outside.Process.Pid}, nil)()["cat"], "a process beside the root is counted by its name")
	require.Equal(t, ClassTemporal, class("temporal-server", nil), "the real Temporal Server is Temporal")
	require.Equal(t, ClassBanksim, class("kasa", []string{"/x/kasa", "banksim"}), "kasa banksim is the simulator, not kasa")
	require.Equal(t, ClassKasa, class("kasa", []string{"/x/kasa", "worker"}))
	require.Equal(t, ClassBanksim, class("kasa.wt", []string{"bin/kasa.wt", "banksim"}), "whatever the binary's name")
	require.Equal(t, ClassKasa, class("kasa.wt", []string{"bin/kasa.wt", "api"}))

	busy := time.Now().Add(100 * time.Millisecond) // this process is the bench class
	for time.Now().Before(busy) {
	}
	require.Positive(t, cpu()[ClassBench])

	require.NoError(t, syscall.Kill(-root.Process.Pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return ended(children[0]) }, 10*time.Second, 20*time.Millisecond,
		"the busy child ends with its group")
}

// ended says whether a process is gone or a zombie (an orphan waits for whoever adopted it to reap it).
func ended(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}
