package reconcile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWriteText(t *testing.T) {
	r := &Report{
		Days: []Day{"2025-03-01", "2025-03-02"}, Lines: 3, Scope: ScopeAll, ChargesCovered: true,
		Counts: Counts{Matched: 1, ResolvedCharged: 1, Pending: 1, Mismatches: 1},
		Mismatches: []Mismatch{{Kind: KindAmountDiffers, Line: 2, Reference: "ref-2", WorkflowID: "payment/m/k2",
			Expected: "succeeded 10.00 TRY", Found: "settled 11.00 TRY"}},
		Pending: []Pending{{Reason: ReasonProcessing, Line: 3, Reference: "ref-3", Status: "processing", Detail: "still running"}},
	}
	var b strings.Builder
	r.WriteText(&b, "s.csv")
	require.Equal(t, `reconcile s.csv: 3 line(s), covering 2025-03-01, 2025-03-02 (all merchants)
complete: none (no trailer: unlisted unknown payments and refunds are not released)
refunds: not covered (the file does not declare them: scope row scope,<merchants>,charge refund)
                           payments  refunds
  lines                           3        0
  matched                         1        0
  resolved as charged             1        0
  resolved as not charged         0        0
  pending                         1        0
  mismatches                      1        0

mismatches (nothing was changed for these; a person must look):
  line 2    amount_differs             reference ref-2
            workflow  payment/m/k2
            kasa:     succeeded 10.00 TRY
            bank:     settled 11.00 TRY

pending (not a mismatch; reconcile again later):
  line 3    processing                 ref-3 (processing) still running

result: NOT OK, 1 unresolved mismatch(es)
`, b.String())

	b.Reset()
	(&Report{Scope: ScopeMerchants, Merchants: []string{"m1"}, ChargesCovered: true}).WriteText(&b, "-")
	require.Equal(t, `reconcile -: 0 line(s), covering none (the file has no lines; declare the day with a trailer or --date) (merchants m1)
complete: none (no trailer: unlisted unknown payments and refunds are not released)
refunds: not covered (the file does not declare them: scope row scope,<merchants>,charge refund)
                           payments  refunds
  lines                           0        0
  matched                         0        0
  resolved as charged             0        0
  resolved as not charged         0        0
  pending                         0        0
  mismatches                      0        0

result: OK
`, b.String())

	b.Reset()
	(&Report{Scope: ScopeNone, ChargesCovered: true}).WriteText(&b, "-")
	require.Contains(t, b.String(), "(no scope declared: nothing unlisted is released)")

	b.Reset()
	(&Report{DryRun: true, Days: []Day{"2025-03-01"}, Lines: 1, RefundLines: 1, Scope: ScopeAll, ChargesCovered: true, RefundsCovered: true,
		Complete: []Completeness{{Day: "2025-03-01", AsOf: time.Date(2025, 3, 2, 0, 5, 0, 0, time.UTC)}},
		Counts:   Counts{ResolvedCharged: 1, ResolvedNotCharged: 1, RefundPending: 1, RefundMismatches: 1},
		Resolved: []Resolution{{Outcome: "charged", Line: 2, Reference: "ref-2", WorkflowID: "payment/m/k2"},
			{Outcome: "not_charged", Reference: "ref-9", WorkflowID: "payment/m/k9"}},
		RefundMismatches: []Mismatch{{Kind: KindRefundedButFailed, Line: 3, Reference: "rf-3", RefundID: "rf-3", WorkflowID: "refund/m/r3",
			Expected: "failed (declined) 1.00 TRY", Found: "settled 1.00 TRY on 2025-03-01, refund bank-3"}},
		RefundPending: []Pending{{Reason: ReasonBookingWindow, Reference: "rf-8", Status: "unknown", Detail: "wait"}},
	}).WriteText(&b, "s.csv")
	require.Equal(t, `DRY RUN: nothing was changed; this is what the import would do
reconcile s.csv: 2 line(s), covering 2025-03-01 (all merchants)
complete: 2025-03-01 as of 2025-03-02T00:05:00.000000Z
                           payments  refunds
  lines                           1        1
  matched                         0        0
  resolved as charged             1        0
  resolved as not charged         1        0
  pending                         0        1
  mismatches                      0        1

would settle:
  line 2    charged                    ref-2 (workflow payment/m/k2)
  coverage  not_charged                ref-9 (workflow payment/m/k9)

refund mismatches (nothing was changed for these; a person must look):
  line 3    refunded_but_failed        reference rf-3
            workflow  refund/m/r3
            kasa:     failed (declined) 1.00 TRY
            bank:     settled 1.00 TRY on 2025-03-01, refund bank-3

refund pending (not a mismatch; reconcile again later):
  coverage  booking_window_open        rf-8 (unknown) wait

result (dry run, nothing changed): NOT OK, 1 unresolved mismatch(es)
`, b.String())
}

func TestProgressBarIsSilentOffTerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "progress"))
	require.NoError(t, err)
	defer f.Close()
	bar := NewProgressBar(f, 10)
	bar.Update(5, 10)
	bar.Update(10, 10)
	bar.Done()
	fi, err := f.Stat()
	require.NoError(t, err)
	require.Zero(t, fi.Size())
}
