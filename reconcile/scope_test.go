package reconcile

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// csvOf renders a settlement file as the bank sends it: the typed header, then rows as given
// (lines, a scope row, trailers).
func csvOf(rows ...string) string {
	return strings.Join(HeaderTyped, ",") + "\n" + strings.Join(rows, "\n") + "\n"
}

// chargeRow and refundRow are the file's lines for a payment and a refund on 2025-03-01.
func chargeRow(p payment.Payment) string {
	return "2025-03-01,ch_" + p.ID.String()[:8] + "," + p.ID.String() + "," + payment.FormatAmount(p.AmountMinor, p.Currency) + "," + p.Currency + ",settled,charge"
}

func refundRow(r payment.Refund) string {
	return "2025-03-01,rf_" + r.ID.String()[:8] + "," + r.ID.String() + "," + payment.FormatAmount(r.AmountMinor, r.Currency) + "," + r.Currency + ",settled,refund"
}

// trailerRow says the file is complete for 2025-03-01 with n lines, well after the day.
func trailerRow(n int) string {
	return "trailer,2025-03-01," + strconv.Itoa(n) + ",2025-03-02T06:00:00Z,,,"
}

func pendingReasons(ps []Pending) map[string]string {
	out := map[string]string{}
	for _, p := range ps {
		out[p.Reference] = p.Reason
	}
	return out
}

// A one-merchant file imported without a scope says nothing about the payments it does not
// list: it settles what it lists, and every unlisted unknown payment stays unknown, pending
// with a reason naming the missing scope.
func TestImportWithoutScopeReleasesNothingUnlisted(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	listedA := b.add(merchA, payment.StatusUnknown, 1000, "TRY", at, at.Add(time.Second))
	unlistedA := b.add(merchA, payment.StatusUnknown, 2000, "TRY", at, at.Add(time.Second))
	unlistedB := b.add(merchB, payment.StatusUnknown, 3000, "TRY", at, at.Add(time.Second))
	succeededB := b.add(merchB, payment.StatusSucceeded, 4000, "TRY", at, at.Add(time.Second))

	rep, err := (&Reconciler{Store: b, Settler: b}).Import(context.Background(),
		strings.NewReader(csvOf(chargeRow(listedA), trailerRow(1))), Options{})
	require.NoError(t, err)
	require.True(t, rep.OK(), "%+v", rep.Mismatches)
	require.Equal(t, Counts{ResolvedCharged: 1, Pending: 2}, rep.Counts, "a listed line settles whatever the scope")
	require.Equal(t, map[string]string{unlistedA.ID.String(): ReasonScopeNotDeclared, unlistedB.ID.String(): ReasonScopeNotDeclared},
		pendingReasons(rep.Pending))
	require.Contains(t, rep.Pending[0].Detail, "--all-merchants")
	require.Equal(t, ScopeNone, rep.Scope)
	require.Equal(t, payment.StatusSucceeded, b.get(listedA.ID).Status)
	for _, p := range []payment.Payment{unlistedA, unlistedB, succeededB} {
		require.Equal(t, p, b.get(p.ID), "outside any declared scope: never changed")
	}
	require.Len(t, b.settled, 1)
}

// --merchant declares the file one merchant's: that merchant's unlisted unknown payments are
// released, and no other merchant's is touched or reported.
func TestImportMerchantScopeReleasesOnlyThatMerchant(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	listedA := b.add(merchA, payment.StatusSucceeded, 1000, "TRY", at, at.Add(time.Second))
	unlistedA := b.add(merchA, payment.StatusUnknown, 2000, "TRY", at, at.Add(time.Second))
	unlistedB := b.add(merchB, payment.StatusUnknown, 3000, "TRY", at, at.Add(time.Second))
	file := csvOf(chargeRow(listedA), trailerRow(1))
	r := &Reconciler{Store: b, Settler: b}

	rep, err := r.Import(context.Background(), strings.NewReader(file), Options{Merchants: []uuid.UUID{merchA}})
	require.NoError(t, err)
	require.Equal(t, Counts{Matched: 1, ResolvedNotCharged: 1}, rep.Counts)
	require.Equal(t, ScopeMerchants, rep.Scope)
	require.Equal(t, []string{merchA.String()}, rep.Merchants)
	require.Equal(t, payment.StatusFailed, b.get(unlistedA.ID).Status)
	require.Equal(t, unlistedB, b.get(unlistedB.ID))

	// The file may declare its scope itself: one merchant, charges.
	b2 := newFakeBank()
	listedA = b2.add(merchA, payment.StatusSucceeded, 1000, "TRY", at, at.Add(time.Second))
	unlistedA = b2.add(merchA, payment.StatusUnknown, 2000, "TRY", at, at.Add(time.Second))
	unlistedB = b2.add(merchB, payment.StatusUnknown, 3000, "TRY", at, at.Add(time.Second))
	rep, err = (&Reconciler{Store: b2, Settler: b2}).Import(context.Background(),
		strings.NewReader(csvOf("scope,"+merchA.String()+",charge,,,,", chargeRow(listedA), trailerRow(1))), Options{})
	require.NoError(t, err)
	require.Equal(t, Counts{Matched: 1, ResolvedNotCharged: 1}, rep.Counts)
	require.Equal(t, payment.StatusFailed, b2.get(unlistedA.ID).Status)
	require.Equal(t, unlistedB, b2.get(unlistedB.ID))

	// An import and a file that both declare a scope: only what both cover.
	b3 := newFakeBank()
	unlistedA = b3.add(merchA, payment.StatusUnknown, 2000, "TRY", at, at.Add(time.Second))
	unlistedB = b3.add(merchB, payment.StatusUnknown, 3000, "TRY", at, at.Add(time.Second))
	rep, err = (&Reconciler{Store: b3, Settler: b3}).Import(context.Background(),
		strings.NewReader(csvOf("scope,all,charge,,,,", trailerRow(0))), Options{Merchants: []uuid.UUID{merchB}})
	require.NoError(t, err)
	require.Equal(t, Counts{ResolvedNotCharged: 1}, rep.Counts)
	require.Equal(t, unlistedA, b3.get(unlistedA.ID))
	require.Equal(t, payment.StatusFailed, b3.get(unlistedB.ID).Status)
}

// A file of charges (with the type column, even with refund lines, but not declaring refunds)
// releases no unknown refund; one whose scope row declares refunds does.
func TestImportChargesOnlyFileKeepsUnknownRefunds(t *testing.T) {
	t.Parallel()
	at := day.Add(time.Hour)
	for _, tt := range []struct {
		name, scope string
		opts        Options
		released    bool
	}{
		{name: "type column, import scope", opts: Options{AllMerchants: true}},
		{name: "type column, merchant scope", opts: Options{Merchants: []uuid.UUID{merchA}}},
		{name: "scope row of charges", scope: "scope,all,charge,,,,"},
		{name: "scope row of charges and refunds", scope: "scope,all,charge refund,,,,", released: true},
		{name: "scope row of refunds, merchant scope", scope: "scope,all,refund,,,,", opts: Options{Merchants: []uuid.UUID{merchA}}, released: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := newFakeBank()
			listed := b.addRefund(merchA, payment.StatusUnknown, 100, "TRY", at, at.Add(time.Second))
			unlisted := b.addRefund(merchA, payment.StatusUnknown, 200, "TRY", at, at.Add(time.Second))
			rows := []string{refundRow(listed), trailerRow(1)}
			if tt.scope != "" {
				rows = append([]string{tt.scope}, rows...)
			}
			rep, err := (&Reconciler{Store: b, Settler: b}).Import(context.Background(), strings.NewReader(csvOf(rows...)), tt.opts)
			require.NoError(t, err)
			require.Equal(t, payment.StatusSucceeded, b.getRefund(listed.ID).Status, "a listed refund settles whatever the scope")
			require.Equal(t, tt.released, rep.RefundsCovered)
			if tt.released {
				require.Equal(t, payment.StatusFailed, b.getRefund(unlisted.ID).Status)
				require.Equal(t, refundCounts(0, 1, 1, 0, 0), rep.Counts)
				return
			}
			require.Equal(t, unlisted, b.getRefund(unlisted.ID), "refunds outside the declared scope are never released")
			require.Equal(t, refundCounts(0, 1, 0, 1, 0), rep.Counts)
			require.Equal(t, ReasonScopeNotDeclared, rep.RefundPending[0].Reason)
		})
	}
}

// A reference the bank lists twice is a charged_twice mismatch, and nothing is settled for it;
// the rest of the file applies: its other lines settle, and an unlisted unknown payment in
// scope is released.
func TestImportReferenceListedTwice(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	twice := b.add(merchA, payment.StatusUnknown, 1000, "TRY", at, at.Add(time.Second))
	listed := b.add(merchA, payment.StatusUnknown, 2000, "TRY", at, at.Add(time.Second))
	ok := b.add(merchA, payment.StatusSucceeded, 3000, "TRY", at, at.Add(time.Second))
	unlisted := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
	second := strings.Replace(chargeRow(twice), "ch_", "ch_again_", 1)
	file := csvOf(chargeRow(twice), chargeRow(listed), second, chargeRow(ok), trailerRow(4))

	rep, err := (&Reconciler{Store: b, Settler: b}).Import(context.Background(), strings.NewReader(file), Options{AllMerchants: true})
	require.NoError(t, err)
	require.False(t, rep.OK())
	require.Equal(t, 4, rep.Lines)
	require.Equal(t, Counts{Matched: 1, ResolvedCharged: 1, ResolvedNotCharged: 1, Mismatches: 1}, rep.Counts)
	require.Equal(t, map[string]string{twice.ID.String(): KindChargedTwice}, kinds(rep))
	m := rep.Mismatches[0]
	require.Equal(t, 2, m.Line)
	require.Contains(t, m.Found, "lines 2 and 4")
	require.Contains(t, m.Found, "ch_again_")
	require.Equal(t, twice, b.get(twice.ID), "a person decides what the double charge means")
	require.Equal(t, payment.StatusSucceeded, b.get(listed.ID).Status)
	require.Equal(t, payment.StatusFailed, b.get(unlisted.ID).Status)
}

// A refund moves its payment's updated_at, days after the charge: the payment's settlement
// window still ends the booking window after its outcome was decided, so the file for its day
// decides it (here: succeeded, yet not listed).
func TestRefundDoesNotStretchThePaymentsWindow(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	refunded := b.add(merchA, payment.StatusSucceeded, 1000, "TRY", at, at.AddDate(0, 0, 3))
	b.decided[refunded.ID] = at.Add(time.Second)

	rep, err := (&Reconciler{Store: b, Settler: b}).Import(context.Background(), strings.NewReader(csvOf(trailerRow(0))), Options{AllMerchants: true})
	require.NoError(t, err)
	require.Empty(t, rep.Pending)
	require.Equal(t, map[string]string{refunded.ID.String(): KindSucceededButMissing}, kinds(rep))
}
