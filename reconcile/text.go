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

// WriteText writes the report for a person at a terminal: the counts, then every mismatch and
// pending payment with where it came from. name is the settlement file's name.
func (r *Report) WriteText(w io.Writer, name string) {
	days := make([]string, len(r.Days))
	for i, d := range r.Days {
		days[i] = string(d)
	}
	scope := "all merchants"
	if len(r.Merchants) > 0 {
		scope = "merchants " + strings.Join(r.Merchants, ", ")
	}
	covered := strings.Join(days, ", ")
	if covered == "" {
		covered = "none (the file has no lines; declare the day with a trailer or --date)"
	}
	if r.DryRun {
		fmt.Fprintln(w, "DRY RUN: nothing was changed; this is what the import would do")
	}
	fmt.Fprintf(w, "reconcile %s: %d line(s), covering %s (%s)\n", name, r.Lines, covered, scope)
	complete := make([]string, len(r.Complete))
	for i, c := range r.Complete {
		complete[i] = string(c.Day) + " as of " + payment.FormatTime(c.AsOf)
	}
	if len(complete) == 0 {
		complete = []string{"none (no trailer: unlisted unknown payments are not released)"}
	}
	fmt.Fprintf(w, "complete: %s\n", strings.Join(complete, ", "))
	c := r.Counts
	for _, row := range []struct {
		name string
		n    int
	}{
		{"matched", c.Matched}, {"resolved as charged", c.ResolvedCharged}, {"resolved as not charged", c.ResolvedNotCharged},
		{"pending", c.Pending}, {"mismatches", c.Mismatches},
	} {
		fmt.Fprintf(w, "  %-24s %d\n", row.name, row.n)
	}
	if r.RefundLines > 0 {
		fmt.Fprintf(w, "  %-24s %d (set aside: refunds are not reconciled yet)\n", "refund lines", r.RefundLines)
	}
	if len(r.Resolved) > 0 {
		verb := "settled"
		if r.DryRun {
			verb = "would settle"
		}
		fmt.Fprintf(w, "\n%s:\n", verb)
		for _, s := range r.Resolved {
			where := "coverage"
			if s.Line > 0 {
				where = fmt.Sprintf("line %d", s.Line)
			}
			fmt.Fprintf(w, "  %-9s %-26s %s (workflow %s)\n", where, s.Outcome, s.Reference, s.WorkflowID)
		}
	}
	if len(r.Mismatches) > 0 {
		fmt.Fprintln(w, "\nmismatches (nothing was changed for these; a person must look):")
		for _, m := range r.Mismatches {
			where := "coverage"
			if m.Line > 0 {
				where = fmt.Sprintf("line %d", m.Line)
			}
			fmt.Fprintf(w, "  %-9s %-26s reference %s\n", where, m.Kind, m.Reference)
			if m.WorkflowID != "" {
				fmt.Fprintf(w, "            workflow  %s\n", m.WorkflowID)
			}
			fmt.Fprintf(w, "            kasa:     %s\n            bank:     %s\n", m.Expected, m.Found)
		}
	}
	if len(r.Pending) > 0 {
		fmt.Fprintln(w, "\npending (not a mismatch; reconcile again later):")
		for _, p := range r.Pending {
			where := "coverage"
			if p.Line > 0 {
				where = fmt.Sprintf("line %d", p.Line)
			}
			fmt.Fprintf(w, "  %-9s %-26s %s (%s) %s\n", where, p.Reason, p.Reference, p.Status, p.Detail)
		}
	}
	result := "result"
	if r.DryRun {
		result = "result (dry run, nothing changed)"
	}
	if r.OK() {
		fmt.Fprintf(w, "\n%s: OK\n", result)
	} else {
		fmt.Fprintf(w, "\n%s: NOT OK, %d unresolved mismatch(es)\n", result, len(r.Mismatches))
	}
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
