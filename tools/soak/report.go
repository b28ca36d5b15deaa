package soak

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/devenv"
)

// Report is what a soak did and found: bench/results/soak-<date>-<shape>.{md,json}.
type Report struct {
	Started    time.Time `json:"started"`
	Finished   time.Time `json:"finished"`
	Seed       int64     `json:"seed"`
	Duration   string    `json:"duration"`
	Rate       float64   `json:"rate"`
	Shape      string    `json:"shape"`
	Capability string    `json:"capability"`
	Workers    int       `json:"workers"`
	Dir        string    `json:"dir"`
	Replay     string    `json:"replay"` // the command that runs the same schedule and load again

	Plan         []Fault        `json:"plan"`
	Faults       []FaultResult  `json:"faults"`
	FaultsByKind map[string]int `json:"faults_by_kind"` // injected, by kind ("bank_fault:hang", "net_fault:postgres:latency" too)

	Keys         int            `json:"keys"`            // idempotency keys the load made
	Skipped      int            `json:"skipped"`         // keys not sent: too many clients still retrying
	DupNow       int            `json:"dup_concurrent"`  // keys sent twice at once
	DupLate      int            `json:"dup_later"`       // keys sent again after their answer
	RefundKeys   int            `json:"refund_keys"`     // of the keys, refunds of payments that succeeded
	Reused       int            `json:"reused"`          // keys sent again with another request (422 expected)
	Sends        int            `json:"sends"`           // POSTs of payments and refunds made
	LearnedByKey int            `json:"learned_by_key"`  // keys whose payment the client learned only by GET ?idempotency_key
	Expired      int            `json:"expired_answers"` // answers that showed a key's record expired (409 duplicate_payment, 422 for a refund)
	Answers      map[string]int `json:"answers"`         // HTTP status of every POST ("none": no answer)
	Payments     map[string]int `json:"payments"`        // payments and refunds ("refund:succeeded", "manual:canceled:authorization_expired", "manual:refund:succeeded"), by final outcome
	ViaUnknown   int            `json:"via_unknown"`     // payments and refunds that were unknown on their way
	Manual       ManualFigures  `json:"manual"`          // manual payments and their commands

	Reconciles     []ReconcileRun      `json:"reconciles"`    // imports that settled unknown payments
	LiveAfter      string              `json:"live_after"`    // from the faults' end until nothing was processing (the live check's bound at most)
	SettledAfter   string              `json:"settled_after"` // from the faults' end until settling ended: every payment final, or a wait's bound (the settled check says which)
	Deliveries     int                 `json:"webhook_deliveries"`
	Events         int                 `json:"webhook_events"` // distinct event ids
	UnplannedExits map[string][]string `json:"unplanned_exits,omitempty"`

	Checks     []Check  `json:"checks"`
	Unchecked  []string `json:"unchecked,omitempty"` // checks not run, each with why: nothing was there to look at
	CheckedIn  string   `json:"checked_in"`          // how long the checks took, the replays and the histories' included
	Violations int      `json:"violations"`

	// histories are every key's requests, written beside the report when a check failed.
	histories map[string][]op
	written   string // where write put the report, without an extension
}

// ManualFigures are what became of the manual payments and of their captures and cancels.
type ManualFigures struct {
	Keys       int `json:"keys"`       // manual payments' keys
	Authorized int `json:"authorized"` // their payments the bank authorized (answered requires_capture)
	Captures   int `json:"captures"`   // capture keys sent
	Cancels    int `json:"cancels"`    // cancel keys sent
	Refused    int `json:"refused"`    // of those, refused with 409: the payment no longer waited for one
	Captured   int `json:"captured"`   // payments that ended succeeded
	Canceled   int `json:"canceled"`   // canceled by a cancel, or by a capture the bank refused
	Expired    int `json:"expired"`    // canceled at their capture_before
}

// FaultResult is a planned fault as it went.
type FaultResult struct {
	Fault
	Injected bool   `json:"injected"`
	Took     string `json:"took,omitempty"` // from injection to recovery
	Error    string `json:"error,omitempty"`
}

func (r *Report) summarise(ld *load, st *settled, hook *receiver) {
	r.FaultsByKind = map[string]int{}
	for _, f := range r.Faults {
		if !f.Injected {
			continue
		}
		r.FaultsByKind[string(f.Kind)]++
		switch f.Kind {
		case BankFault:
			r.FaultsByKind["bank_fault:"+f.Action]++
			if f.AlsoOn != "" {
				r.FaultsByKind["bank_fault:on:"+f.AlsoOn]++
			}
		case NetFault:
			r.FaultsByKind["net_fault:"+f.Target+":"+f.Toxic]++
		}
	}
	keys := ld.snapshot()
	r.Keys = len(keys)
	r.Answers = map[string]int{}
	for _, k := range keys {
		k.mu.Lock()
		if k.refused {
			r.Manual.Refused++
		}
		for _, o := range k.history {
			if k.expires && (o.Code == "duplicate_payment" || o.Code == "idempotency_key_reused") {
				r.Expired++
			}
		}
		for status, n := range k.Statuses {
			name := strconv.Itoa(status)
			if status == 0 {
				name = "none"
			}
			r.Answers[name] += n
			r.Sends += n
		}
		k.mu.Unlock()
	}
	r.Payments = map[string]int{}
	for _, p := range st.payments {
		outcome := string(p.res.Status)
		if p.res.Status == payment.StatusFailed || p.res.Status == payment.StatusCanceled {
			outcome += ":" + deref(p.res.FailureCode)
		}
		switch {
		case p.refund() && p.key.Of.manual:
			outcome = "manual:refund:" + outcome
		case p.refund():
			outcome = "refund:" + outcome
		case p.key.manual:
			outcome = "manual:" + outcome
			r.Manual.count(p)
		}
		r.Payments[outcome]++
		if p.viaUnknown {
			r.ViaUnknown++
		}
	}
	r.Deliveries, r.Events, _ = hook.stats()
	r.LiveAfter = st.live.Round(time.Second).String()
}

// count adds a settled manual payment to the figures.
func (m *ManualFigures) count(p *paid) {
	if p.answered() == payment.StatusRequiresCapture {
		m.Authorized++
	}
	switch {
	case p.res.Status == payment.StatusSucceeded:
		m.Captured++
	case p.res.Status == payment.StatusCanceled && deref(p.res.FailureCode) == payment.FailureAuthorizationExpired:
		m.Expired++
	case p.res.Status == payment.StatusCanceled:
		m.Canceled++
	}
}

// HistoryFile is where the write into dir puts every key's requests after a failed check ("" when
// it writes none).
func (r *Report) HistoryFile(dir string) string {
	if dir == "" || r.histories == nil {
		return "(not written: no --out)"
	}
	return r.base(dir) + "-history.json"
}

// base is where in dir the report goes, without an extension: soak-<date>-<shape>, or with -2,
// -3... when a report of that name is there; once written, where it went.
func (r *Report) base(dir string) string {
	if r.written == "" {
		return devenv.FreeBase(dir, "soak-"+r.Started.Format(time.DateOnly)+"-"+r.Shape)
	}
	return r.written
}

// write saves the report as <base>.json and .md, and the histories after a failed check.
func (r *Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := r.base(dir)
	r.written = base
	if err := writeJSON(base+".json", r, "  "); err != nil {
		return err
	}
	if r.histories != nil {
		if err := writeJSON(base+"-history.json", map[string]any{"replay": r.Replay, "verdict": r.Checks, "keys": r.histories}, " "); err != nil {
			return err
		}
	}
	var md bytes.Buffer
	r.WriteText(&md)
	return os.WriteFile(base+".md", md.Bytes(), 0o644)
}

func writeJSON(path string, v any, indent string) error {
	b, err := json.MarshalIndent(v, "", indent)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteText writes the report as Markdown.
func (r *Report) WriteText(w io.Writer) {
	verdict := "PASS: no invariant was violated"
	if r.Violations > 0 {
		verdict = fmt.Sprintf("FAIL: %d violation(s)", r.Violations)
	}
	fmt.Fprintf(w, "# Chaos soak %s\n\n%s\n\n", r.Started.Format("2006-01-02 15:04 UTC"), verdict)
	fmt.Fprintf(w, "Seed %d (replay: `%s`), load %s at %g payments/s, "+
		"shape `%s`, capability `%s`, %d workers; finished %s after the start.\n\n",
		r.Seed, r.Replay, r.Duration, r.Rate, r.Shape, r.Capability, r.Workers,
		r.Finished.Sub(r.Started).Round(time.Second))

	fmt.Fprintf(w, "## Invariants\n\n| invariant | result | checked | violations |\n|---|---|---:|---:|\n")
	for _, c := range r.Checks {
		res := "ok"
		switch {
		case !c.OK:
			res = "**VIOLATED**"
		case c.Checked == 0: // held only for want of anything to hold for
			res = "nothing to check"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d |\n", c.Name, res, c.Checked, c.Violations)
	}
	if len(r.Unchecked) > 0 {
		fmt.Fprintf(w, "\nNot checked:\n\n- %s\n", strings.Join(r.Unchecked, "\n- "))
	}
	for _, c := range r.Checks {
		if len(c.Examples) > 0 {
			fmt.Fprintf(w, "\n%s:\n\n- %s\n", c.Name, strings.Join(c.Examples, "\n- "))
		}
	}

	table := func(m map[string]int) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(w, "| %s | %d |\n", k, m[k])
		}
	}
	fmt.Fprintf(w, "\n## Faults injected\n\n| kind | count |\n|---|---:|\n")
	table(r.FaultsByKind)
	var failed []string
	for _, f := range r.Faults {
		if f.Error != "" {
			failed = append(failed, fmt.Sprintf("- %s %s at %s: %s", f.Kind, f.Target, clock(f.At), f.Error))
		}
	}
	if len(failed) > 0 {
		fmt.Fprintf(w, "\nFaults that did not go as planned:\n\n%s\n", strings.Join(failed, "\n"))
	}

	fmt.Fprintf(w, "\n## Payments and refunds\n\n%d keys (%d of them refunds; %d sent twice at once, %d sent again after their answer, %d with another request; %d not sent: too many clients retrying), "+
		"%d requests; %d keys learned their payment only by `GET ?idempotency_key`; %d answers showed a key's record expired.\n\n",
		r.Keys, r.RefundKeys, r.DupNow, r.DupLate, r.Reused, r.Skipped, r.Sends, r.LearnedByKey, r.Expired)
	fmt.Fprintf(w, "| outcome | count |\n|---|---:|\n")
	table(r.Payments)
	fmt.Fprintf(w, "| (of which were `unknown` on the way) | %d |\n", r.ViaUnknown)
	m := r.Manual
	fmt.Fprintf(w, "\nManual payments: %d keys, %d authorized; %d captures and %d cancels sent (%d refused: the payment no longer waited); "+
		"%d captured, %d canceled, %d expired at their `capture_before`.\n", m.Keys, m.Authorized, m.Captures, m.Cancels, m.Refused, m.Captured, m.Canceled, m.Expired)
	fmt.Fprintf(w, "\nAnswers to the POSTs:")
	for _, k := range slices.Sorted(maps.Keys(r.Answers)) {
		fmt.Fprintf(w, " %s ×%d", k, r.Answers[k])
	}
	fmt.Fprintf(w, ".\n\nWebhooks: %d deliveries of %d distinct events. Settlement imports while settling: %d. Nothing was processing %s after the faults ended; settling ended %s after; the checks took %s.\n",
		r.Deliveries, r.Events, len(r.Reconciles), r.LiveAfter, r.SettledAfter, r.CheckedIn)
	if len(r.UnplannedExits) > 0 {
		fmt.Fprintf(w, "\nProcesses that exited without being killed (restarted by the soak):\n\n")
		for _, name := range slices.Sorted(maps.Keys(r.UnplannedExits)) {
			fmt.Fprintf(w, "- %s: %s\n", name, strings.Join(r.UnplannedExits[name], "; "))
		}
	}
	fmt.Fprintf(w, "\n## Fault schedule\n\n```\n")
	PrintPlan(w, r.Plan)
	fmt.Fprintf(w, "```\n")
}
