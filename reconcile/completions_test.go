package reconcile

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// A payment (or refund) whose charge window runs over midnight is decided by the second day's
// file once an earlier import proved the first day complete (a trailer) for a scope covering it,
// far enough, and did not list it there: daily files settle it with no file covering both days.
func TestReconcileWindowOverMidnightByDailyFiles(t *testing.T) {
	t.Parallel()
	const d1, d2 = Day("2025-03-01"), Day("2025-03-02")
	created, decided := d2.Start().Add(-10*time.Second), d2.Start().Add(5*time.Second)
	chargesOnly := func() *File {
		f := typedFile(nil, d1)
		f.Scope = &Scope{AllMerchants: true, Charges: true}
		return f
	}
	type imp struct {
		file *File
		opts Options
	}
	day2 := imp{typedFile(nil, d2), Options{}}
	tests := []struct {
		name     string
		refund   bool
		status   payment.Status
		inFlight bool // processing during the first import, unknown after it
		first    func(l Line) imp
		second   imp
		want     string // "released", "nothing", a mismatch kind or a pending reason
	}{
		{name: "day 1 complete for every merchant", first: func(Line) imp { return imp{typedFile(nil, d1), Options{}} }, want: "released"},
		{name: "day 1 complete for its merchant", first: func(Line) imp { return imp{fileOf(nil, d1), Options{Merchants: []uuid.UUID{merchA}}} }, want: "released"},
		{name: "day 1 complete for another merchant only", first: func(Line) imp { return imp{fileOf(nil, d1), Options{Merchants: []uuid.UUID{merchB}}} },
			want: ReasonWindowNotCovered},
		{name: "day 1 without a trailer", first: func(Line) imp { return imp{&File{}, Options{Days: []Day{d1}, AllMerchants: true}} },
			want: ReasonWindowNotCovered},
		{name: "day 1 complete only until before the window's end on it",
			first: func(Line) imp {
				return imp{&File{Trailers: []Trailer{{Day: d1, AsOf: d1.End().Add(-time.Second)}}}, Options{AllMerchants: true}}
			}, want: ReasonWindowNotCovered},
		{name: "day 1 listed it while in flight", inFlight: true, first: func(l Line) imp { return imp{typedFile([]Line{l}, d1), Options{}} },
			want: ReasonWindowNotCovered},
		{name: "day 1 imported as a dry run", first: func(Line) imp { return imp{typedFile(nil, d1), Options{DryRun: true}} }, want: ReasonWindowNotCovered},
		{name: "day 1 without a declared scope", first: func(Line) imp { return imp{fileOf(nil, d1), Options{}} }, want: ReasonWindowNotCovered},
		{name: "refund, day 1 complete for refunds", refund: true, first: func(Line) imp { return imp{typedFile(nil, d1), Options{}} }, want: "released"},
		{name: "refund, day 1 complete for charges only", refund: true, first: func(Line) imp { return imp{chargesOnly(), Options{}} },
			want: ReasonWindowNotCovered},
		{name: "payment, day 1 complete for charges only", first: func(Line) imp { return imp{chargesOnly(), Options{}} }, want: "released"},
		{name: "day 2 first, then day 1", first: func(Line) imp { return imp{typedFile(nil, d2), Options{}} }, second: imp{typedFile(nil, d1), Options{}},
			want: "released"},
		{name: "day 2 complete earlier, both days declared, a trailer for day 1 only",
			first:  func(Line) imp { return imp{typedFile(nil, d2), Options{}} },
			second: imp{&File{Trailers: []Trailer{{Day: d1, AsOf: d1.End().Add(time.Hour)}}}, Options{Days: []Day{d1, d2}, AllMerchants: true}},
			want:   "released"},
		{name: "day 2 complete earlier for another merchant, both days declared, a trailer for day 1 only",
			first:  func(Line) imp { return imp{fileOf(nil, d2), Options{Merchants: []uuid.UUID{merchB}}} },
			second: imp{&File{Trailers: []Trailer{{Day: d1, AsOf: d1.End().Add(time.Hour)}}}, Options{Days: []Day{d1, d2}, AllMerchants: true}},
			want:   ReasonFileNotComplete},
		{name: "succeeded, listed on day 1", status: payment.StatusSucceeded,
			first: func(l Line) imp { return imp{typedFile([]Line{l}, d1), Options{}} }, want: "nothing"},
		{name: "succeeded, listed on neither day", status: payment.StatusSucceeded,
			first: func(Line) imp { return imp{typedFile(nil, d1), Options{}} }, want: KindSucceededButMissing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := newFakeBank()
			st := tt.status
			if st == "" {
				st = payment.StatusUnknown
			}
			if tt.inFlight {
				st = payment.StatusProcessing
			}
			var id uuid.UUID
			var l Line
			if tt.refund {
				rf := b.addRefund(merchA, st, 500, "TRY", created, decided)
				id, l = rf.ID, refundLine(2, rf, d1)
			} else {
				p := b.add(merchA, st, 700, "TRY", created, decided)
				id, l = p.ID, line(2, p, d1)
				l.Type = TypeCharge
			}
			status := func() payment.Status {
				if tt.refund {
					return b.getRefund(id).Status
				}
				return b.get(id).Status
			}
			r := &Reconciler{Store: b, Settler: b}
			first := tt.first(l)
			_, err := r.Reconcile(context.Background(), first.file, first.opts)
			require.NoError(t, err)
			if tt.inFlight {
				b.mu.Lock()
				b.payments[id].Status = payment.StatusUnknown
				b.mu.Unlock()
			}
			before := status()
			second := tt.second
			if second.file == nil {
				second = day2
			}
			rep, err := r.Reconcile(context.Background(), second.file, second.opts)
			require.NoError(t, err)
			pending, mismatches, resolved := rep.Pending, rep.Mismatches, rep.Counts.ResolvedNotCharged
			if tt.refund {
				pending, mismatches, resolved = rep.RefundPending, rep.RefundMismatches, rep.Counts.RefundResolvedNotCharged
			}
			switch tt.want {
			case "released":
				require.Equal(t, 1, resolved, "%+v", pending)
				require.Equal(t, payment.StatusFailed, status())
				require.Len(t, b.settled, 1, "settled once")
			case "nothing":
				require.Empty(t, pending)
				require.Empty(t, mismatches)
				require.Equal(t, before, status())
			case KindSucceededButMissing:
				require.Len(t, mismatches, 1)
				require.Equal(t, tt.want, mismatches[0].Kind)
			default:
				require.Zero(t, resolved)
				require.Len(t, pending, 1, "%+v", rep)
				require.Equal(t, tt.want, pending[0].Reason, pending[0].Detail)
				require.Equal(t, id.String(), pending[0].Reference)
				require.Equal(t, payment.StatusUnknown, status(), "its hold kept")
				require.Empty(t, b.settled)
			}
		})
	}
}

// Day 1's and day 2's imports running at once: each records its days before it reads which are
// complete, and its listings before its days, so the one that reads last sees both days complete
// and what day 1 listed. An unlisted payment over midnight is released, once; one day 1 lists is
// settled as charged and never released.
func TestReconcileDailyFilesAtOnce(t *testing.T) {
	t.Parallel()
	const d1, d2 = Day("2025-03-01"), Day("2025-03-02")
	created, decided := d2.Start().Add(-10*time.Second), d2.Start().Add(5*time.Second)
	for _, listed := range []bool{false, true} {
		for range 50 {
			b := newFakeBank()
			p := b.add(merchA, payment.StatusUnknown, 700, "TRY", created, decided)
			var lines []Line
			if listed {
				lines = []Line{line(2, p, d1)}
			}
			r := &Reconciler{Store: b, Settler: b}
			errs := make(chan error, 2)
			for _, f := range []*File{typedFile(lines, d1), typedFile(nil, d2)} {
				go func() {
					_, err := r.Reconcile(context.Background(), f, Options{})
					errs <- err
				}()
			}
			require.NoError(t, <-errs)
			require.NoError(t, <-errs)
			require.Len(t, b.settled, 1, "settled once, by one of them")
			want, outcome := payment.StatusFailed, "not_charged"
			if listed {
				want, outcome = payment.StatusSucceeded, "charged"
			}
			require.Equal(t, outcome, b.settled[0].Outcome)
			require.Equal(t, want, b.get(p.ID).Status)
		}
	}
}
