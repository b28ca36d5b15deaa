package reconcile

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

func refundLine(n int, r payment.Refund, d Day) Line {
	return Line{Number: n, SettlementDate: d, ProviderChargeID: "rf_" + r.ID.String()[:8], Reference: r.ID,
		AmountMinor: r.AmountMinor, Currency: r.Currency, Status: StatusSettled, Type: TypeRefund}
}

// typedFile is a file with the type column, complete for each of days (as fileOf), whose scope
// row declares it covers every merchant's charges and refunds.
func typedFile(lines []Line, days ...Day) *File {
	f := fileOf(lines, days...)
	f.Typed = true
	f.Scope = everything()
	return f
}

// everything is the scope of a file covering every merchant's charges and refunds.
func everything() *Scope { return &Scope{AllMerchants: true, Charges: true, Refunds: true} }

// refundCounts is the refund half of Counts.
func refundCounts(matched, charged, notCharged, pending, mismatches int) Counts {
	return Counts{RefundMatched: matched, RefundResolvedCharged: charged, RefundResolvedNotCharged: notCharged,
		RefundPending: pending, RefundMismatches: mismatches}
}

// Refunds are reconciled exactly as payments are: every case, one refund at a time, with its
// effect on the refund and what the report says.
func TestReconcileRefunds(t *testing.T) {
	t.Parallel()
	const window = 30 * time.Second
	const d = Day("2025-03-01")
	created, changed := day.Add(10*time.Hour), day.Add(10*time.Hour+time.Minute)
	now := time.Now().UTC()
	tests := []struct {
		name             string
		status           payment.Status // the refund's
		created, changed time.Time
		// line alters the refund's line, or returns false for a file that does not list it
		line func(l *Line, r payment.Refund, payments *fakeBank) bool
		file func(lines []Line) *File
		days []Day // declared
		// want is "charged" / "not_charged" (settled), "matched", "untouched", a mismatch kind or a pending reason
		want string
	}{
		{name: "unknown, listed: refunded", status: payment.StatusUnknown, want: workflows.OutcomeCharged},
		{name: "unknown, not listed, complete day: not refunded", status: payment.StatusUnknown, line: unlisted, want: workflows.OutcomeNotCharged},
		{name: "unknown, not listed, no trailer", status: payment.StatusUnknown, line: unlisted,
			file: func(ls []Line) *File { return &File{Lines: ls, Typed: true, Scope: everything()} }, days: []Day{d}, want: ReasonFileNotComplete},
		{name: "unknown, not listed, file made within the booking window", status: payment.StatusUnknown, line: unlisted,
			file: func(ls []Line) *File {
				return &File{Lines: ls, Typed: true, Scope: everything(), Trailers: []Trailer{{Day: d, AsOf: changed.Add(window - time.Second)}}}
			}, want: ReasonBookingWindow},
		{name: "unknown, not listed, younger than the booking window", status: payment.StatusUnknown,
			created: now.Add(-2 * time.Second), changed: now.Add(-time.Second), line: unlisted,
			file: func(ls []Line) *File {
				return &File{Typed: true, Scope: everything(), Trailers: []Trailer{{Day: DayOf(now.AddDate(0, 0, -1)), AsOf: now.Add(time.Hour)}, {Day: DayOf(now), AsOf: now.Add(time.Hour)}}}
			}, want: ReasonBookingWindow},
		{name: "unknown, not listed, older than the booking window", status: payment.StatusUnknown,
			created: now.Add(-window - 2*time.Second), changed: now.Add(-window - time.Second), line: unlisted,
			file: func(ls []Line) *File {
				return &File{Typed: true, Scope: everything(), Trailers: []Trailer{{Day: DayOf(now.AddDate(0, 0, -1)), AsOf: now.Add(time.Hour)}, {Day: DayOf(now), AsOf: now.Add(time.Hour)}}}
			}, want: workflows.OutcomeNotCharged},
		{name: "unknown, not listed, window past midnight", status: payment.StatusUnknown,
			changed: d.End().Add(-window / 2), line: unlisted, want: ReasonWindowNotCovered},
		{name: "unknown, not listed, file without the type column", status: payment.StatusUnknown, line: unlisted,
			file: func(ls []Line) *File { f := typedFile(ls, d); f.Typed, f.Scope.Refunds = false, false; return f }, want: "untouched"},
		{name: "unknown, listed, another amount", status: payment.StatusUnknown,
			line: func(l *Line, _ payment.Refund, _ *fakeBank) bool { l.AmountMinor++; return true }, want: KindAmountDiffers},
		{name: "unknown, listed, another currency", status: payment.StatusUnknown,
			line: func(l *Line, _ payment.Refund, _ *fakeBank) bool { l.Currency = "EUR"; return true }, want: KindCurrencyDiffers},
		{name: "failed, listed", status: payment.StatusFailed, want: KindRefundedButFailed},
		{name: "failed, not listed", status: payment.StatusFailed, line: unlisted, want: "untouched"},
		{name: "processing, listed", status: payment.StatusProcessing, want: ReasonProcessing},
		{name: "succeeded, listed", status: payment.StatusSucceeded, want: "matched"},
		{name: "succeeded, listed with another refund id", status: payment.StatusSucceeded,
			line: func(l *Line, _ payment.Refund, _ *fakeBank) bool { l.ProviderChargeID = "rf_other"; return true }, want: KindProviderReferenceDiffers},
		{name: "succeeded, listed, another amount", status: payment.StatusSucceeded,
			line: func(l *Line, _ payment.Refund, _ *fakeBank) bool { l.AmountMinor--; return true }, want: KindAmountDiffers},
		{name: "succeeded, not listed, complete day", status: payment.StatusSucceeded, line: unlisted, want: KindSucceededButMissing},
		{name: "succeeded, not listed, no trailer", status: payment.StatusSucceeded, line: unlisted,
			file: func(ls []Line) *File { return &File{Lines: ls, Typed: true, Scope: everything()} }, days: []Day{d}, want: KindSucceededButMissing},
		{name: "refund line of no refund", status: payment.StatusFailed,
			line: func(l *Line, _ payment.Refund, _ *fakeBank) bool { l.Reference = payment.NewID(); return true }, want: KindUnknownReference},
		{name: "refund line with a payment's id", status: payment.StatusFailed,
			line: func(l *Line, r payment.Refund, b *fakeBank) bool {
				p := b.add(merchA, payment.StatusUnknown, r.AmountMinor, r.Currency, day.Add(-48*time.Hour), day.Add(-48*time.Hour))
				l.Reference = p.ID
				return true
			}, want: KindUnknownReference},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := newFakeBank()
			c, u := created, changed
			if !tt.created.IsZero() {
				c = tt.created
			}
			if !tt.changed.IsZero() {
				u = tt.changed
			}
			r := b.addRefund(merchA, tt.status, 2500, "TRY", c, u)
			l := refundLine(3, r, DayOf(c))
			var lines []Line
			if tt.line == nil || tt.line(&l, r, b) {
				lines = append(lines, l)
			}
			f := typedFile(lines, d)
			if tt.file != nil {
				f = tt.file(lines)
			}
			paymentsBefore := map[uuid.UUID]payment.Payment{}
			for id, p := range b.payments {
				paymentsBefore[id] = *p
			}
			rep, err := (&Reconciler{Store: b, Settler: b, BookingWindow: window}).Reconcile(context.Background(), f, Options{Days: tt.days})
			require.NoError(t, err)
			after := b.getRefund(r.ID)
			wf := workflows.RefundWorkflowID(merchA, r.IdempotencyKey)
			require.Equal(t, len(lines), rep.RefundLines)
			require.Zero(t, rep.Lines)
			require.Empty(t, rep.Mismatches, "payments are not touched by refunds")
			require.Empty(t, rep.Resolved)
			for id, p := range paymentsBefore {
				require.Equal(t, p, b.get(id))
			}
			switch tt.want {
			case workflows.OutcomeCharged, workflows.OutcomeNotCharged:
				require.True(t, rep.OK(), "%+v", rep.RefundMismatches)
				res := Resolution{Outcome: tt.want, Reference: r.ID.String(), PaymentID: r.PaymentID.String(), RefundID: r.ID.String(),
					MerchantID: merchA.String(), WorkflowID: wf}
				if tt.want == workflows.OutcomeCharged {
					require.Equal(t, refundCounts(0, 1, 0, 0, 0), rep.Counts)
					require.Equal(t, payment.StatusSucceeded, after.Status)
					require.Equal(t, l.ProviderChargeID, after.ProviderReference, "the bank's refund id is recorded")
					res.Line, res.ProviderChargeID = l.Number, l.ProviderChargeID
				} else {
					require.Equal(t, refundCounts(0, 0, 1, 0, 0), rep.Counts, "%+v", rep.RefundPending)
					require.Equal(t, payment.StatusFailed, after.Status)
				}
				require.Equal(t, []Resolution{res}, rep.RefundResolved)
				require.Len(t, b.settled, 1)
				require.Equal(t, tt.want, b.settled[0].Outcome)
				require.Contains(t, b.settled[0].Note, "reconciliation")
				return
			case "matched":
				require.True(t, rep.OK())
				require.Equal(t, refundCounts(1, 0, 0, 0, 0), rep.Counts)
			case "untouched":
				require.True(t, rep.OK())
				require.Equal(t, Counts{}, rep.Counts)
			case ReasonProcessing, ReasonFileNotComplete, ReasonBookingWindow, ReasonWindowNotCovered:
				require.True(t, rep.OK(), "pending is not a mismatch")
				require.Equal(t, refundCounts(0, 0, 0, 1, 0), rep.Counts, "%+v", rep.RefundMismatches)
				p := rep.RefundPending[0]
				require.Equal(t, tt.want, p.Reason, p.Detail)
				require.Equal(t, Pending{Reason: tt.want, Line: p.Line, Reference: r.ID.String(), PaymentID: r.PaymentID.String(),
					RefundID: r.ID.String(), MerchantID: merchA.String(), WorkflowID: wf, Status: string(r.Status), Detail: p.Detail}, p)
			default:
				require.False(t, rep.OK())
				require.Equal(t, refundCounts(0, 0, 0, 0, 1), rep.Counts, "%+v", rep.RefundPending)
				m := rep.RefundMismatches[0]
				require.Equal(t, tt.want, m.Kind)
				if tt.want == KindUnknownReference {
					require.Equal(t, Mismatch{Kind: KindUnknownReference, Line: l.Number, Reference: l.Reference.String(),
						ProviderChargeID: l.ProviderChargeID, Expected: "no refund with this id", Found: describeLine(l)}, m)
					break
				}
				require.Equal(t, r.ID.String(), m.RefundID)
				require.Equal(t, r.ID.String(), m.Reference)
				require.Equal(t, r.PaymentID.String(), m.PaymentID)
				require.Equal(t, wf, m.WorkflowID)
				if tt.want == KindProviderReferenceDiffers {
					require.Equal(t, "refund "+r.ProviderReference, m.Expected)
					require.Equal(t, "refund rf_other", m.Found)
				} else {
					require.Contains(t, m.Expected, string(r.Status))
					if tt.line == nil || tt.line(&Line{}, r, newFakeBank()) {
						require.Contains(t, m.Found, "refund "+l.ProviderChargeID)
					} else {
						require.Equal(t, "not listed on 2025-03-01", m.Found)
					}
				}
			}
			require.Equal(t, r, after, "never changed silently")
			require.Zero(t, b.calls, "nothing settled")
		})
	}
}

func unlisted(*Line, payment.Refund, *fakeBank) bool { return false }

// A charge line is matched to payments alone and a refund line to refunds alone, and either
// kind's findings leave the other's report exactly as it would be without them.
func TestReconcileChargesAndRefundsApart(t *testing.T) {
	t.Parallel()
	const d = Day("2025-03-01")
	at := day.Add(10 * time.Hour)
	soon := at.Add(time.Minute)
	b := newFakeBank()
	unknownListed := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, soon)
	unknownUnlisted := b.add(merchB, payment.StatusUnknown, 700, "TRY", at, soon)
	succeededUnlisted := b.add(merchB, payment.StatusSucceeded, 800, "TRY", at, soon)
	rUnknownListed := b.addRefund(merchA, payment.StatusUnknown, 300, "TRY", at, soon)
	rUnknownUnlisted := b.addRefund(merchB, payment.StatusUnknown, 200, "TRY", at, soon)
	rSucceeded := b.addRefund(merchA, payment.StatusSucceeded, 100, "TRY", at, soon)
	rSucceededUnlisted := b.addRefund(merchB, payment.StatusSucceeded, 150, "TRY", at, soon)

	asCharge := line(5, payment.Payment{ID: rSucceeded.ID, AmountMinor: 100, Currency: "TRY"}, d) // a refund's id on a charge line
	asRefund := refundLine(6, payment.Refund{ID: unknownUnlisted.ID, AmountMinor: 700, Currency: "TRY"}, d)
	lines := []Line{line(2, unknownListed, d), refundLine(3, rUnknownListed, d), refundLine(4, rSucceeded, d), asCharge, asRefund}
	var progress [][2]int
	runs := &runLog{}
	rep, err := (&Reconciler{Store: b, Settler: b, Runs: runs}).Reconcile(context.Background(), typedFile(lines, d),
		Options{Progress: func(done, total int) { progress = append(progress, [2]int{done, total}) }})
	require.NoError(t, err)

	require.Equal(t, 2, rep.Lines)
	require.Equal(t, 3, rep.RefundLines)
	require.True(t, rep.RefundsCovered)
	require.Equal(t, [][2]int{{2, 5}, {5, 5}}, progress)
	require.Equal(t, Counts{ResolvedCharged: 1, ResolvedNotCharged: 1, Mismatches: 2,
		RefundMatched: 1, RefundResolvedCharged: 1, RefundResolvedNotCharged: 1, RefundMismatches: 2}, rep.Counts)
	require.Equal(t, map[string]string{rSucceeded.ID.String(): KindUnknownReference, succeededUnlisted.ID.String(): KindSucceededButMissing}, kinds(rep))
	refundKinds := map[string]string{}
	for _, m := range rep.RefundMismatches {
		refundKinds[m.Reference] = m.Kind
	}
	require.Equal(t, map[string]string{unknownUnlisted.ID.String(): KindUnknownReference, rSucceededUnlisted.ID.String(): KindSucceededButMissing}, refundKinds)
	require.Equal(t, payment.StatusFailed, b.get(unknownUnlisted.ID).Status, "a refund line with its id does not list the payment")
	require.Equal(t, payment.StatusSucceeded, b.get(unknownListed.ID).Status)
	require.Equal(t, payment.StatusSucceeded, b.getRefund(rUnknownListed.ID).Status)
	require.Equal(t, payment.StatusFailed, b.getRefund(rUnknownUnlisted.ID).Status)
	require.Equal(t, rSucceeded, b.getRefund(rSucceeded.ID))
	require.Equal(t, rSucceededUnlisted, b.getRefund(rSucceededUnlisted.ID))
	require.False(t, rep.OK())

	// The run's counts are of both together.
	require.Len(t, runs.runs, 1)
	run := runs.runs[0]
	require.Equal(t, [6]int{5, 1, 2, 2, 0, 4}, [6]int{run.Lines, run.Matched, run.ResolvedCharged, run.ResolvedNotCharged, run.Pending, run.Mismatches})
	var kept map[string]any
	require.NoError(t, json.Unmarshal(run.Report, &kept))
	require.Len(t, kept["refund_mismatches"], 2, "the kept report tells refunds apart")
}

// A dry run reports what importing the file would do to refunds, and changes none.
func TestReconcileRefundsDryRun(t *testing.T) {
	t.Parallel()
	const d = Day("2025-03-01")
	at := day.Add(time.Hour)
	b := newFakeBank()
	listed := b.addRefund(merchA, payment.StatusUnknown, 400, "TRY", at, at.Add(time.Second))
	unlistedR := b.addRefund(merchA, payment.StatusUnknown, 500, "TRY", at, at.Add(time.Second))
	failed := b.addRefund(merchA, payment.StatusFailed, 600, "TRY", at, at.Add(time.Second))
	missing := b.addRefund(merchA, payment.StatusSucceeded, 700, "TRY", at, at.Add(time.Second))
	file := typedFile([]Line{refundLine(2, listed, d), refundLine(3, failed, d)}, d)
	runs := &runLog{}
	r := &Reconciler{Store: b, Settler: b, Runs: runs}

	dry, err := r.Reconcile(context.Background(), file, Options{DryRun: true})
	require.NoError(t, err)
	require.Zero(t, b.calls, "no settlement sent")
	require.Empty(t, runs.runs, "no run recorded")
	for _, rf := range []payment.Refund{listed, unlistedR, failed, missing} {
		require.Equal(t, rf, b.getRefund(rf.ID))
	}
	require.Equal(t, refundCounts(0, 1, 1, 0, 2), dry.Counts)
	require.False(t, dry.OK())

	done, err := r.Reconcile(context.Background(), file, Options{})
	require.NoError(t, err)
	require.Equal(t, 2, b.calls)
	require.Equal(t, payment.StatusSucceeded, b.getRefund(listed.ID).Status)
	require.Equal(t, payment.StatusFailed, b.getRefund(unlistedR.ID).Status)
	require.Equal(t, failed, b.getRefund(failed.ID))
	require.Equal(t, missing, b.getRefund(missing.ID))
	dry.DryRun = false
	require.Equal(t, dry, done, "the dry run said what the import did")

	// Imported again: the settled refunds now simply match, or stay released.
	again, err := r.Reconcile(context.Background(), file, Options{})
	require.NoError(t, err)
	require.Equal(t, refundCounts(1, 0, 0, 0, 2), again.Counts)
	require.Equal(t, 2, b.calls, "nothing left to settle")
}

// A refund settled by someone else between the read and the settlement is matched as it is now.
func TestReconcileRefundSettledMeanwhile(t *testing.T) {
	t.Parallel()
	const d = Day("2025-03-01")
	at := day.Add(time.Hour)
	b := newFakeBank()
	listed := b.addRefund(merchA, payment.StatusUnknown, 400, "TRY", at, at.Add(time.Second))
	charged := b.addRefund(merchA, payment.StatusUnknown, 500, "TRY", at, at.Add(time.Second))
	released := b.addRefund(merchA, payment.StatusUnknown, 600, "TRY", at, at.Add(time.Second))
	b.onSettleRefund = func(r *payment.Refund) error {
		switch r.ID {
		case listed.ID:
			r.Status, r.ProviderReference = payment.StatusSucceeded, "rf_"+r.ID.String()[:8]
		case charged.ID:
			r.Status, r.ProviderReference = payment.StatusSucceeded, "rf_by_operator"
		case released.ID:
			r.Status, r.FailureCode = payment.StatusFailed, payment.FailureDeclined
		}
		return nil
	}
	rep, err := (&Reconciler{Store: b, Settler: b}).Reconcile(context.Background(), typedFile([]Line{refundLine(2, listed, d)}, d), Options{})
	require.NoError(t, err)
	require.Equal(t, refundCounts(1, 0, 0, 0, 1), rep.Counts)
	require.Equal(t, KindSucceededButMissing, rep.RefundMismatches[0].Kind)
	require.Equal(t, charged.ID.String(), rep.RefundMismatches[0].RefundID)
	require.Empty(t, b.settled)
}
