package harness

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel send the child SIGTERM when the thread that started it exits, so
// that a kasa bench killed outright (SIGKILL, or SIGPIPE on a closed output) does not leave its
// kasa dev, and that one's PostgreSQL and Temporal, running.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
