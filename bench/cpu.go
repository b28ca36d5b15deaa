package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"
)

// CPU reads how much CPU time each class of a stack's processes has used so far.
type CPU func() map[string]time.Duration

// The process classes CPU reports; any other process of the stack is named by its executable.
const (
	ClassKasa     = "kasa"     // the measured kasa dev: API, worker, relay, consumer, bank simulator
	ClassPostgres = "postgres" // PostgreSQL's server processes
	ClassTemporal = "temporal" // the Temporal dev server
	ClassBench    = "bench"    // this process: the load generator, and in a T run its worker
)

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on every Linux architecture Go runs on).
const clockTick = 10 * time.Millisecond

// StackCPU reads the CPU time of root (class kasa), of every process descended from it
// (PostgreSQL, Temporal), and of this process (class bench), from /proc. A process's time
// includes its children that have ended and been waited for (PostgreSQL's backends that
// closed), except for this process's: pgbench and the like are not the load generator. Nil
// where there is no /proc.
func StackCPU(root int) CPU {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return nil
	}
	self := os.Getpid()
	return func() map[string]time.Duration {
		procs := readProcs()
		use := map[string]time.Duration{}
		for pid, p := range procs {
			switch {
			case pid == self:
				use[ClassBench] += p.own
			case pid == root:
				use[ClassKasa] += p.own + p.children
			case descends(procs, pid, root):
				use[p.comm] += p.own + p.children
			}
		}
		return use
	}
}

type proc struct {
	comm     string
	ppid     int
	own      time.Duration // utime + stime
	children time.Duration // cutime + cstime: children waited for
}

// readProcs reads every process's CPU times. Processes that end while it reads are left out.
func readProcs() map[int]proc {
	all, err := procfs.AllProcs()
	if err != nil {
		return nil
	}
	procs := make(map[int]proc, len(all))
	for _, p := range all {
		st, err := p.Stat()
		if err != nil {
			continue
		}
		procs[p.PID] = proc{
			comm: st.Comm, ppid: st.PPID,
			own: time.Duration(st.UTime+st.STime) * clockTick, children: time.Duration(st.CUTime+st.CSTime) * clockTick,
		}
	}
	return procs
}

// descends says whether pid is a descendant of root.
func descends(procs map[int]proc, pid, root int) bool {
	for range 64 { // a process tree is shallow; a cycle would be a bug in /proc, not a loop here
		p, ok := procs[pid]
		if !ok || p.ppid <= 1 {
			return false
		}
		if p.ppid == root {
			return true
		}
		pid = p.ppid
	}
	return false
}

// cpuWindow samples cpu at from and at to, in the background. The function it returns waits
// for the second sample and gives each class's CPU time between the two; nil when cpu is nil or
// ctx ends first.
func cpuWindow(ctx context.Context, cpu CPU, from, to time.Time) func() map[string]time.Duration {
	if cpu == nil {
		return func() map[string]time.Duration { return nil }
	}
	done := make(chan map[string]time.Duration, 1)
	go func() {
		if sleep(ctx, time.Until(from)) != nil {
			done <- nil
			return
		}
		a := cpu()
		if sleep(ctx, time.Until(to)) != nil {
			done <- nil
			return
		}
		b := cpu()
		used := map[string]time.Duration{}
		for class, t := range b {
			if d := t - a[class]; d > 0 {
				used[class] = d
			}
		}
		done <- used
	}()
	return func() map[string]time.Duration { return <-done }
}

// CPUUse is the CPU a run's window cost, by process class.
type CPUUse struct {
	Per   string             `json:"per"`   // the operation: "new payment", "workflow" or "request"
	MS    map[string]float64 `json:"ms"`    // CPU milliseconds per operation, by process class
	Cores float64            `json:"cores"` // all classes together: cores busy on average over the window
}

// cpuUse divides the window's CPU among its operations; nil without a measurement or operations.
func cpuUse(used map[string]time.Duration, window time.Duration, per string, ops int64) *CPUUse {
	if len(used) == 0 || ops <= 0 || window <= 0 {
		return nil
	}
	u := &CPUUse{Per: per, MS: map[string]float64{}}
	var total time.Duration
	for class, d := range used {
		u.MS[class] = float64(d) / float64(time.Millisecond) / float64(ops)
		total += d
	}
	u.Cores = total.Seconds() / window.Seconds()
	return u
}

// String reads "19.05 ms per new payment: kasa 4.53, postgres 3.48, temporal 10.71, bench 0.33".
func (u *CPUUse) String() string {
	var total float64
	var parts []string
	for _, class := range slices.Sorted(maps.Keys(u.MS)) {
		total += u.MS[class]
		parts = append(parts, fmt.Sprintf("%s %.2f", class, u.MS[class]))
	}
	return fmt.Sprintf("%.2f ms per %s: %s", total, u.Per, strings.Join(parts, ", "))
}
