package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// CPU reads how much CPU time each class of a stack's processes has used so far.
type CPU func() map[string]time.Duration

// Counters reads counters that only grow, such as a database's commits; nil or an error
// leaves a sample out.
type Counters func(ctx context.Context) (map[string]int64, error)

// The process classes CPU reports; any other process of the stack is named by its executable.
const (
	ClassKasa     = "kasa"     // kasa's processes: the measured kasa dev (API, worker, relay, consumer, embedded NATS), or kasa cluster's
	ClassBanksim  = "banksim"  // the bank simulator (kasa banksim), a process of its own: not kasa
	ClassPostgres = "postgres" // PostgreSQL's server processes
	ClassTemporal = "temporal" // the Temporal dev server
	ClassBench    = "bench"    // this process: the load generator, and in a T run its worker
)

// Parts of ClassPostgres's time, not classes: the CPU of the backends connected to kasa's database
// and of those connected to any other (Temporal's, the bench's own counters). What no backend used
// (the postmaster, WAL writer, checkpointer, closed backends) is PostgreSQL's shared time.
const (
	postgresKasa   = "postgres@kasa"
	postgresOthers = "postgres@others"
)

const tick = 10 * time.Millisecond // USER_HZ, the unit of /proc's CPU times

// StackCPU reads from /proc the CPU time of root (class kasa; 0 for none), of its descendants, of
// the beside processes and their descendants (servers started for root rather than by it), and
// of this process (class bench). A process's time includes its ended children (PostgreSQL's closed
// backends), except this process's: pgbench is not the load generator. kasaBackends, if set, maps
// PostgreSQL backends' process ids to whether they serve kasa's database, for the parts
// postgres@kasa and postgres@others. Nil where there is no /proc.
func StackCPU(root int, beside []int, kasaBackends func() map[int]bool) CPU {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return nil
	}
	self := os.Getpid()
	return func() map[string]time.Duration {
		var backends map[int]bool
		if kasaBackends != nil {
			backends = kasaBackends()
		}
		procs := readProcs()
		use := map[string]time.Duration{}
		for pid, p := range procs {
			own, children := time.Duration(p.UTime+p.STime)*tick, time.Duration(p.CUTime+p.CSTime)*tick
			switch {
			case pid == self:
				use[ClassBench] += own
			case pid == root:
				use[ClassKasa] += own + children
			case descends(procs, pid, root) || slices.ContainsFunc(beside, func(b int) bool { return pid == b || descends(procs, pid, b) }):
				use[class(p.Comm, p.args)] += own + children
				if kasa, ok := backends[pid]; ok {
					use[map[bool]string{true: postgresKasa, false: postgresOthers}[kasa]] += own + children
				}
			}
		}
		return use
	}
}

// class is the process class of an executable's name and arguments: the real Temporal Server
// counts as Temporal, kasa's bank simulator as the simulator, and kasa's other commands as kasa
// (whatever the binary is called: kasa, kasa.wt...).
func class(comm string, args []string) string {
	switch {
	case comm == "temporal-server":
		return ClassTemporal
	case isKasa(comm) && len(args) > 1 && args[1] == "banksim":
		return ClassBanksim
	case isKasa(comm):
		return ClassKasa
	}
	return comm
}

func isKasa(comm string) bool { return strings.HasPrefix(comm, "kasa") }

// proc is a process's stat, and its arguments when kasa's (its class depends on them).
type proc struct {
	procfs.ProcStat
	args []string
}

// readProcs reads every process's stat, but of those that end while it reads.
func readProcs() map[int]proc {
	all, _ := procfs.AllProcs()
	procs := make(map[int]proc, len(all))
	for _, p := range all {
		if st, err := p.Stat(); err == nil {
			var args []string
			if isKasa(st.Comm) {
				args, _ = p.CmdLine()
			}
			procs[p.PID] = proc{st, args}
		}
	}
	return procs
}

func descends(procs map[int]proc, pid, root int) bool {
	for range 64 { // a process tree is shallow; a cycle would be a bug in /proc, not a loop here
		p, ok := procs[pid]
		if !ok || p.PPID <= 1 {
			return false
		}
		if p.PPID == root {
			return true
		}
		pid = p.PPID
	}
	return false
}

// childrenCPU is the CPU time of this process's ended children (pgbench, psql).
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sampleBetween samples cpu and counters at from and at to, and gives each class's CPU time and
// each counter's growth between the two; nil for what is nil, failed, or when ctx ends first.
func sampleBetween(ctx context.Context, cpu CPU, counters Counters, from, to time.Time,
) (used map[string]time.Duration, grew map[string]int64) {
	if (cpu == nil && counters == nil) || sleep(ctx, time.Until(from)) != nil {
		return nil, nil
	}
	sample := func() (t map[string]time.Duration, c map[string]int64) {
		if cpu != nil {
			t = cpu()
		}
		if counters != nil {
			if n, err := counters(ctx); err == nil {
				c = n
			}
		}
		return t, c
	}
	ta, ca := sample()
	if sleep(ctx, time.Until(to)) != nil {
		return nil, nil
	}
	tb, cb := sample()
	used = growth(ta, tb)
	maps.DeleteFunc(used, func(_ string, d time.Duration) bool { return d <= 0 })
	if ca != nil && cb != nil {
		grew = growth(ca, cb)
	}
	return used, grew
}

func growth[V int64 | time.Duration](before, after map[string]V) map[string]V {
	out := make(map[string]V, len(after))
	for k, v := range after {
		out[k] = v - before[k]
	}
	return out
}

// perOp divides each counter's growth among ops operations; empty without any.
func perOp(grew map[string]int64, ops int64) map[string]float64 {
	out := map[string]float64{}
	for name, n := range grew {
		if ops > 0 {
			out[name] = float64(n) / float64(ops)
		}
	}
	return out
}

// CPUUse is the CPU a run's window cost, by process class.
type CPUUse struct {
	Per   string             `json:"per"`   // the operation: "new payment", "workflow" or "request"
	MS    map[string]float64 `json:"ms"`    // CPU milliseconds per operation, by process class
	Cores float64            `json:"cores"` // all classes together: cores busy on average over the window
	// PostgresBackends splits part of MS["postgres"] by the database the backends served
	// ("kasa", "others"); the rest is PostgreSQL's shared time. Absent without that split.
	PostgresBackends map[string]float64 `json:"postgres_backends_ms,omitempty"`
	Own              OwnCPU             `json:"kasa_own"`
}

// OwnTarget is the most kasa's own CPU per payment may be, as a share of Temporal's.
const OwnTarget = 0.5

// OwnCPU is kasa's own CPU per operation: kasa's processes (ClassKasa, and a NATS server of the
// stack) and kasa's part of PostgreSQL; never Temporal, the bank simulator or the load generator.
// Kasa's part of PostgreSQL is its backends' time and the shared time in the proportion of its
// backends' to all backends' (all of PostgreSQL's time without a split by database).
type OwnCPU struct {
	MS       float64 `json:"ms"`          // kasa's own CPU milliseconds per operation
	Postgres float64 `json:"postgres_ms"` // of which kasa's part of PostgreSQL
	Ratio    float64 `json:"to_temporal"` // MS ÷ Temporal's milliseconds per operation; 0 without Temporal
	Target   float64 `json:"target"`      // OwnTarget
	Met      bool    `json:"met"`         // Ratio ≤ Target, with Temporal measured
}

// cpuUse divides the window's CPU among its operations; nil without a measurement or operations.
func cpuUse(used map[string]time.Duration, window time.Duration, per string, ops int64) *CPUUse {
	if len(used) == 0 || ops <= 0 || window <= 0 {
		return nil
	}
	u := &CPUUse{Per: per, MS: map[string]float64{}}
	perOp := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(ops) }
	var total time.Duration
	for class, d := range used {
		if part, ok := strings.CutPrefix(class, "postgres@"); ok {
			if u.PostgresBackends == nil {
				u.PostgresBackends = map[string]float64{}
			}
			u.PostgresBackends[part] = perOp(d)
			continue
		}
		u.MS[class] = perOp(d)
		total += d
	}
	u.Cores = total.Seconds() / window.Seconds()
	pg := u.MS[ClassPostgres]
	if b := u.PostgresBackends; b != nil {
		kasa, backends := b["kasa"], b["kasa"]+b["others"]
		pg = kasa
		if backends > 0 {
			pg += max(u.MS[ClassPostgres]-backends, 0) * kasa / backends
		}
	}
	u.Own = OwnCPU{MS: u.MS[ClassKasa] + u.MS["nats-server"] + pg, Postgres: pg, Target: OwnTarget}
	if t := u.MS[ClassTemporal]; t > 0 {
		u.Own.Ratio = u.Own.MS / t
		u.Own.Met = u.Own.Ratio <= OwnTarget
	}
	return u
}

// LoadAvg is the machine's load average over 1, 5 and 15 minutes: other work skews every figure.
func LoadAvg() string {
	l, err := procfs.NewDefaultFS()
	if err == nil {
		if a, err := l.LoadAvg(); err == nil {
			return fmt.Sprintf("%.2f %.2f %.2f", a.Load1, a.Load5, a.Load15)
		}
	}
	return "?"
}
