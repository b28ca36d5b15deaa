package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

func init() { rereadDelay = time.Millisecond }

// fakeBank is the store and the workflows at once: settling an unknown payment changes it the
// way the payment workflow would.
type fakeBank struct {
	mu       sync.Mutex
	payments map[uuid.UUID]*payment.Payment
	refunds  map[uuid.UUID]*payment.Refund
	settled  []workflows.Settlement // every settlement accepted
	calls    int                    // every Settle call
	// hooks
	onSettle       func(p *payment.Payment) error // runs before the workflow's check; an error is returned as is
	onSettleRefund func(r *payment.Refund) error
	byIDErr        error
	// voidLost: a manual payment settled not_charged is voided, and the bank's answer to that
	// void is lost too: it stays unknown (else it is canceled).
	voidLost  bool
	capturing map[uuid.UUID]bool // manual payments whose capture is in flight
	createdIn [][2]time.Time
	// decided: when a payment's outcome was decided, if not its updated_at (a refund moved that)
	decided   map[uuid.UUID]time.Time
	refundsIn [][2]time.Time
	listed    map[string][]time.Time // the days each kind+reference was listed on
	clock     func() time.Time       // the database's clock; nil: this host's
	// completions: the days imports proved complete, by kind, day and merchant (uuid.Nil: every
	// merchant), each with the as_of of every import that did
	completions map[string]map[time.Time]map[uuid.UUID][]time.Time
}

func (b *fakeBank) Now(context.Context) (time.Time, error) {
	if b.clock != nil {
		return b.clock(), nil
	}
	return time.Now(), nil
}

func newFakeBank() *fakeBank {
	return &fakeBank{payments: map[uuid.UUID]*payment.Payment{}, refunds: map[uuid.UUID]*payment.Refund{}, decided: map[uuid.UUID]time.Time{}}
}

var (
	day     = time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	merchA  = uuid.MustParse("0192f1f0-0000-7000-8000-00000000000a")
	merchB  = uuid.MustParse("0192f1f0-0000-7000-8000-00000000000b")
	keySeq  int
	keySeqM sync.Mutex
)

// nextKey is a new idempotency key, unique across the tests.
func nextKey(prefix string) string {
	keySeqM.Lock()
	defer keySeqM.Unlock()
	keySeq++
	return fmt.Sprintf("%s-%d", prefix, keySeq)
}

// outcome points at what a payment and a refund share that the fake bank reads and settles.
type outcome struct {
	merchant  uuid.UUID
	created   time.Time
	status    *payment.Status
	reference *string
	failure   *string
	updated   *time.Time
}

func paymentOutcome(p *payment.Payment) outcome {
	return outcome{p.MerchantID, p.CreatedAt, &p.Status, &p.ProviderReference, &p.FailureCode, &p.UpdatedAt}
}

func refundOutcome(r *payment.Refund) outcome {
	return outcome{r.MerchantID, r.CreatedAt, &r.Status, &r.ProviderReference, &r.FailureCode, &r.UpdatedAt}
}

// ended gives an operation stored at o's status the provider reference ref or the failure
// code a finished one has.
func (o outcome) ended(ref string) {
	switch *o.status {
	case payment.StatusSucceeded:
		*o.reference = ref
	case payment.StatusFailed:
		*o.failure = payment.FailureDeclined
	}
}

// add stores a payment created at `created` and last changed at `updated`.
func (b *fakeBank) add(m uuid.UUID, st payment.Status, amount int64, currency string, created, updated time.Time) payment.Payment {
	p := payment.Payment{ID: payment.NewID(), MerchantID: m, IdempotencyKey: nextKey("key"), AmountMinor: amount, Currency: currency,
		Status: st, CreatedAt: created, UpdatedAt: updated}
	paymentOutcome(&p).ended("ch_" + p.ID.String()[:8])
	b.mu.Lock()
	defer b.mu.Unlock()
	b.payments[p.ID] = &p
	return p
}

// addRefund stores a refund of m, created at `created` and last changed at `updated`.
func (b *fakeBank) addRefund(m uuid.UUID, st payment.Status, amount int64, currency string, created, updated time.Time) payment.Refund {
	// Its payment is not stored: reconciling refunds never reads it.
	r := payment.Refund{ID: payment.NewID(), PaymentID: payment.NewID(), MerchantID: m, IdempotencyKey: nextKey("rkey"), AmountMinor: amount, Currency: currency,
		Status: st, CreatedAt: created, UpdatedAt: updated}
	refundOutcome(&r).ended("rf_" + r.ID.String()[:8])
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refunds[r.ID] = &r
	return r
}

func (b *fakeBank) get(id uuid.UUID) payment.Payment {
	b.mu.Lock()
	defer b.mu.Unlock()
	return *b.payments[id]
}

func (b *fakeBank) getRefund(id uuid.UUID) payment.Refund {
	b.mu.Lock()
	defer b.mu.Unlock()
	return *b.refunds[id]
}

func (b *fakeBank) PaymentsByID(_ context.Context, ids []uuid.UUID) ([]payment.Payment, error) {
	return byID(b, b.payments, ids)
}

func (b *fakeBank) RefundsByID(_ context.Context, ids []uuid.UUID) ([]payment.Refund, error) {
	return byID(b, b.refunds, ids)
}

// byID returns the stored ones of ids, unless byIDErr is set.
func byID[V any](b *fakeBank, m map[uuid.UUID]*V, ids []uuid.UUID) ([]V, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byIDErr != nil {
		return nil, b.byIDErr
	}
	var out []V
	for _, id := range ids {
		if v, ok := m[id]; ok {
			out = append(out, *v)
		}
	}
	return out, nil
}

func (b *fakeBank) Payment(_ context.Context, id uuid.UUID) (payment.Payment, error) {
	return one(b, b.payments, id)
}

// EachCaptureDecided: the manual payments authorized (a provider reference) before from, with
// one of statuses, decided at a time in [from, to); their capture was sent a minute before that.
func (b *fakeBank) EachCaptureDecided(_ context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID,
	fn func(payment.Payment, time.Time, time.Time) error) error {
	b.mu.Lock()
	var match []payment.Payment
	var decided []time.Time
	for _, p := range b.payments {
		at, ok := b.decided[p.ID]
		if !ok {
			at = p.UpdatedAt
		}
		if p.CaptureManual && slices.Contains(statuses, p.Status) && p.ProviderReference != "" && p.CreatedAt.Before(from) &&
			!at.Before(from) && at.Before(to) && (len(merchants) == 0 || slices.Contains(merchants, p.MerchantID)) {
			match, decided = append(match, *p), append(decided, at)
		}
	}
	b.mu.Unlock()
	for i, p := range match {
		if err := fn(p, decided[i], decided[i].Add(-time.Minute)); err != nil {
			return err
		}
	}
	return nil
}

func (b *fakeBank) SettlementListings(_ context.Context, kind string, refs []uuid.UUID, days []time.Time, record bool) (map[uuid.UUID][]time.Time, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.listed == nil {
		b.listed = map[string][]time.Time{}
	}
	for i, id := range refs {
		if k := kind + id.String(); record && !slices.Contains(b.listed[k], days[i]) {
			b.listed[k] = append(b.listed[k], days[i])
		}
	}
	out := map[uuid.UUID][]time.Time{}
	for _, id := range refs {
		if ds := b.listed[kind+id.String()]; len(ds) > 0 {
			out[id] = ds
		}
	}
	return out, nil
}

func (b *fakeBank) RecordSettlementCompletions(_ context.Context, kind string, merchants []uuid.UUID, days, asOf []time.Time) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.completions == nil {
		b.completions = map[string]map[time.Time]map[uuid.UUID][]time.Time{}
	}
	if b.completions[kind] == nil {
		b.completions[kind] = map[time.Time]map[uuid.UUID][]time.Time{}
	}
	for i, d := range days {
		if b.completions[kind][d] == nil {
			b.completions[kind][d] = map[uuid.UUID][]time.Time{}
		}
		for _, m := range merchants {
			b.completions[kind][d][m] = append(b.completions[kind][d][m], asOf[i])
		}
	}
	return nil
}

func (b *fakeBank) SettlementCompletions(_ context.Context, kind string, days []time.Time, merchants []uuid.UUID) (map[time.Time]map[uuid.UUID]time.Time, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[time.Time]map[uuid.UUID]time.Time{}
	for _, d := range days {
		for m, asOf := range b.completions[kind][d] {
			if m != uuid.Nil && !slices.Contains(merchants, m) {
				continue
			}
			if out[d] == nil {
				out[d] = map[uuid.UUID]time.Time{}
			}
			out[d][m] = slices.MaxFunc(asOf, time.Time.Compare)
		}
	}
	return out, nil
}

func (b *fakeBank) CaptureInFlight(_ context.Context, id uuid.UUID) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.capturing[id], nil
}

func (b *fakeBank) Refund(_ context.Context, id uuid.UUID) (payment.Refund, error) {
	return one(b, b.refunds, id)
}

func one[V any](b *fakeBank, m map[uuid.UUID]*V, id uuid.UUID) (V, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := m[id]
	if !ok {
		var none V
		return none, payment.ErrNotFound
	}
	return *v, nil
}

func (b *fakeBank) EachPaymentCreated(_ context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID,
	fn func(payment.Payment, time.Time) error) error {
	return eachCreated(b, b.payments, paymentOutcome, &b.createdIn, from, to, statuses, merchants, func(p payment.Payment) error {
		b.mu.Lock()
		decided, ok := b.decided[p.ID]
		b.mu.Unlock()
		if !ok {
			decided = p.UpdatedAt
		}
		return fn(p, decided)
	})
}

func (b *fakeBank) EachRefundCreated(_ context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID,
	fn func(payment.Refund, time.Time) error) error {
	return eachCreated(b, b.refunds, refundOutcome, &b.refundsIn, from, to, statuses, merchants, func(r payment.Refund) error {
		return fn(r, r.UpdatedAt)
	})
}

// eachCreated calls fn, outside the lock, with each of m created in [from, to) with one of
// statuses, of one of merchants (any if none); it notes the range asked for in asked.
func eachCreated[V any](b *fakeBank, m map[uuid.UUID]*V, of func(*V) outcome, asked *[][2]time.Time,
	from, to time.Time, statuses []payment.Status, merchants []uuid.UUID, fn func(V) error) error {
	b.mu.Lock()
	*asked = append(*asked, [2]time.Time{from, to})
	var match []V
	for _, v := range m {
		o := of(v)
		if !o.created.Before(from) && o.created.Before(to) && slices.Contains(statuses, *o.status) &&
			(len(merchants) == 0 || slices.Contains(merchants, o.merchant)) {
			match = append(match, *v)
		}
	}
	b.mu.Unlock()
	for _, v := range match {
		if err := fn(v); err != nil {
			return err
		}
	}
	return nil
}

func (b *fakeBank) Settle(_ context.Context, workflowID string, s workflows.Settlement) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	for _, r := range b.refunds {
		if workflows.RefundWorkflowID(r.MerchantID, r.IdempotencyKey) == workflowID {
			if b.onSettleRefund != nil {
				if err := b.onSettleRefund(r); err != nil {
					return "", err
				}
			}
			return b.settle("refund", refundOutcome(r), s)
		}
	}
	var p *payment.Payment
	for _, q := range b.payments {
		if workflows.PaymentWorkflowID(q.MerchantID, q.IdempotencyKey) == workflowID {
			p = q
		}
	}
	if p == nil {
		return "", fmt.Errorf("%w: workflow not found", workflows.ErrSettlementRejected)
	}
	if b.onSettle != nil {
		if err := b.onSettle(p); err != nil {
			return "", err
		}
	}
	if p.CaptureManual && p.Status == payment.StatusUnknown && s.Outcome == workflows.OutcomeNotCharged {
		b.settled = append(b.settled, s)
		if !b.voidLost {
			p.Status, p.FailureCode = payment.StatusCanceled, payment.FailureDeclined
		}
		return string(p.Status), nil
	}
	return b.settle("payment", paymentOutcome(p), s)
}

// settle is what the payment or refund workflow does with a settlement: only an unknown
// one (a kind) is settled, as the settlement says, days later.
func (b *fakeBank) settle(kind string, o outcome, s workflows.Settlement) (string, error) {
	if *o.status != payment.StatusUnknown {
		return "", fmt.Errorf("%w: %s is %s, not unknown: nothing to settle", workflows.ErrSettlementRejected, kind, *o.status)
	}
	b.settled = append(b.settled, s)
	if s.Outcome == workflows.OutcomeCharged {
		*o.status, *o.reference = payment.StatusSucceeded, s.ProviderReference
	} else {
		*o.status, *o.failure = payment.StatusFailed, payment.FailureDeclined
	}
	*o.updated = o.updated.Add(time.Hour * 24 * 3)
	return string(*o.status), nil
}

func line(n int, p payment.Payment, d Day) Line {
	return Line{Number: n, SettlementDate: d, ProviderChargeID: "ch_" + p.ID.String()[:8], Reference: p.ID,
		AmountMinor: p.AmountMinor, Currency: p.Currency, Status: StatusSettled}
}

// fileOf is a file of lines with a trailer for each of days: complete for the whole day.
func fileOf(lines []Line, days ...Day) *File {
	f := &File{Lines: lines}
	for _, d := range days {
		n := 0
		for _, l := range lines {
			if l.SettlementDate == d {
				n++
			}
		}
		f.Trailers = append(f.Trailers, Trailer{Day: d, Lines: n, AsOf: d.End().Add(time.Hour)})
	}
	return f
}

func kinds(r *Report) map[string]string {
	out := map[string]string{}
	for _, m := range r.Mismatches {
		out[m.Reference] = m.Kind
	}
	return out
}

func TestReconcileClassifies(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(10 * time.Hour)
	soon := at.Add(time.Minute)
	unknownListed := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, soon)
	matched := b.add(merchA, payment.StatusSucceeded, 1000, "TRY", at, soon)
	amount := b.add(merchA, payment.StatusSucceeded, 1000, "TRY", at, soon)
	currency := b.add(merchA, payment.StatusSucceeded, 1000, "TRY", at, soon)
	failed := b.add(merchA, payment.StatusFailed, 2000, "TRY", at, soon)
	processing := b.add(merchA, payment.StatusProcessing, 3000, "TRY", at, soon)
	otherCharge := b.add(merchA, payment.StatusSucceeded, 1000, "TRY", at, soon)
	unknownAmount := b.add(merchA, payment.StatusUnknown, 500, "TRY", at, soon)
	// Not listed:
	unknownUnlisted := b.add(merchB, payment.StatusUnknown, 700, "TRY", at, soon)
	succeededUnlisted := b.add(merchB, payment.StatusSucceeded, 800, "TRY", at, soon)
	failedUnlisted := b.add(merchB, payment.StatusFailed, 900, "TRY", at, soon)
	unknownOtherDay := b.add(merchB, payment.StatusUnknown, 100, "TRY", at.AddDate(0, 0, -1), soon.AddDate(0, 0, -1))
	unknownAcrossMidnight := b.add(merchB, payment.StatusUnknown, 100, "TRY", day.Add(24*time.Hour-time.Second), day.Add(24*time.Hour+time.Second))
	succeededAcrossMidnight := b.add(merchB, payment.StatusSucceeded, 100, "TRY", day.Add(24*time.Hour-time.Second), day.Add(24*time.Hour+time.Second))

	const d = Day("2025-03-01")
	ghost := Line{Number: 10, SettlementDate: d, ProviderChargeID: "ch_ghost", Reference: payment.NewID(), AmountMinor: 1, Currency: "TRY", Status: StatusSettled}
	amountLine := line(4, amount, d)
	amountLine.AmountMinor = 1001
	currencyLine := line(5, currency, d)
	currencyLine.Currency = "EUR"
	otherChargeLine := line(8, otherCharge, d)
	otherChargeLine.ProviderChargeID = "ch_second"
	unknownAmountLine := line(9, unknownAmount, d)
	unknownAmountLine.AmountMinor = 600
	lines := []Line{line(2, unknownListed, d), line(3, matched, d), amountLine, currencyLine, line(6, failed, d),
		line(7, processing, d), otherChargeLine, unknownAmountLine, ghost}

	var progress [][2]int
	r := &Reconciler{Store: b, Settler: b}
	rep, err := r.Reconcile(context.Background(), fileOf(lines, d), Options{AllMerchants: true, Progress: func(done, total int) { progress = append(progress, [2]int{done, total}) }})
	require.NoError(t, err)

	require.Equal(t, []Day{d}, rep.Days)
	require.Equal(t, 9, rep.Lines)
	require.Equal(t, Counts{Matched: 1, ResolvedCharged: 1, ResolvedNotCharged: 1, Pending: 3, Mismatches: 7}, rep.Counts)
	require.False(t, rep.OK())
	require.Equal(t, map[string]string{
		amount.ID.String():            KindAmountDiffers,
		currency.ID.String():          KindCurrencyDiffers,
		failed.ID.String():            KindChargedButFailed,
		otherCharge.ID.String():       KindProviderReferenceDiffers,
		unknownAmount.ID.String():     KindAmountDiffers,
		ghost.Reference.String():      KindUnknownReference,
		succeededUnlisted.ID.String(): KindSucceededButMissing,
	}, kinds(rep))
	require.Len(t, rep.Mismatches, 7)
	require.Equal(t, [][2]int{{9, 9}}, progress)

	// Effects: exactly the two unknown payments were settled, each once, and as the file says.
	require.Equal(t, payment.StatusSucceeded, b.get(unknownListed.ID).Status)
	require.Equal(t, "ch_"+unknownListed.ID.String()[:8], b.get(unknownListed.ID).ProviderReference, "the bank's charge id is recorded")
	require.Equal(t, payment.StatusFailed, b.get(unknownUnlisted.ID).Status)
	require.Len(t, b.settled, 2)
	for _, s := range b.settled {
		require.Contains(t, s.Note, "reconciliation")
	}
	for _, p := range []payment.Payment{failed, amount, currency, processing, otherCharge, unknownAmount, succeededUnlisted,
		failedUnlisted, unknownOtherDay, unknownAcrossMidnight, succeededAcrossMidnight} {
		require.Equal(t, p, b.get(p.ID), "never changed silently")
	}

	// Lines first (by line number), then the coverage findings.
	require.Equal(t, 4, rep.Mismatches[0].Line)
	require.Equal(t, 0, rep.Mismatches[len(rep.Mismatches)-1].Line)
	fm := rep.Mismatches[2]
	require.Equal(t, KindChargedButFailed, fm.Kind)
	require.Equal(t, Mismatch{Kind: KindChargedButFailed, Line: 6, Reference: failed.ID.String(), PaymentID: failed.ID.String(),
		MerchantID: merchA.String(), WorkflowID: workflows.PaymentWorkflowID(merchA, failed.IdempotencyKey),
		ProviderChargeID: "ch_" + failed.ID.String()[:8], Expected: "failed (declined) 20.00 TRY",
		Found: "settled 20.00 TRY on 2025-03-01, charge ch_" + failed.ID.String()[:8]}, fm)

	pend := map[string]string{}
	for _, p := range rep.Pending {
		pend[p.Reference] = p.Reason
	}
	require.Equal(t, map[string]string{
		processing.ID.String():              ReasonProcessing,
		unknownAcrossMidnight.ID.String():   ReasonWindowNotCovered,
		succeededAcrossMidnight.ID.String(): ReasonWindowNotCovered,
	}, pend)
}

func TestReconcileTwiceChangesNothing(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	listed := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
	unlisted := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
	ok := b.add(merchA, payment.StatusSucceeded, 1000, "TRY", at, at.Add(time.Second))
	lines := []Line{line(2, listed, "2025-03-01"), line(3, ok, "2025-03-01")}
	r := &Reconciler{Store: b, Settler: b}

	first, err := r.Reconcile(context.Background(), fileOf(lines, "2025-03-01"), Options{AllMerchants: true})
	require.NoError(t, err)
	require.True(t, first.OK(), "%+v", first.Mismatches)
	require.Equal(t, Counts{Matched: 1, ResolvedCharged: 1, ResolvedNotCharged: 1}, first.Counts)

	snapshot := map[uuid.UUID]payment.Payment{}
	for _, p := range []payment.Payment{listed, unlisted, ok} {
		snapshot[p.ID] = b.get(p.ID)
	}
	calls := b.calls
	second, err := r.Reconcile(context.Background(), fileOf(lines, "2025-03-01"), Options{AllMerchants: true})
	require.NoError(t, err)
	require.True(t, second.OK(), "%+v", second.Mismatches)
	require.Equal(t, Counts{Matched: 2}, second.Counts, "the resolved payment now simply matches")
	require.Equal(t, calls, b.calls, "nothing left to settle")
	for id, p := range snapshot {
		require.Equal(t, p, b.get(id))
	}
}

func TestReconcileRefusedSettlementIsNotAnError(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	// Another import (or an operator) settles the payments between our read and our update.
	listed := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
	unlistedCharged := b.add(merchA, payment.StatusUnknown, 500, "TRY", at, at.Add(time.Second))
	unlistedReleased := b.add(merchA, payment.StatusUnknown, 600, "TRY", at, at.Add(time.Second))
	b.onSettle = func(p *payment.Payment) error {
		switch p.ID {
		case listed.ID:
			p.Status, p.ProviderReference = payment.StatusSucceeded, "ch_"+p.ID.String()[:8]
		case unlistedCharged.ID:
			p.Status, p.ProviderReference = payment.StatusSucceeded, "ch_by_operator"
		case unlistedReleased.ID:
			p.Status, p.FailureCode = payment.StatusFailed, payment.FailureDeclined
		}
		return nil
	}
	rep, err := (&Reconciler{Store: b, Settler: b}).Reconcile(context.Background(), fileOf([]Line{line(2, listed, "2025-03-01")}, "2025-03-01"), Options{AllMerchants: true})
	require.NoError(t, err)
	require.Equal(t, Counts{Matched: 1, Mismatches: 1}, rep.Counts)
	require.Equal(t, map[string]string{unlistedCharged.ID.String(): KindSucceededButMissing}, kinds(rep),
		"settled as charged by someone else, yet the bank does not list it")
	require.Empty(t, b.settled)
}

// A manual payment whose unknown capture the file proves not charged is let go: canceled, or,
// when the bank's answer to that void is lost too, pending (void_unknown) for the next import,
// its hold kept; neither is a mismatch.
func TestReconcileUnlistedManualPayment(t *testing.T) {
	t.Parallel()
	for _, lost := range []bool{false, true} {
		b := newFakeBank()
		b.voidLost = lost
		at := day.Add(time.Hour)
		p := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
		b.payments[p.ID].CaptureManual, b.payments[p.ID].ProviderReference = true, "au_1" // its capture is unknown
		rep, err := (&Reconciler{Store: b, Settler: b}).Reconcile(context.Background(), fileOf(nil, "2025-03-01"), Options{AllMerchants: true})
		require.NoError(t, err)
		require.Empty(t, rep.Mismatches, "void lost: %v", lost)
		require.Len(t, b.settled, 1)
		if !lost {
			require.Equal(t, 1, rep.Counts.ResolvedNotCharged)
			continue
		}
		require.Len(t, rep.Pending, 1)
		require.Equal(t, ReasonVoidUnknown, rep.Pending[0].Reason)
		require.Equal(t, p.ID.String(), rep.Pending[0].PaymentID)
	}
}

// A manual payment whose authorization's answer was lost (unknown, no authorization id) is not
// released by a file's silence: files list captures, never authorizations, so the bank may
// hold an authorization kasa could then never void. It waits for an operator.
func TestReconcileUnknownAuthorizationIsNotReleased(t *testing.T) {
	t.Parallel()
	for _, dry := range []bool{false, true} {
		b := newFakeBank()
		at := day.Add(time.Hour)
		p := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
		b.payments[p.ID].CaptureManual = true
		rep, err := (&Reconciler{Store: b, Settler: b}).Reconcile(context.Background(), fileOf(nil, "2025-03-01"), Options{AllMerchants: true, DryRun: dry})
		require.NoError(t, err)
		require.Empty(t, b.settled, "dry run %t", dry)
		require.Zero(t, rep.Counts.ResolvedNotCharged)
		require.Len(t, rep.Pending, 1, "%+v", rep)
		require.Equal(t, ReasonAuthorizationUnknown, rep.Pending[0].Reason)
		require.Equal(t, payment.StatusUnknown, b.get(p.ID).Status)
	}
}

func TestReconcileSettleFailures(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	stuck := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
	slow := b.add(merchA, payment.StatusUnknown, 500, "TRY", at, at.Add(time.Second))
	broken := b.add(merchA, payment.StatusUnknown, 600, "TRY", at, at.Add(time.Second))
	b.onSettle = func(p *payment.Payment) error {
		if p.ID == stuck.ID {
			// refused although the database still says unknown (the workflow is not parked yet)
			return fmt.Errorf("%w: payment is processing, not unknown", workflows.ErrSettlementRejected)
		}
		return errors.New("workflow task failed")
	}
	r := &Reconciler{Store: b, Settler: slowSettler{b, workflows.PaymentWorkflowID(merchA, slow.IdempotencyKey)}, SettleTimeout: 50 * time.Millisecond}
	rep, err := r.Reconcile(context.Background(), fileOf([]Line{line(2, stuck, "2025-03-01")}, "2025-03-01"), Options{AllMerchants: true})
	require.NoError(t, err)
	require.Equal(t, map[string]string{stuck.ID.String(): KindSettleFailed, slow.ID.String(): KindSettleFailed,
		broken.ID.String(): KindSettleFailed}, kinds(rep))
	require.False(t, rep.OK())
	for _, p := range []payment.Payment{stuck, slow, broken} {
		require.Equal(t, payment.StatusUnknown, b.get(p.ID).Status)
	}
}

// A manual payment authorized on day 1 whose capture, sent on day 3, got no answer: the complete
// file of day 3 alone, which does not list it, releases it (its window runs from the capture's
// sending); a file of day 2 does not look at it; a file of day 3 made before the booking window
// passed leaves it pending.
func TestReconcileUnknownCaptureOnALaterDay(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	created := day.Add(10 * time.Hour)
	captureUnknown := day.AddDate(0, 0, 2).Add(10 * time.Hour)
	p := b.add(merchA, payment.StatusUnknown, 7000, "TRY", created, captureUnknown)
	b.payments[p.ID].CaptureManual, b.payments[p.ID].ProviderReference = true, "au_1"
	r := &Reconciler{Store: b, Settler: b}
	rep, err := r.Reconcile(context.Background(), fileOf(nil, "2025-03-02"), Options{AllMerchants: true})
	require.NoError(t, err)
	require.Equal(t, Counts{}, rep.Counts, "day 2: neither its authorization's day nor its capture's")
	rep, err = r.Reconcile(context.Background(), fileOf(nil, "2025-03-03"), Options{AllMerchants: true})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Counts.ResolvedNotCharged, "%+v", rep)
	require.Equal(t, payment.StatusCanceled, b.get(p.ID).Status)
}

// A manual payment authorized on day 1 and captured on day 3 is checked by the import of day 3,
// when its capture was booked: missing from that complete file, it is succeeded_but_missing;
// listed, it matches. Day 1's file, which could not list it, leaves it to day 3's.
func TestReconcileCaptureOnALaterDay(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	p := b.add(merchA, payment.StatusSucceeded, 7000, "TRY", day.Add(10*time.Hour), day.AddDate(0, 0, 2).Add(10*time.Hour))
	b.payments[p.ID].CaptureManual, b.payments[p.ID].CapturedMinor = true, 7000
	r := &Reconciler{Store: b, Settler: b}
	reconcile := func(f *File) *Report {
		rep, err := r.Reconcile(context.Background(), f, Options{AllMerchants: true})
		require.NoError(t, err)
		return rep
	}
	rep := reconcile(fileOf(nil, "2025-03-01"))
	require.Empty(t, rep.Mismatches)
	require.Empty(t, rep.Pending, "day 1: its capture was booked on day 3")
	rep = reconcile(fileOf(nil, "2025-03-03"))
	require.Equal(t, map[string]string{p.ID.String(): KindSucceededButMissing}, kinds(rep))
	rep = reconcile(fileOf([]Line{line(2, p, "2025-03-03")}, "2025-03-03"))
	require.True(t, rep.OK(), "%+v", rep)
	require.Equal(t, 1, rep.Counts.Matched)
}

// A manual payment whose authorization's answer was lost just before midnight, and which was
// marked unknown after it, is looked at by its creation day's import: the imports of later days
// look only at captures and voids (authorized before, with the bank's reference).
func TestReconcileUnknownAuthorizationPastMidnight(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	p := b.add(merchA, payment.StatusUnknown, 7000, "TRY", day.Add(23*time.Hour+58*time.Minute), day.Add(24*time.Hour+2*time.Minute))
	b.payments[p.ID].CaptureManual, b.payments[p.ID].ProviderReference = true, "" // never authorized, as far as kasa knows
	rep, err := (&Reconciler{Store: b, Settler: b}).Reconcile(context.Background(), fileOf(nil, "2025-03-01"), Options{AllMerchants: true})
	require.NoError(t, err)
	require.Len(t, rep.Pending, 1, "%+v", rep)
	require.Equal(t, ReasonWindowNotCovered, rep.Pending[0].Reason, "its window runs into the next day")
}

// A manual payment still waiting for its capture that the file lists as captured: while its
// capture is in flight (the bank booked it, kasa awaits the answer) it is pending, as a payment
// still processing is; with no capture sent it is charged_but_failed.
func TestReconcileListedCaptureInFlight(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	b.capturing = map[uuid.UUID]bool{}
	at := day.Add(time.Hour)
	inFlight := b.add(merchA, payment.StatusRequiresCapture, 4000, "TRY", at, at.Add(time.Second))
	none := b.add(merchA, payment.StatusRequiresCapture, 4000, "TRY", at, at.Add(time.Second))
	for _, p := range []payment.Payment{inFlight, none} {
		b.payments[p.ID].CaptureManual = true
	}
	b.capturing[inFlight.ID] = true
	rep, err := (&Reconciler{Store: b, Settler: b}).Reconcile(context.Background(),
		fileOf([]Line{line(2, inFlight, "2025-03-01"), line(3, none, "2025-03-01")}, "2025-03-01"), Options{AllMerchants: true})
	require.NoError(t, err)
	require.Equal(t, map[string]string{none.ID.String(): KindChargedButFailed}, kinds(rep))
	require.Len(t, rep.Pending, 1)
	require.Equal(t, ReasonProcessing, rep.Pending[0].Reason)
	require.Equal(t, inFlight.ID.String(), rep.Pending[0].PaymentID)
}

// A settlement the workflow sets aside because the bank's own answer contradicts it (or one that
// led to such a hold) is a bank_conflict for an operator, listed or not: not a settle_failed to
// import again.
func TestReconcileBankConflict(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	listed := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
	unlisted := b.add(merchA, payment.StatusUnknown, 500, "TRY", at, at.Add(time.Second))
	b.onSettle = func(*payment.Payment) error {
		return fmt.Errorf("%w: %w: the bank captured the authorization au_1 that kasa was voiding", workflows.ErrSettlementRejected, workflows.ErrBankConflict)
	}
	rep, err := (&Reconciler{Store: b, Settler: b}).Reconcile(context.Background(), fileOf([]Line{line(2, listed, "2025-03-01")}, "2025-03-01"), Options{AllMerchants: true})
	require.NoError(t, err)
	require.Equal(t, map[string]string{listed.ID.String(): KindBankConflict, unlisted.ID.String(): KindBankConflict}, kinds(rep))
	require.False(t, rep.OK())
	require.Contains(t, rep.Mismatches[0].Found, "that kasa was voiding")
}

// A dry run reports a payment held for a bank conflict as the import would (bank_conflict, not
// ok): not as released. The workflow flagged it stuck with the conflict, which the store keeps,
// and the conflict refuses one outcome: a charged one (Revision 6 on) lets the unlisted payment's
// not_charged through.
func TestReconcileDryRunOfABankConflict(t *testing.T) {
	for _, tc := range []struct {
		name, refused, reason string
		listed                bool
		want                  string // the payment's mismatch, "" when it is settled
	}{
		{"not_charged refused, unlisted", workflows.OutcomeNotCharged,
			"a not_charged settlement contradicts the bank, whose inquiry found the payment done (ch_1)", false, KindBankConflict},
		{"charged refused, listed", workflows.OutcomeCharged,
			"a charged settlement contradicts the bank, whose inquiry says the payment was declined", true, KindBankConflict},
		{"charged refused, unlisted", workflows.OutcomeCharged,
			"a charged settlement contradicts the bank, whose inquiry says the payment was declined", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newFakeBank()
			at := day.Add(time.Hour)
			held := b.add(merchA, payment.StatusUnknown, 500, "TRY", at, at.Add(time.Second))
			conflict := workflows.ConflictReason(tc.refused, tc.reason)
			b.payments[held.ID].StuckReason = conflict
			if tc.want != "" {
				b.onSettle = func(*payment.Payment) error {
					return fmt.Errorf("%w: %w: %s", workflows.ErrSettlementRejected, workflows.ErrBankConflict, conflict)
				}
			}
			var lines []Line
			if tc.listed {
				lines = []Line{line(2, *b.payments[held.ID], "2025-03-01")}
			}
			r := &Reconciler{Store: b, Settler: b}
			file := fileOf(lines, "2025-03-01")
			dry, err := r.Reconcile(context.Background(), file, Options{AllMerchants: true, DryRun: true})
			require.NoError(t, err)
			done, err := r.Reconcile(context.Background(), file, Options{AllMerchants: true})
			require.NoError(t, err)
			want := map[string]string{}
			if tc.want != "" {
				want[held.ID.String()] = tc.want
			}
			require.Equal(t, want, kinds(done))
			require.Equal(t, kinds(done), kinds(dry), "the dry run says what the import does")
			require.Equal(t, done.OK(), dry.OK(), "the dry run's exit status is the import's")
		})
	}
}

// slowSettler never answers for one workflow (no worker polls its task queue).
type slowSettler struct {
	*fakeBank
	stuck string
}

func (s slowSettler) Settle(ctx context.Context, workflowID string, st workflows.Settlement) (string, error) {
	if workflowID == s.stuck {
		<-ctx.Done()
		return "", ctx.Err()
	}
	return s.fakeBank.Settle(ctx, workflowID, st)
}

func TestReconcileAbortsWhenUnavailable(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	p := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
	b.onSettle = func(*payment.Payment) error { return serviceerror.NewUnavailable("temporal is down") }
	_, err := (&Reconciler{Store: b, Settler: b}).Reconcile(context.Background(), fileOf([]Line{line(2, p, "2025-03-01")}), Options{AllMerchants: true})
	require.ErrorContains(t, err, "temporal is down")

	b2 := newFakeBank()
	b2.byIDErr = payment.ErrUnavailable
	_, err = (&Reconciler{Store: b2, Settler: b2}).Reconcile(context.Background(), fileOf([]Line{line(2, p, "2025-03-01")}), Options{AllMerchants: true})
	require.ErrorIs(t, err, payment.ErrUnavailable)
}

// parkedSettler counts its calls and answers none until their context ends (no worker polls
// the task queue).
type parkedSettler struct{ calls atomic.Int32 }

func (s *parkedSettler) Settle(ctx context.Context, _ string, _ workflows.Settlement) (string, error) {
	s.calls.Add(1)
	<-ctx.Done()
	return "", ctx.Err()
}

// An import stopped (SIGTERM to kasa reconcile, its API shutting down) sends no settlement
// after that, even as a slot frees, records no run and changes nothing it did not settle.
func TestReconcileStoppedSendsNoFurtherSettlement(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	var lines []Line
	for i := range 8 {
		lines = append(lines, line(2+i, b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second)), "2025-03-01"))
	}
	s, runs := &parkedSettler{}, &runLog{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for s.calls.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	_, err := (&Reconciler{Store: b, Settler: s, Runs: runs, Concurrency: 1}).Reconcile(ctx, fileOf(lines), Options{AllMerchants: true})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int32(1), s.calls.Load(), "the settlement in flight, and no other")
	require.Empty(t, runs.runs)
	for _, l := range lines {
		require.Equal(t, payment.StatusUnknown, b.get(l.Reference).Status)
	}
}

func TestReconcileDeclaredDaysAndMerchants(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	a := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
	other := b.add(merchB, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
	r := &Reconciler{Store: b, Settler: b}

	// A file with no lines covers no day unless the day is declared.
	rep, err := r.Reconcile(context.Background(), &File{}, Options{AllMerchants: true})
	require.NoError(t, err)
	require.Empty(t, rep.Days)
	require.Equal(t, Counts{}, rep.Counts)
	require.Empty(t, b.createdIn)

	// Declared, but without a trailer the file may be cut short: nothing is released.
	rep, err = r.Reconcile(context.Background(), &File{}, Options{Days: []Day{"2025-03-01"}, Merchants: []uuid.UUID{merchA}})
	require.NoError(t, err)
	require.Equal(t, Counts{Pending: 1}, rep.Counts)
	require.Equal(t, ReasonFileNotComplete, rep.Pending[0].Reason)
	require.Equal(t, payment.StatusUnknown, b.get(a.ID).Status)

	// A trailer declares the day (with or without --date) and proves the file complete.
	rep, err = r.Reconcile(context.Background(), fileOf(nil, "2025-03-01"), Options{Days: []Day{"2025-03-01"}, Merchants: []uuid.UUID{merchA}})
	require.NoError(t, err)
	require.Equal(t, Counts{ResolvedNotCharged: 1}, rep.Counts)
	require.Equal(t, []string{merchA.String()}, rep.Merchants)
	require.Equal(t, payment.StatusFailed, b.get(a.ID).Status)
	require.Equal(t, payment.StatusUnknown, b.get(other.ID).Status, "another merchant's payment is out of scope")
	require.Equal(t, [2]time.Time{day, day.Add(24 * time.Hour)}, b.createdIn[0])

	// A file for another day than declared is refused whole: by its lines, or by its trailer.
	for _, f := range []*File{fileOf([]Line{line(7, other, "2025-03-02")}), fileOf(nil, "2025-03-02")} {
		_, err = r.Reconcile(context.Background(), f, Options{Days: []Day{"2025-03-01"}})
		var fe *FileError
		require.ErrorAs(t, err, &fe)
		require.Len(t, fe.Errors, 1)
		require.Contains(t, fe.Errors[0].Error(), "2025-03-02")
		require.Contains(t, fe.Errors[0].Error(), "not one of the declared days")
	}
	require.Equal(t, payment.StatusUnknown, b.get(other.ID).Status)
}

func TestImportRejectsBadFileBeforeTouchingAnything(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	p := b.add(merchA, payment.StatusUnknown, 4000, "TRY", day.Add(time.Hour), day.Add(time.Hour))
	in := hdr + "2025-03-01,ch_1," + p.ID.String() + ",40.00,TRY,settled\n2025-03-01,ch_2,x,1,TRY,settled\n"
	_, err := (&Reconciler{Store: b, Settler: b}).Import(context.Background(), strings.NewReader(in), Options{AllMerchants: true})
	var fe *FileError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, 0, b.calls)
	require.Equal(t, payment.StatusUnknown, b.get(p.ID).Status)
}

func TestReportJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(&Report{})
	require.NoError(t, err)
	require.JSONEq(t, `{"ok":true,"dry_run":false,"days":[],"complete":[],"scope":"","lines":0,"refund_lines":0,"charges_covered":false,"refunds_covered":false,
		"counts":{"matched":0,"resolved_charged":0,"resolved_not_charged":0,"pending":0,"mismatches":0,
		"refund_matched":0,"refund_resolved_charged":0,"refund_resolved_not_charged":0,"refund_pending":0,"refund_mismatches":0},
		"resolved":[],"mismatches":[],"pending":[],"refund_resolved":[],"refund_mismatches":[],"refund_pending":[]}`, string(b))

	// A refund's mismatch alone makes the report not OK.
	rep := Report{RefundMismatches: []Mismatch{{Kind: KindRefundedButFailed, Line: 3, Reference: ref1, RefundID: ref1, Expected: "failed", Found: "settled"}}}
	rep.sort()
	require.False(t, rep.OK())
	b, err = json.Marshal(rep)
	require.NoError(t, err)
	var refunds map[string]any
	require.NoError(t, json.Unmarshal(b, &refunds))
	require.Equal(t, false, refunds["ok"])
	require.Equal(t, float64(1), refunds["counts"].(map[string]any)["refund_mismatches"])
	require.Equal(t, float64(0), refunds["counts"].(map[string]any)["mismatches"])
	require.Equal(t, ref1, refunds["refund_mismatches"].([]any)[0].(map[string]any)["refund_id"])

	rep = Report{Days: []Day{"2025-03-01"}, Lines: 1, Mismatches: []Mismatch{{Kind: KindUnknownReference, Line: 2, Reference: ref1, Expected: "no payment with this id", Found: "settled"}}}
	rep.sort()
	b, err = json.Marshal(rep)
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, false, back["ok"])
	require.Equal(t, float64(1), back["counts"].(map[string]any)["mismatches"])
	require.Equal(t, "unknown_reference", back["mismatches"].([]any)[0].(map[string]any)["kind"])
}

func TestReconcileConcurrentImportsSettleOnce(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	var lines []Line
	for i := range 50 {
		p := b.add(merchA, payment.StatusUnknown, int64(100+i), "TRY", at, at.Add(time.Second))
		if i%2 == 0 {
			lines = append(lines, line(i+2, p, "2025-03-01"))
		}
	}
	r := &Reconciler{Store: b, Settler: b, Concurrency: 4}
	var wg sync.WaitGroup
	reports := make([]*Report, 3)
	for i := range reports {
		wg.Go(func() {
			rep, err := r.Reconcile(context.Background(), fileOf(lines, "2025-03-01"), Options{AllMerchants: true})
			require.NoError(t, err)
			reports[i] = rep
		})
	}
	wg.Wait()
	require.Len(t, b.settled, 50, "each payment settled exactly once")
	var charged, released int
	for _, rep := range reports {
		require.True(t, rep.OK(), "%+v", rep.Mismatches)
		charged += rep.Counts.ResolvedCharged
		released += rep.Counts.ResolvedNotCharged
	}
	require.Equal(t, 25, charged)
	require.Equal(t, 25, released)
}

// An unlisted payment is decided only from a file that covers its whole charge window, from its
// creation to the booking window after its last change; an unknown one is released only when
// every day of that window is complete by a trailer.
func TestReconcileUnlistedNeedsTheWholeWindow(t *testing.T) {
	t.Parallel()
	const window = 30 * time.Second
	d, next := Day("2025-03-01"), Day("2025-03-02")
	created, changed := day.Add(10*time.Hour), day.Add(10*time.Hour+time.Minute)
	now := time.Now().UTC()
	yesterday, today := DayOf(now.AddDate(0, 0, -1)), DayOf(now)
	trailer := func(d Day, asOf time.Time) Trailer { return Trailer{Day: d, AsOf: asOf} }
	tests := []struct {
		name             string
		status           payment.Status
		created, changed time.Time
		file             File
		days             []Day  // declared
		want             string // a pending reason, or the outcome
	}{
		{"complete day", payment.StatusUnknown, created, changed, File{Trailers: []Trailer{trailer(d, next.Start())}}, nil, "released"},
		{"no trailer", payment.StatusUnknown, created, changed, File{}, []Day{d}, ReasonFileNotComplete},
		{"no trailer, succeeded", payment.StatusSucceeded, created, changed, File{}, []Day{d}, KindSucceededButMissing},
		{"file made within the booking window", payment.StatusUnknown, created, changed,
			File{Trailers: []Trailer{trailer(d, changed.Add(window-time.Second))}}, nil, ReasonBookingWindow},
		{"file made within the booking window, succeeded", payment.StatusSucceeded, created, changed,
			File{Trailers: []Trailer{trailer(d, changed.Add(window-time.Second))}}, nil, ReasonBookingWindow},
		{"file made after the booking window", payment.StatusUnknown, created, changed,
			File{Trailers: []Trailer{trailer(d, changed.Add(window+time.Second))}}, nil, "released"},
		{"window runs past midnight", payment.StatusUnknown, created, next.Start().Add(-window / 2),
			File{Trailers: []Trailer{trailer(d, next.Start().Add(time.Hour))}}, nil, ReasonWindowNotCovered},
		{"window runs past midnight, next day declared without trailer", payment.StatusUnknown, created, next.Start().Add(-window / 2),
			File{Trailers: []Trailer{trailer(d, next.Start().Add(time.Hour))}}, []Day{d, next}, ReasonFileNotComplete},
		{"window runs past midnight, both days complete", payment.StatusUnknown, created, next.Start().Add(-window / 2),
			File{Trailers: []Trailer{trailer(d, next.End()), trailer(next, next.End())}}, nil, "released"},
		{"file for the day before", payment.StatusUnknown, created, changed,
			File{Trailers: []Trailer{trailer(DayOf(day.AddDate(0, 0, -1)), next.Start())}}, nil, "untouched"},
		{"younger than the booking window", payment.StatusUnknown, now.Add(-2 * time.Second), now.Add(-time.Second),
			File{Trailers: []Trailer{trailer(yesterday, now.Add(time.Hour)), trailer(today, now.Add(time.Hour))}}, nil, ReasonBookingWindow},
		{"older than the booking window", payment.StatusUnknown, now.Add(-window - 2*time.Second), now.Add(-window - time.Second),
			File{Trailers: []Trailer{trailer(yesterday, now.Add(time.Hour)), trailer(today, now.Add(time.Hour))}}, nil, "released"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := newFakeBank()
			p := b.add(merchA, tt.status, 700, "TRY", tt.created, tt.changed)
			rep, err := (&Reconciler{Store: b, Settler: b, BookingWindow: window}).Reconcile(context.Background(), &tt.file, Options{AllMerchants: true, Days: tt.days})
			require.NoError(t, err)
			now := b.get(p.ID)
			switch tt.want {
			case "released":
				require.Equal(t, Counts{ResolvedNotCharged: 1}, rep.Counts, "%+v", rep.Pending)
				require.Equal(t, payment.StatusFailed, now.Status)
				require.Equal(t, []Resolution{{Outcome: workflows.OutcomeNotCharged, Reference: p.ID.String(), PaymentID: p.ID.String(),
					MerchantID: merchA.String(), WorkflowID: workflows.PaymentWorkflowID(merchA, p.IdempotencyKey)}}, rep.Resolved)
			case "untouched":
				require.Equal(t, Counts{}, rep.Counts)
				require.Equal(t, p, now)
			case KindSucceededButMissing:
				require.Equal(t, map[string]string{p.ID.String(): tt.want}, kinds(rep))
				require.Equal(t, p, now)
			default:
				require.Equal(t, Counts{Pending: 1}, rep.Counts, "%+v", rep.Mismatches)
				require.Equal(t, tt.want, rep.Pending[0].Reason, rep.Pending[0].Detail)
				require.Equal(t, p, now, "a pending payment is left as it is")
				require.Zero(t, b.calls)
			}
		})
	}
}

// An import judges a file's as_of by the database's clock, which stamped when the payment's
// outcome was decided: the clock of the host that runs the import, ahead of it, would let a file
// the bank made within the booking window (its own clock ahead as well) release a payment the
// bank may still book.
func TestReconcileJudgesAsOfByTheDatabasesClock(t *testing.T) {
	t.Parallel()
	const window = 30 * time.Second
	dbNow := day.Add(12 * time.Hour) // this host's clock is far ahead of it
	for _, tc := range []struct {
		name string
		asOf time.Time
		want Counts
	}{
		{"as_of ahead of the database's clock", dbNow.Add(time.Minute), Counts{Pending: 1}},
		{"as_of past the window by the database's clock", dbNow, Counts{ResolvedNotCharged: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newFakeBank()
			b.clock = func() time.Time { return dbNow }
			decided := dbNow.Add(-window - time.Second)
			if tc.want.Pending == 1 {
				decided = dbNow.Add(-5 * time.Second) // the bank may book it for 25 s more
			}
			p := b.add(merchA, payment.StatusUnknown, 700, "TRY", decided.Add(-time.Second), decided)
			file := File{Trailers: []Trailer{{Day: DayOf(dbNow), AsOf: tc.asOf}}}
			rep, err := (&Reconciler{Store: b, Settler: b, BookingWindow: window}).Reconcile(context.Background(), &file, Options{AllMerchants: true})
			require.NoError(t, err)
			require.Equal(t, tc.want, rep.Counts, "%+v", rep.Pending)
			if tc.want.Pending == 1 {
				require.Equal(t, ReasonBookingWindow, rep.Pending[0].Reason, rep.Pending[0].Detail)
				require.Equal(t, payment.StatusUnknown, b.get(p.ID).Status, "the hold is kept")
				require.Zero(t, b.calls)
			}
		})
	}
}

// workerWindow is the longest booking window the workers reported.
type workerWindow time.Duration

func (w workerWindow) LongestBookingWindow(context.Context, time.Duration) (time.Duration, error) {
	return time.Duration(w), nil
}

// The workers' booking window governs an import whose own is shorter: the workers are what talk
// to the bank, and an API left at its default must not release a payment the bank may still book.
func TestReconcileWaitsOutTheWorkersBookingWindow(t *testing.T) {
	t.Parallel()
	d := Day("2025-03-01")
	created, decided := day.Add(10*time.Hour), day.Add(10*time.Hour+time.Minute)
	file := File{Trailers: []Trailer{{Day: d, AsOf: decided.Add(10 * time.Minute)}}}
	for _, tc := range []struct {
		workers WorkerWindows
		want    Counts
	}{
		{nil, Counts{ResolvedNotCharged: 1}},
		{workerWindow(5 * time.Minute), Counts{ResolvedNotCharged: 1}},
		{workerWindow(time.Hour), Counts{Pending: 1}},
	} {
		b := newFakeBank()
		p := b.add(merchA, payment.StatusUnknown, 700, "TRY", created, decided)
		r := &Reconciler{Store: b, Settler: b, BookingWindow: 30 * time.Second}
		if tc.workers != nil {
			r.Workers = tc.workers
		}
		rep, err := r.Reconcile(context.Background(), &file, Options{AllMerchants: true})
		require.NoError(t, err)
		require.Equal(t, tc.want, rep.Counts, "workers %v", tc.workers)
		if tc.want.Pending == 1 {
			require.Equal(t, ReasonBookingWindow, rep.Pending[0].Reason)
			require.Equal(t, payment.StatusUnknown, b.get(p.ID).Status)
		}
	}
}

// runLog keeps the recorded runs.
type runLog struct {
	mu   sync.Mutex
	runs []store.ReconciliationRun
}

// RecordReconciliation refuses a run under a context already ended, as the database would.
func (l *runLog) RecordReconciliation(ctx context.Context, r store.ReconciliationRun) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs = append(l.runs, r)
	return nil
}

// A dry run reports exactly what the import then does, and changes nothing.
func TestReconcileDryRun(t *testing.T) {
	t.Parallel()
	b := newFakeBank()
	at := day.Add(time.Hour)
	listed := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
	unlisted := b.add(merchA, payment.StatusUnknown, 500, "TRY", at, at.Add(time.Second))
	succeeded := b.add(merchA, payment.StatusSucceeded, 600, "TRY", at, at.Add(time.Second))
	missing := b.add(merchA, payment.StatusSucceeded, 700, "TRY", at, at.Add(time.Second))
	processing := b.add(merchA, payment.StatusProcessing, 800, "TRY", at, at.Add(time.Second))
	file := fileOf([]Line{line(2, listed, "2025-03-01"), line(3, succeeded, "2025-03-01"), line(4, processing, "2025-03-01")}, "2025-03-01")
	runs := &runLog{}
	r := &Reconciler{Store: b, Settler: b, Runs: runs}

	dry, err := r.Reconcile(context.Background(), file, Options{AllMerchants: true, DryRun: true})
	require.NoError(t, err)
	require.True(t, dry.DryRun)
	require.Zero(t, b.calls, "no settlement sent")
	require.Empty(t, runs.runs, "no run recorded")
	for _, p := range []payment.Payment{listed, unlisted, succeeded, missing, processing} {
		require.Equal(t, p, b.get(p.ID))
	}
	require.Equal(t, Counts{Matched: 1, ResolvedCharged: 1, ResolvedNotCharged: 1, Pending: 1, Mismatches: 1}, dry.Counts)
	require.Equal(t, []Resolution{
		{Outcome: workflows.OutcomeCharged, Line: 2, Reference: listed.ID.String(), PaymentID: listed.ID.String(), MerchantID: merchA.String(),
			WorkflowID: workflows.PaymentWorkflowID(merchA, listed.IdempotencyKey), ProviderChargeID: "ch_" + listed.ID.String()[:8]},
		{Outcome: workflows.OutcomeNotCharged, Reference: unlisted.ID.String(), PaymentID: unlisted.ID.String(), MerchantID: merchA.String(),
			WorkflowID: workflows.PaymentWorkflowID(merchA, unlisted.IdempotencyKey)},
	}, dry.Resolved)

	done, err := r.Reconcile(context.Background(), file, Options{AllMerchants: true})
	require.NoError(t, err)
	require.False(t, done.DryRun)
	require.Len(t, runs.runs, 1)
	require.Equal(t, 2, b.calls)
	dry.DryRun = false
	require.Equal(t, dry, done, "the dry run said what the import did")
}

// An import keeps the days it found each reference on, so a later file listing it on another day
// is charged_twice; what keeps nothing (a dry run), or lists it on the same day again (an import
// stopped half-way and run again, the same day's file with or without its trailer), is no second
// listing; and a payment's listings and its refund's are kept apart.
func TestReconcileListingsAcrossImports(t *testing.T) {
	t.Parallel()
	const d1, d2 = Day("2025-03-01"), Day("2025-03-02")
	at := day.Add(time.Hour)
	tests := []struct {
		name   string
		before func(t *testing.T, r *Reconciler, b *fakeBank, p payment.Payment, rf payment.Refund)
		// then is the file the last import reads: p listed on d2 (refund lines: rf)
		refundOnly bool
		want       string // the last import's kind for the listed one: "" none (it is settled)
	}{
		{name: "an import on another day", want: KindChargedTwice,
			before: func(t *testing.T, r *Reconciler, b *fakeBank, p payment.Payment, _ payment.Refund) {
				_, err := r.Reconcile(context.Background(), fileOf([]Line{line(2, p, d1)}, d1), Options{})
				require.NoError(t, err)
			}},
		{name: "a dry run on another day keeps nothing",
			before: func(t *testing.T, r *Reconciler, b *fakeBank, p payment.Payment, _ payment.Refund) {
				_, err := r.Reconcile(context.Background(), fileOf([]Line{line(2, p, d1)}, d1), Options{AllMerchants: true, DryRun: true})
				require.NoError(t, err)
			}},
		{name: "an import of the same day stopped half-way",
			before: func(t *testing.T, r *Reconciler, b *fakeBank, p payment.Payment, _ payment.Refund) {
				b.onSettle = func(*payment.Payment) error { return serviceerror.NewUnavailable("temporal is down") }
				_, err := r.Reconcile(context.Background(), fileOf([]Line{line(2, p, d2)}, d2), Options{AllMerchants: true})
				require.Error(t, err)
				b.onSettle = nil
			}},
		{name: "the same day without its trailer",
			before: func(t *testing.T, r *Reconciler, b *fakeBank, p payment.Payment, _ payment.Refund) {
				_, err := r.Reconcile(context.Background(), &File{Lines: []Line{line(2, p, d2)}}, Options{AllMerchants: true})
				require.NoError(t, err)
				b.mu.Lock()
				b.payments[p.ID].Status = payment.StatusUnknown // as if that import had not settled it
				b.mu.Unlock()
			}},
		{name: "its payment on another day", refundOnly: true,
			before: func(t *testing.T, r *Reconciler, b *fakeBank, p payment.Payment, rf payment.Refund) {
				l := line(2, p, d1)
				l.Reference = rf.PaymentID
				f := typedFile([]Line{l}, d1)
				f.Scope = nil // it releases no refund it does not list
				_, err := r.Reconcile(context.Background(), f, Options{})
				require.NoError(t, err)
			}},
		{name: "a refund on another day", refundOnly: true, want: KindChargedTwice,
			before: func(t *testing.T, r *Reconciler, b *fakeBank, _ payment.Payment, rf payment.Refund) {
				_, err := r.Reconcile(context.Background(), typedFile([]Line{refundLine(2, rf, d1)}, d1), Options{})
				require.NoError(t, err)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := newFakeBank()
			p := b.add(merchA, payment.StatusUnknown, 4000, "TRY", at, at.Add(time.Second))
			rf := b.addRefund(merchA, payment.StatusUnknown, 1000, "TRY", at, at.Add(time.Second))
			if tt.refundOnly {
				b.mu.Lock()
				b.payments[rf.PaymentID] = &payment.Payment{ID: rf.PaymentID, MerchantID: merchA, IdempotencyKey: nextKey("key"),
					AmountMinor: 4000, Currency: "TRY", Status: payment.StatusSucceeded, CreatedAt: at, UpdatedAt: at}
				b.mu.Unlock()
			}
			r := &Reconciler{Store: b, Settler: b}
			tt.before(t, r, b, p, rf)
			before := b.get(p.ID).Status
			if tt.refundOnly {
				before = b.getRefund(rf.ID).Status
			}

			f := fileOf([]Line{line(2, p, d2)}, d2)
			if tt.refundOnly {
				f = typedFile([]Line{refundLine(2, rf, d2)}, d2)
			}
			rep, err := r.Reconcile(context.Background(), f, Options{Days: []Day{d2}, Merchants: []uuid.UUID{merchB}})
			require.NoError(t, err)
			mismatches, status := rep.Mismatches, b.get(p.ID).Status
			if tt.refundOnly {
				mismatches, status = rep.RefundMismatches, b.getRefund(rf.ID).Status
			}
			if tt.want == "" {
				require.Empty(t, mismatches)
				require.Equal(t, payment.StatusSucceeded, status, "settled as listed")
				return
			}
			require.Len(t, mismatches, 1)
			require.Equal(t, tt.want, mismatches[0].Kind)
			require.Contains(t, mismatches[0].Found, string(d1))
			require.Equal(t, before, status, "nothing is settled for it")
		})
	}
}

// A payment (or refund) an earlier import found listed while it was in flight, which a later
// complete file leaves out, is not released: the bank has said both that it moved the money and
// that it did not, and a person decides. Without the earlier listing the same file releases it.
func TestReconcileUnlistedButListedEarlierIsPending(t *testing.T) {
	t.Parallel()
	const d1 = Day("2025-03-01")
	at := day.Add(time.Hour)
	for _, listedEarlier := range []bool{true, false} {
		t.Run(fmt.Sprintf("listed earlier %v", listedEarlier), func(t *testing.T) {
			t.Parallel()
			b := newFakeBank()
			p := b.add(merchA, payment.StatusProcessing, 4000, "TRY", at, at.Add(time.Second))
			rf := b.addRefund(merchA, payment.StatusProcessing, 1000, "TRY", at, at.Add(time.Second))
			r := &Reconciler{Store: b, Settler: b}
			if listedEarlier {
				partial := typedFile([]Line{line(2, p, d1), refundLine(3, rf, d1)})
				partial.Scope = nil
				rep, err := r.Reconcile(context.Background(), partial, Options{})
				require.NoError(t, err)
				require.Equal(t, Counts{Pending: 1, RefundPending: 1}, rep.Counts, "both in flight: %+v", rep)
			}
			b.mu.Lock()
			b.payments[p.ID].Status, b.refunds[rf.ID].Status = payment.StatusUnknown, payment.StatusUnknown
			b.mu.Unlock()

			rep, err := r.Reconcile(context.Background(), typedFile(nil, d1), Options{})
			require.NoError(t, err)
			if !listedEarlier {
				require.Equal(t, Counts{ResolvedNotCharged: 1, RefundResolvedNotCharged: 1}, rep.Counts)
				return
			}
			require.Equal(t, Counts{Pending: 1, RefundPending: 1}, rep.Counts)
			for _, pe := range append(rep.Pending, rep.RefundPending...) {
				require.Equal(t, ReasonListedEarlier, pe.Reason)
				require.Contains(t, pe.Detail, string(d1))
			}
			require.Equal(t, payment.StatusUnknown, b.get(p.ID).Status, "its hold kept")
			require.Equal(t, payment.StatusUnknown, b.getRefund(rf.ID).Status)

			// A file of another day, which covers its window but not the day it was listed on,
			// leaves it for that day's file.
			b.mu.Lock()
			b.payments[p.ID].CreatedAt = d1.Start().Add(-time.Hour)
			b.refunds[rf.ID].CreatedAt = d1.Start().Add(-time.Hour)
			b.mu.Unlock()
			d0 := Day("2025-02-28")
			rep, err = r.Reconcile(context.Background(), typedFile(nil, d0), Options{})
			require.NoError(t, err)
			require.Equal(t, Counts{Pending: 1, RefundPending: 1}, rep.Counts)
			for _, pe := range append(rep.Pending, rep.RefundPending...) {
				require.Equal(t, ReasonWindowNotCovered, pe.Reason)
				require.Contains(t, pe.Detail, "listed on "+string(d1))
			}
		})
	}
}

// A run whose import was stopped just after its last settlement (its request's context ended) is
// still recorded: the settlements it made happened, and the runs and the last-run metric count it.
func TestRunStoppedAfterItsLastSettlementIsRecorded(t *testing.T) {
	rec := &runLog{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	(&Reconciler{Runs: rec}).record(ctx, &Report{Lines: 3})
	require.Len(t, rec.runs, 1)
	require.Equal(t, 3, rec.runs[0].Lines)
}
