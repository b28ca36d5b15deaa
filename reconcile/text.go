package reconcile

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kasa-pay/kasa/payment"
)

// WriteText writes the report for a person at a terminal: the counts of payments and refunds
// side by side, then every settlement, mismatch and pending one with where it came from. name
// is the settlement file's name.
func (r *Report) WriteText(w io.Writer, name string) {
	days := make([]string, len(r.Days))
	for i, d := range r.Days {
		days[i] = string(d)
	}
	var scope string
	switch {
	case r.Scope == ScopeAll:
		scope = "all merchants"
	case r.Scope == ScopeMerchants && len(r.Merchants) > 0:
		scope = "merchants " + strings.Join(r.Merchants, ", ")
	case r.Scope == ScopeMerchants:
		scope = "no merchant: the import and the file declare none in common"
	default:
		scope = "no scope declared: nothing unlisted is released"
	}
	covered := strings.Join(days, ", ")
	if covered == "" {
		covered = "none (the file has no lines; declare the day with a trailer or --date)"
	}
	if r.DryRun {
		fmt.Fprintln(w, "DRY RUN: nothing was changed; this is what the import would do")
	}
	fmt.Fprintf(w, "reconcile %s: %d line(s), covering %s (%s)\n", name, r.Lines+r.RefundLines, covered, scope)
	complete := make([]string, len(r.Complete))
	for i, c := range r.Complete {
		complete[i] = string(c.Day) + " as of " + payment.FormatTime(c.AsOf)
	}
	if len(complete) == 0 {
		complete = []string{"none (no trailer: unlisted unknown payments and refunds are not released)"}
	}
	fmt.Fprintf(w, "complete: %s\n", strings.Join(complete, ", "))
	if !r.ChargesCovered && r.Scope != ScopeNone && r.Scope != "" {
		fmt.Fprintln(w, "charges: not covered (the file's scope row declares refunds only)")
	}
	if !r.RefundsCovered {
		fmt.Fprintln(w, "refunds: not covered (the file does not declare them: scope row scope,<merchants>,charge refund)")
	}
	c := r.Counts
	fmt.Fprintf(w, "  %-24s %8s %8s\n", "", "payments", "refunds")
	for _, row := range []struct {
		name              string
		payments, refunds int
	}{
		{"lines", r.Lines, r.RefundLines},
		{"matched", c.Matched, c.RefundMatched}, {"resolved as charged", c.ResolvedCharged, c.RefundResolvedCharged},
		{"resolved as not charged", c.ResolvedNotCharged, c.RefundResolvedNotCharged},
		{"pending", c.Pending, c.RefundPending}, {"mismatches", c.Mismatches, c.RefundMismatches},
	} {
		fmt.Fprintf(w, "  %-24s %8d %8d\n", row.name, row.payments, row.refunds)
	}
	for _, k := range []struct {
		prefix     string
		resolved   []Resolution
		mismatches []Mismatch
		pending    []Pending
	}{{"", r.Resolved, r.Mismatches, r.Pending}, {"refund ", r.RefundResolved, r.RefundMismatches, r.RefundPending}} {
		writeEntries(w, r.DryRun, k.prefix, k.resolved, k.mismatches, k.pending)
	}
	result := "result"
	if r.DryRun {
		result = "result (dry run, nothing changed)"
	}
	if n := len(r.Mismatches) + len(r.RefundMismatches); n == 0 {
		fmt.Fprintf(w, "\n%s: OK\n", result)
	} else {
		fmt.Fprintf(w, "\n%s: NOT OK, %d unresolved mismatch(es)\n", result, n)
	}
}

// writeEntries writes the settlements, mismatches and pending entries of payments (prefix "")
// or refunds (prefix "refund ").
func writeEntries(w io.Writer, dry bool, prefix string, resolved []Resolution, mismatches []Mismatch, pending []Pending) {
	if len(resolved) > 0 {
		verb := "settled"
		if dry {
			verb = "would settle"
		}
		if prefix != "" {
			verb = "refunds " + verb
		}
		fmt.Fprintf(w, "\n%s:\n", verb)
		for _, s := range resolved {
			fmt.Fprintf(w, "  %-9s %-26s %s (workflow %s)\n", where(s.Line), s.Outcome, s.Reference, s.WorkflowID)
		}
	}
	if len(mismatches) > 0 {
		fmt.Fprintf(w, "\n%smismatches (nothing was changed for these; a person must look):\n", prefix)
		for _, m := range mismatches {
			fmt.Fprintf(w, "  %-9s %-26s reference %s\n", where(m.Line), m.Kind, m.Reference)
			if m.WorkflowID != "" {
				fmt.Fprintf(w, "            workflow  %s\n", m.WorkflowID)
			}
			fmt.Fprintf(w, "            kasa:     %s\n            bank:     %s\n", m.Expected, m.Found)
		}
	}
	if len(pending) > 0 {
		fmt.Fprintf(w, "\n%spending (not a mismatch; reconcile again later):\n", prefix)
		for _, p := range pending {
			fmt.Fprintf(w, "  %-9s %-26s %s (%s) %s\n", where(p.Line), p.Reason, p.Reference, p.Status, p.Detail)
		}
	}
}

func where(line int) string {
	if line > 0 {
		return fmt.Sprintf("line %d", line)
	}
	return "coverage"
}

// ProgressBar shows an import's progress (Options.Progress) on a terminal; elsewhere it is silent.
type ProgressBar struct {
	w     io.Writer
	total int
	on    bool
	mu    sync.Mutex
	last  time.Time
}

// NewProgressBar draws on f if f is a terminal, for an import of total lines.
func NewProgressBar(f *os.File, total int) *ProgressBar {
	fi, err := f.Stat()
	on := err == nil && fi.Mode()&os.ModeCharDevice != 0 && total > 0
	return &ProgressBar{w: f, total: total, on: on}
}

// Update redraws the bar, at most every 100ms until the last line; it is an Options.Progress.
func (p *ProgressBar) Update(done, total int) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if done < total && time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	const width = 40
	filled := width * done / max(total, 1)
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d lines", strings.Repeat("=", filled), strings.Repeat(" ", width-filled), done, total)
}

// Done clears the bar.
func (p *ProgressBar) Done() {
	if p.on {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
