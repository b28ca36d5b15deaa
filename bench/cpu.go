package bench

import (
	"context"
	"os"
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

// StackCPU reads from /proc the CPU time of root (class kasa), of every process descended from it
// (PostgreSQL, Temporal), and of this process (class bench). A process's time includes its ended
// children (PostgreSQL's closed backends), except for this process's: pgbench is not the load
// generator. Nil where there is no /proc.
func StackCPU(root int) CPU {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return nil
	}
	self := os.Getpid()
	const tick = 10 * time.Millisecond // USER_HZ, the unit of /proc's CPU times
	return func() map[string]time.Duration {
		stats := readProcs()
		use := map[string]time.Duration{}
		for pid, st := range stats {
			own, children := time.Duration(st.UTime+st.STime)*tick, time.Duration(st.CUTime+st.CSTime)*tick
			switch {
			case pid == self:
				use[ClassBench] += own
			case pid == root:
				use[ClassKasa] += own + children
			case descends(stats, pid, root):
				use[st.Comm] += own + children
			}
		}
		return use
	}
}

// readProcs reads every process's stat. Processes that end while it reads are left out.
func readProcs() map[int]procfs.ProcStat {
	all, _ := procfs.AllProcs()
	stats := make(map[int]procfs.ProcStat, len(all))
	for _, p := range all {
		if st, err := p.Stat(); err == nil {
			stats[p.PID] = st
		}
	}
	return stats
}

// descends says whether pid is a descendant of root.
func descends(stats map[int]procfs.ProcStat, pid, root int) bool {
	for range 64 { // a process tree is shallow; a cycle would be a bug in /proc, not a loop here
		st, ok := stats[pid]
		if !ok || st.PPID <= 1 {
			return false
		}
		if st.PPID == root {
			return true
		}
		pid = st.PPID
	}
	return false
}

// cpuBetween samples cpu at from and at to, and gives each class's CPU time between the two; nil
// when cpu is nil or ctx ends first.
func cpuBetween(ctx context.Context, cpu CPU, from, to time.Time) map[string]time.Duration {
	if cpu == nil || sleep(ctx, time.Until(from)) != nil {
		return nil
	}
	a := cpu()
	if sleep(ctx, time.Until(to)) != nil {
		return nil
	}
	used := map[string]time.Duration{}
	for class, t := range cpu() {
		if d := t - a[class]; d > 0 {
			used[class] = d
		}
	}
	return used
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
