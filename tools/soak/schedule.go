package soak

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind is a sort of fault the soak injects.
type Kind string

// The kinds of fault. Every one is undone when its duration has passed.
const (
	KillWorker      Kind = "kill_worker"      // SIGKILL one `kasa worker`, restart it after the duration
	KillAPI         Kind = "kill_api"         // SIGKILL `kasa api`, restart it after the duration
	KillRelay       Kind = "kill_relay"       // SIGKILL `kasa relay`, restart it after the duration
	RestartPostgres Kind = "restart_postgres" // immediate shutdown (crash recovery on start), down for the duration
	RestartTemporal Kind = "restart_temporal" // SIGKILL the dev server, down for the duration
	BankFault       Kind = "bank_fault"       // a fault rule at the simulator for the duration
	NetFault        Kind = "net_fault"        // a toxic on a link (kasa–PostgreSQL or worker–bank) for the duration
	SettingsSplit   Kind = "settings_split"   // start one more `kasa worker` with another capability: it must refuse to start
	LoseBroker      Kind = "lose_broker"      // cluster shape: SIGKILL the NATS server and delete its store, restart it after the duration
)

// Kinds lists every kind of the dev shape, in the order reports show them; the cluster shape adds
// ClusterKinds.
var Kinds = []Kind{KillWorker, KillAPI, KillRelay, RestartPostgres, RestartTemporal, BankFault, NetFault, SettingsSplit}

// ClusterKinds are the kinds only the cluster shape has: it alone runs a broker of its own.
var ClusterKinds = []Kind{LoseBroker}

// kindSpec says how often a kind is drawn (relative weight), how long it lasts, and its target
// unless one is drawn for each fault.
type kindSpec struct {
	weight   int
	min, max time.Duration
	target   string
}

var kindSpecs = map[Kind]kindSpec{
	KillWorker:      {4, 500 * time.Millisecond, 4 * time.Second, ""},
	KillAPI:         {3, 500 * time.Millisecond, 4 * time.Second, "api"},
	KillRelay:       {2, 500 * time.Millisecond, 4 * time.Second, "relay"},
	RestartPostgres: {2, 1 * time.Second, 5 * time.Second, "postgres"},
	RestartTemporal: {2, 1 * time.Second, 5 * time.Second, "temporal"},
	BankFault:       {5, 4 * time.Second, 15 * time.Second, "bank"},
	NetFault:        {5, 3 * time.Second, 10 * time.Second, ""},
	SettingsSplit:   {1, 20 * time.Second, 20 * time.Second, "worker-split"}, // the time the worker has to refuse
	LoseBroker:      {2, 1 * time.Second, 5 * time.Second, "nats"},
}

// BankAction is one fault action of the simulator (PUT /_sim/faults): the request kinds it
// applies to and whether it needs a delay.
type BankAction struct {
	Name     string
	On       []string // "charge", "inquiry", "refund"
	Delay    bool     // the rule carries delay_ms
	MinDelay time.Duration
	MaxDelay time.Duration
}

// BankActions are the simulator's fault actions the soak draws from (docs/api.md lists them).
var BankActions = []BankAction{
	{Name: "drop_response", On: []string{"charge", "inquiry", "refund"}},
	{Name: "error_500", On: []string{"charge", "inquiry", "refund"}},
	{Name: "delay", On: []string{"charge", "inquiry", "refund"}, Delay: true, MinDelay: 500 * time.Millisecond, MaxDelay: 3 * time.Second},
	{Name: "decline", On: []string{"charge", "refund"}},
	{Name: "hang", On: []string{"charge", "inquiry", "refund"}},
	{Name: "late_booking", On: []string{"charge", "inquiry", "refund"}, Delay: true, MinDelay: 500 * time.Millisecond, MaxDelay: 4 * time.Second},
	{Name: "error_409", On: []string{"charge", "inquiry", "refund"}},
	{Name: "error_503", On: []string{"charge", "inquiry", "refund"}},
	{Name: "error_429", On: []string{"charge", "inquiry", "refund"}},
	{Name: "garbage", On: []string{"charge", "inquiry", "refund"}},
}

// ManualOn are a manual payment's requests to the bank: each bank fault hits one of them too,
// drawn from a stream of its own so that the rest of a seed's schedule is unchanged.
var ManualOn = []string{"authorize", "capture", "void"}

// Links are the network paths the soak puts toxics on.
const (
	LinkPostgres = "postgres" // every kasa process → PostgreSQL
	LinkBank     = "bank"     // the workers → the bank simulator
)

// Toxics are the toxiproxy toxics the soak draws from for a network fault.
var Toxics = []string{"latency", "timeout", "reset_peer"}

// toxicMS is the range a toxic's parameter is drawn from, in milliseconds: [from, from+n).
var toxicMS = map[string]struct{ from, n int }{"latency": {100, 1400}, "timeout": {500, 2500}, "reset_peer": {0, 200}}

// Fault is one planned fault.
type Fault struct {
	At       time.Duration `json:"at"` // offset from the start of the load
	Kind     Kind          `json:"kind"`
	Target   string        `json:"target"` // worker-1, api, postgres, bank, link name...
	Duration time.Duration `json:"duration"`
	// Bank faults: the simulator rule, on On and on AlsoOn (a manual payment's request).
	On          string  `json:"on,omitempty"`
	AlsoOn      string  `json:"also_on,omitempty"`
	Action      string  `json:"action,omitempty"`
	DelayMS     int     `json:"delay_ms,omitempty"`
	Probability float64 `json:"probability,omitempty"`
	// Network faults: the toxic, its direction and parameter (latency, or the delay before a
	// close), and the share of connections it hits.
	Toxic    string  `json:"toxic,omitempty"`
	Stream   string  `json:"stream,omitempty"`
	ToxicMS  int     `json:"toxic_ms,omitempty"`
	Toxicity float64 `json:"toxicity,omitempty"`
}

// Detail is the fault's parameters in a few words.
func (f Fault) Detail() string {
	switch f.Kind {
	case BankFault:
		on := f.On
		if f.AlsoOn != "" {
			on += "+" + f.AlsoOn
		}
		s := fmt.Sprintf("%s on %s p=%.2f", f.Action, on, f.Probability)
		if f.DelayMS > 0 {
			s += fmt.Sprintf(" delay=%dms", f.DelayMS)
		}
		return s
	case NetFault:
		return fmt.Sprintf("%s %s %dms toxicity=%.2f", f.Toxic, f.Stream, f.ToxicMS, f.Toxicity)
	}
	return ""
}

func (f Fault) String() string {
	return strings.TrimRight(fmt.Sprintf("%8s  %-16s %-9s %6s  %s", clock(f.At), f.Kind, f.Target,
		f.Duration.Round(100*time.Millisecond), f.Detail()), " ")
}

// clock renders an offset as m:ss.d.
func clock(d time.Duration) string {
	d = d.Round(100 * time.Millisecond)
	return fmt.Sprintf("%d:%04.1f", int(d.Minutes()), (d % time.Minute).Seconds())
}

// PlanOptions are what a schedule depends on: the same options and seed give the same schedule.
type PlanOptions struct {
	Seed     int64
	Duration time.Duration // of the load
	Warmup   time.Duration // no fault before this
	Quiet    time.Duration // no fault in the last Quiet of the load
	MinGap   time.Duration // between two fault starts
	MaxGap   time.Duration
	Kinds    []Kind // the kinds drawn from; empty: all of the shape's
	Workers  int    // how many `kasa worker` processes there are
	Cluster  bool   // the cluster shape: two APIs (api-1, api-2), and a broker to lose
}

// Plan draws the fault schedule. Two faults never hold one target at once (the simulator has one
// set of rules, a link one toxic).
func Plan(o PlanOptions) []Fault {
	rng := rand.New(rand.NewPCG(uint64(o.Seed), 0x736f616b))    // "soak"
	manual := rand.New(rand.NewPCG(uint64(o.Seed), 0x6d616e75)) // "manu": ManualOn's draws
	kinds := o.Kinds
	if len(kinds) == 0 && o.Cluster {
		kinds = slices.Concat(Kinds, ClusterKinds)
	} else if len(kinds) == 0 {
		kinds = Kinds
	}
	end := o.Duration - o.Quiet
	busy := map[string]time.Duration{} // target → when it is free again
	var plan []Fault
	for at := o.Warmup + between(rng, o.MinGap, o.MaxGap); at < end; at += between(rng, o.MinGap, o.MaxGap) {
		f := Fault{At: at, Kind: pick(rng, kinds)}
		spec := kindSpecs[f.Kind]
		f.Duration, f.Target = between(rng, spec.min, spec.max), spec.target
		switch f.Kind {
		case KillWorker:
			f.Target = fmt.Sprintf("worker-%d", 1+rng.IntN(max(o.Workers, 1)))
		case KillAPI:
			if o.Cluster {
				f.Target = fmt.Sprintf("api-%d", 1+rng.IntN(2))
			}
		case BankFault:
			a := BankActions[rng.IntN(len(BankActions))]
			f.Action, f.On = a.Name, a.On[rng.IntN(len(a.On))]
			f.AlsoOn = ManualOn[manual.IntN(len(ManualOn))]
			f.Probability = round2(0.2 + 0.4*rng.Float64())
			if a.Delay {
				f.DelayMS = int(between(rng, a.MinDelay, a.MaxDelay).Milliseconds())
			}
		case NetFault:
			f.Target = []string{LinkPostgres, LinkBank}[rng.IntN(2)]
			f.Toxic = Toxics[rng.IntN(len(Toxics))]
			f.Stream = []string{"upstream", "downstream"}[rng.IntN(2)]
			f.Toxicity = round2(0.3 + 0.5*rng.Float64())
			f.ToxicMS = toxicMS[f.Toxic].from + rng.IntN(toxicMS[f.Toxic].n)
		}
		if at+f.Duration > end || busy[f.Target] > at {
			continue // would outlast the fault window, or the target is taken: no fault this turn
		}
		busy[f.Target] = at + f.Duration
		plan = append(plan, f)
	}
	return plan
}

// PrintPlan writes the schedule, one line per fault.
func PrintPlan(w io.Writer, plan []Fault) {
	fmt.Fprintf(w, "%8s  %-16s %-9s %6s  %s\n", "at", "kind", "target", "for", "detail")
	for _, f := range plan {
		fmt.Fprintln(w, f.String())
	}
}

// ParseKinds reads a comma-separated list of kinds; empty means all.
func ParseKinds(s string) ([]Kind, error) {
	if s == "" {
		return nil, nil
	}
	var out []Kind
	for _, name := range strings.Split(s, ",") {
		k := Kind(strings.TrimSpace(name))
		if !slices.Contains(Kinds, k) && !slices.Contains(ClusterKinds, k) {
			return nil, fmt.Errorf("unknown fault kind %q (want some of %v, or in the cluster shape %v)", k, Kinds, ClusterKinds)
		}
		out = append(out, k)
	}
	return out, nil
}

// pick draws one of kinds by their weights.
func pick(rng *rand.Rand, kinds []Kind) Kind {
	total := 0
	for _, k := range kinds {
		total += kindSpecs[k].weight
	}
	n := rng.IntN(total)
	for _, k := range kinds {
		if n -= kindSpecs[k].weight; n < 0 {
			return k
		}
	}
	return kinds[len(kinds)-1]
}

// between is a uniform duration in [lo, hi], to the millisecond.
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return (lo + time.Duration(rng.Int64N(int64(hi-lo)))).Round(time.Millisecond)
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }
