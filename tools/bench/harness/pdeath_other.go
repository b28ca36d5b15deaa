//go:build !linux

package harness

import "os/exec"

// dieWithParent: only Linux has a parent-death signal; elsewhere a killed kasa bench leaves its
// kasa dev to be stopped by hand.
func dieWithParent(*exec.Cmd) {}
