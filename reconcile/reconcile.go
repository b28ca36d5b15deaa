package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// Store is what reconciliation reads from the database.
type Store interface {
	// PaymentsByID returns the payments among ids that exist (in no particular order).
	PaymentsByID(ctx context.Context, ids []uuid.UUID) ([]payment.Payment, error)
	// Payment reads one payment (payment.ErrNotFound if none).
	Payment(ctx context.Context, id uuid.UUID) (payment.Payment, error)
	// EachPaymentCreated calls fn for every payment created in [from, to) with one of the
	// statuses, of one of the merchants (all merchants when merchants is empty).
	EachPaymentCreated(ctx context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID, fn func(payment.Payment) error) error
}

// Settler resolves an unknown payment through its workflow's checked `settle` update
// (workflows.Starter). A payment that is not unknown answers workflows.ErrSettlementRejected.
type Settler interface {
	Settle(ctx context.Context, workflowID string, s workflows.Settlement) (string, error)
}

// Defaults of a Reconciler's tuning knobs.
const (
	DefaultConcurrency   = 8
	DefaultSettleTimeout = time.Minute
	DefaultBookingWindow = 30 * time.Second
	batchSize            = 500
)

// rereadDelay spaces the re-reads of a payment whose settlement was refused (tests shorten it).
var rereadDelay = 200 * time.Millisecond

// Reconciler matches settlement files to payments. It is safe for concurrent use; importing
// the same file twice changes nothing the second time.
type Reconciler struct {
	Store   Store
	Settler Settler
	// Concurrency bounds the settle updates in flight (default DefaultConcurrency).
	Concurrency int
	// SettleTimeout bounds one settle update; a payment whose workflow does not answer in time
	// (no worker polls its task queue...) is reported as settle_failed. Default DefaultSettleTimeout.
	SettleTimeout time.Duration
	// BookingWindow is how long the bank may take to book a charge after kasa stopped waiting
	// for it (KASA_PROVIDER_BOOKING_WINDOW); an unlisted payment is decided only once the file
	// covers that long after its last change. Default DefaultBookingWindow.
	BookingWindow time.Duration
	Logger        *slog.Logger
	// Runs, when set, keeps every finished reconciliation (the audit trail and the outcome
	// metrics); Source says who ran it ("cli" or "api").
	Runs   RunRecorder
	Source string
}

// RunRecorder keeps finished reconciliations (store.Store).
type RunRecorder interface {
	RecordReconciliation(ctx context.Context, r store.ReconciliationRun) error
}

// Options narrow one import.
type Options struct {
	// Days declares the UTC days the file covers. Empty: the days of its settlement_date values.
	// Declaring them lets a file with no lines (nothing settled that day) resolve that day's
	// unknown payments as not charged; every line's date must then be one of them.
	Days []Day
	// Merchants limits the coverage checks (releasing unlisted unknown payments, reporting
	// succeeded-but-missing) to these merchants, for providers that send one file per merchant.
	// Empty: all merchants. Listed lines are matched whatever their merchant.
	Merchants []uuid.UUID
	// Progress, when set, is called as lines are matched (done of total).
	Progress func(done, total int)
	// DryRun matches everything and reports what the import would do, but settles nothing and
	// records no run.
	DryRun bool
}

// Import parses a settlement file and reconciles it. A file that does not parse is a
// *FileError and changes nothing.
func (r *Reconciler) Import(ctx context.Context, f io.Reader, o Options) (*Report, error) {
	file, err := ParseFile(f)
	if err != nil {
		return nil, err
	}
	return r.Reconcile(ctx, file, o)
}

// Reconcile matches parsed lines to payments (see the package documentation and docs/operations.md):
//
//   - listed and unknown: settled as charged (provider_reference = provider_charge_id);
//   - listed and succeeded with the same amount and currency: matched;
//   - listed with another amount or currency, listed but failed, or listed without a payment:
//     a mismatch, and the payment is left as it is;
//   - listed and processing: pending;
//   - not listed, unknown or succeeded, created on a covered day: its charge window runs from
//     its creation to the booking window after its last change (when it became unknown, or
//     succeeded). Only once the file covers that whole window is it decided: unknown and every
//     day of the window complete by a trailer: settled as not charged; succeeded: a mismatch.
//     Otherwise it is pending, with the reason.
//
// A settlement the workflow refuses because the payment is no longer unknown (a concurrent or
// earlier import, an operator) is not an error: the payment is re-read and matched as it is now.
// The error is non-nil only when the import could not run (database or Temporal unavailable);
// what it settled before that stays settled, and a re-run continues safely.
//
// Refund lines are only counted (Report.RefundLines): payments are matched to charge lines alone.
func (r *Reconciler) Reconcile(ctx context.Context, f *File, o Options) (*Report, error) {
	lines, refunds := chargeLines(f.Lines)
	days, err := coveredDays(f, lines, o.Days)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	run := &run{r: r, ctx: ctx, cancel: cancel, dry: o.DryRun, now: time.Now(), window: r.BookingWindow,
		covered: map[Day]bool{}, complete: map[Day]time.Time{}, listed: make(map[uuid.UUID]bool, len(lines))}
	if run.window <= 0 {
		run.window = DefaultBookingWindow
	}
	run.report.DryRun = o.DryRun
	run.report.Days = days
	run.report.Lines = len(lines)
	run.report.RefundLines = refunds
	for _, d := range days {
		run.covered[d] = true
	}
	for _, t := range f.Trailers {
		// The file cannot know what was booked after it was read.
		run.complete[t.Day] = earliest(t.AsOf, run.now)
		run.report.Complete = append(run.report.Complete, Completeness{Day: t.Day, AsOf: t.AsOf})
	}
	for _, m := range o.Merchants {
		run.report.Merchants = append(run.report.Merchants, m.String())
	}
	n := r.Concurrency
	if n <= 0 {
		n = DefaultConcurrency
	}
	run.sem = make(chan struct{}, n)

	// 1. Every line, in batches: one query per batch.
	for start := 0; start < len(lines); start += batchSize {
		batch := lines[start:min(start+batchSize, len(lines))]
		ids := make([]uuid.UUID, len(batch))
		for i, l := range batch {
			ids[i] = l.Reference
			run.listed[l.Reference] = true
		}
		found, err := r.Store.PaymentsByID(ctx, ids)
		if err != nil {
			return nil, run.abort(fmt.Errorf("read payments: %w", err))
		}
		byID := make(map[uuid.UUID]payment.Payment, len(found))
		for _, p := range found {
			byID[p.ID] = p
		}
		for _, l := range batch {
			p, ok := byID[l.Reference]
			if !ok {
				run.mismatch(Mismatch{Kind: KindUnknownReference, Line: l.Number, Reference: l.Reference.String(),
					ProviderChargeID: l.ProviderChargeID, Expected: "no payment with this id", Found: describeLine(l)})
				continue
			}
			run.matchLine(l, p, true)
		}
		if ctx.Err() != nil {
			return nil, run.abort(context.Cause(ctx))
		}
		if o.Progress != nil {
			o.Progress(start+len(batch), len(lines))
		}
	}
	run.wg.Wait()

	// 2. Coverage: what the covered days should have listed and did not.
	var unlisted []payment.Payment
	statuses := []payment.Status{payment.StatusUnknown, payment.StatusSucceeded}
	for _, d := range days {
		from := d.Start()
		err := r.Store.EachPaymentCreated(ctx, from, from.AddDate(0, 0, 1), statuses, o.Merchants, func(p payment.Payment) error {
			if !run.listed[p.ID] {
				unlisted = append(unlisted, p)
			}
			return nil
		})
		if err != nil {
			return nil, run.abort(fmt.Errorf("read payments created on %s: %w", d, err))
		}
	}
	for _, p := range unlisted {
		run.checkUnlisted(p)
	}
	run.wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, run.abort(err)
	}
	run.report.sort()
	if !o.DryRun {
		r.record(ctx, &run.report)
	}
	return &run.report, nil
}

// record keeps the run. The settlements it made have happened whatever this does, so a
// failure is logged, not returned.
func (r *Reconciler) record(ctx context.Context, rep *Report) {
	if r.Runs == nil {
		return
	}
	body, err := json.Marshal(rep)
	if err == nil {
		days := make([]time.Time, len(rep.Days))
		for i, d := range rep.Days {
			days[i] = d.Start()
		}
		c := rep.Counts
		err = r.Runs.RecordReconciliation(ctx, store.ReconciliationRun{
			ID: payment.NewID(), Source: r.Source, Days: days, Lines: rep.Lines,
			Matched: c.Matched, ResolvedCharged: c.ResolvedCharged, ResolvedNotCharged: c.ResolvedNotCharged,
			Pending: c.Pending, Mismatches: c.Mismatches, Report: body,
		})
	}
	if err != nil {
		r.logger().Warn("reconciliation finished but was not recorded", "error", err)
	}
}

// chargeLines is the file's charge lines (a line without a type is one), and how many refund
// lines it set aside.
func chargeLines(all []Line) (charges []Line, refunds int) {
	charges = make([]Line, 0, len(all))
	for _, l := range all {
		if l.Type == TypeRefund {
			refunds++
			continue
		}
		charges = append(charges, l)
	}
	return charges, refunds
}

// coveredDays is the declared days, or the days of the charge lines and trailers; with declared
// days every line (of either type) and trailer must fall on one of them.
func coveredDays(f *File, charges []Line, declared []Day) ([]Day, error) {
	set := map[Day]bool{}
	for _, d := range declared {
		if _, err := ParseDay(string(d)); err != nil {
			return nil, &FileError{Errors: []LineError{{Field: "date", Message: fmt.Sprintf("%q %v", d, err)}}}
		}
		set[d] = true
	}
	if len(declared) > 0 {
		var fe FileError
		for _, l := range f.Lines {
			if !set[l.SettlementDate] {
				fe.add(l.Number, "settlement_date", fmt.Sprintf("%s is not one of the declared days", l.SettlementDate))
			}
		}
		for _, t := range f.Trailers {
			if !set[t.Day] {
				fe.add(t.Number, TrailerTag, fmt.Sprintf("the file is for %s, not one of the declared days", t.Day))
			}
		}
		if len(fe.Errors) > 0 {
			return nil, &fe
		}
	} else {
		for _, l := range charges {
			set[l.SettlementDate] = true
		}
		for _, t := range f.Trailers {
			set[t.Day] = true
		}
	}
	days := make([]Day, 0, len(set))
	for d := range set {
		days = append(days, d)
	}
	slices.Sort(days)
	return days, nil
}

// run is one import in progress.
type run struct {
	r        *Reconciler
	ctx      context.Context
	cancel   context.CancelCauseFunc
	dry      bool
	now      time.Time
	window   time.Duration
	covered  map[Day]bool
	complete map[Day]time.Time // days with a trailer: complete up to then (never after now)
	listed   map[uuid.UUID]bool
	sem      chan struct{}
	wg       sync.WaitGroup

	mu     sync.Mutex
	report Report
}

func (run *run) abort(err error) error {
	run.cancel(err)
	run.wg.Wait()
	return err
}

func (run *run) mismatch(m Mismatch) {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.report.Mismatches = append(run.report.Mismatches, m)
}

func (run *run) pending(p Pending) {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.report.Pending = append(run.report.Pending, p)
}

func (run *run) count(f func(*Counts)) {
	run.mu.Lock()
	defer run.mu.Unlock()
	f(&run.report.Counts)
}

// resolved records a payment settled (or, in a dry run, that would be).
func (run *run) resolved(p payment.Payment, st workflows.Settlement, line int, chargeID string) {
	run.mu.Lock()
	defer run.mu.Unlock()
	if st.Outcome == workflows.OutcomeCharged {
		run.report.Counts.ResolvedCharged++
	} else {
		run.report.Counts.ResolvedNotCharged++
	}
	ref := p.ID.String()
	run.report.Resolved = append(run.report.Resolved, Resolution{Outcome: st.Outcome, Line: line, Reference: ref, PaymentID: ref,
		MerchantID: p.MerchantID.String(), WorkflowID: workflowID(p), ProviderChargeID: chargeID})
}

// matchLine classifies a listed payment; settle is false once a settlement was refused (the
// payment is then matched as it is, never settled again by this import).
func (run *run) matchLine(l Line, p payment.Payment, settle bool) {
	m := Mismatch{Line: l.Number, Reference: l.Reference.String(), PaymentID: p.ID.String(), MerchantID: p.MerchantID.String(),
		WorkflowID: workflowID(p), ProviderChargeID: l.ProviderChargeID}
	switch {
	case p.Status == payment.StatusFailed:
		m.Kind, m.Expected, m.Found = KindChargedButFailed, describePayment(p), describeLine(l)
		run.mismatch(m)
	case p.Currency != l.Currency:
		m.Kind, m.Expected, m.Found = KindCurrencyDiffers, describePayment(p), describeLine(l)
		run.mismatch(m)
	case p.AmountMinor != l.AmountMinor:
		m.Kind, m.Expected, m.Found = KindAmountDiffers, describePayment(p), describeLine(l)
		run.mismatch(m)
	case p.Status == payment.StatusProcessing:
		run.pending(Pending{Reason: ReasonProcessing, Line: l.Number, Reference: m.Reference, PaymentID: m.PaymentID,
			MerchantID: m.MerchantID, WorkflowID: m.WorkflowID, Status: string(p.Status),
			Detail: "still processing: import the file again once it has finished"})
	case p.Status == payment.StatusSucceeded:
		if p.ProviderReference != "" && p.ProviderReference != l.ProviderChargeID {
			m.Kind, m.Expected, m.Found = KindProviderReferenceDiffers, "charge "+p.ProviderReference, "charge "+l.ProviderChargeID
			run.mismatch(m)
			return
		}
		run.count(func(c *Counts) { c.Matched++ })
	case p.Status == payment.StatusUnknown && settle:
		st := workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: l.ProviderChargeID,
			Note: fmt.Sprintf("reconciliation: settlement file line %d, settled %s", l.Number, l.SettlementDate)}
		run.settle(p, st, func(status string) {
			if status == string(payment.StatusSucceeded) {
				run.resolved(p, st, l.Number, l.ProviderChargeID)
				return
			}
			m.Kind, m.Expected, m.Found = KindSettleFailed, "unknown, settled as charged", "the workflow answered "+status
			run.mismatch(m)
		}, func(now payment.Payment) { run.matchLine(l, now, false) }, &m)
	default: // unknown, but its settlement was just refused
		m.Kind, m.Expected, m.Found = KindSettleFailed, describePayment(p), describeLine(l)+": the workflow refused the settlement while the payment is unknown; try again"
		run.mismatch(m)
	}
}

// checkUnlisted handles an unknown or succeeded payment created on a covered day that the file
// does not list. Its charge, if any, was booked between its creation and the booking window
// after its last change (payments.updated_at: when it became unknown, or succeeded; kasa
// records no later attempt). The file decides it only if it covers that whole window, and
// releases it only if every day of the window is complete by a trailer.
func (run *run) checkUnlisted(p payment.Payment) {
	bookBy := p.UpdatedAt.Add(run.window)
	var missing, open, unproven []Day
	for d := DayOf(p.CreatedAt); d <= DayOf(bookBy); d = d.Next() {
		if !run.covered[d] {
			missing = append(missing, d)
			continue
		}
		asOf, ok := run.complete[d]
		if !ok {
			asOf = run.now
			unproven = append(unproven, d)
		}
		if asOf.Before(earliest(d.End(), bookBy)) {
			open = append(open, d)
		}
	}
	ref := p.ID.String()
	m := Mismatch{Reference: ref, PaymentID: ref, MerchantID: p.MerchantID.String(), WorkflowID: workflowID(p)}
	pend := Pending{Reference: ref, PaymentID: ref, MerchantID: m.MerchantID, WorkflowID: m.WorkflowID, Status: string(p.Status)}
	window := fmt.Sprintf("created %s, last changed %s, the bank may book it until %s",
		payment.FormatTime(p.CreatedAt), payment.FormatTime(p.UpdatedAt), payment.FormatTime(bookBy))
	switch {
	case len(missing) > 0:
		// The charge may have happened on a day this file does not cover: deciding "not
		// charged" (or "missing") from it could release money the bank did take.
		pend.Reason, pend.Detail = ReasonWindowNotCovered, window+": the file does not cover "+joinDays(missing)
		run.pending(pend)
		return
	case len(open) > 0:
		// The bank may still book it, or booked it after the file was made.
		pend.Reason, pend.Detail = ReasonBookingWindow, window+": import a file made after that"
		if run.now.Before(bookBy) {
			pend.Detail = window + ": import again after that"
		}
		run.pending(pend)
		return
	case p.Status == payment.StatusUnknown && len(unproven) > 0:
		// Without a trailer the file may have been cut short: its silence proves nothing.
		pend.Reason, pend.Detail = ReasonFileNotComplete, "the file has no trailer for "+joinDays(unproven)+
			": it may be cut short, so it cannot prove the payment was not charged"
		run.pending(pend)
		return
	}
	switch p.Status {
	case payment.StatusSucceeded:
		m.Kind, m.Expected, m.Found = KindSucceededButMissing, describePayment(p), "not listed on "+joinDays(run.report.Days)
		run.mismatch(m)
	case payment.StatusUnknown:
		st := workflows.Settlement{Outcome: workflows.OutcomeNotCharged,
			Note: "reconciliation: not in the settlement file for " + joinDays(run.report.Days)}
		run.settle(p, st, func(status string) {
			if status == string(payment.StatusFailed) {
				run.resolved(p, st, 0, "")
				return
			}
			m.Kind, m.Expected, m.Found = KindSettleFailed, "unknown, settled as not charged", "the workflow answered "+status
			run.mismatch(m)
		}, func(now payment.Payment) {
			switch now.Status {
			case payment.StatusSucceeded: // settled as charged meanwhile, yet not in the file
				m.Kind, m.Expected, m.Found = KindSucceededButMissing, describePayment(now), "not listed on "+joinDays(run.report.Days)
				run.mismatch(m)
			case payment.StatusFailed: // released meanwhile: nothing left to do
			default:
				m.Kind, m.Expected, m.Found = KindSettleFailed, describePayment(now), "not listed: the workflow refused the settlement while the payment is unknown; try again"
				run.mismatch(m)
			}
		}, &m)
	}
}

// settle sends the settlement in the background (bounded by the semaphore). done gets the
// final status; refused gets the payment as it is now when the workflow refused the
// settlement because the payment is no longer unknown. Other failures are settle_failed
// mismatches built on m; an unavailable Temporal or database aborts the import.
func (run *run) settle(p payment.Payment, st workflows.Settlement, done func(status string), refused func(payment.Payment), m *Mismatch) {
	if run.dry {
		// What the workflow answers when it accepts the settlement.
		if st.Outcome == workflows.OutcomeCharged {
			done(string(payment.StatusSucceeded))
		} else {
			done(string(payment.StatusFailed))
		}
		return
	}
	select {
	case run.sem <- struct{}{}:
	case <-run.ctx.Done():
		return
	}
	run.wg.Go(func() {
		defer func() { <-run.sem }()
		timeout := run.r.SettleTimeout
		if timeout <= 0 {
			timeout = DefaultSettleTimeout
		}
		ctx, cancel := context.WithTimeout(run.ctx, timeout)
		status, err := run.r.Settler.Settle(ctx, workflowID(p), st)
		timedOut := ctx.Err() != nil
		cancel()
		switch {
		case err == nil:
			run.log().Info("reconcile: settled", "payment_id", p.ID, "outcome", st.Outcome, "status", status)
			done(status)
		case run.ctx.Err() != nil:
			// the import is being aborted
		case errors.Is(err, workflows.ErrSettlementRejected):
			now, rerr := run.reread(p.ID)
			switch {
			case rerr != nil:
				run.cancel(fmt.Errorf("re-read payment %s: %w", p.ID, rerr))
			case now.Status != payment.StatusUnknown:
				refused(now)
			default:
				mm := *m
				mm.Kind, mm.Expected, mm.Found = KindSettleFailed, "unknown, settled as "+st.Outcome, err.Error()
				run.mismatch(mm)
			}
		case workflows.IsUnavailable(err) && !timedOut:
			run.cancel(fmt.Errorf("settle payment %s: %w", p.ID, err))
		default:
			run.log().Warn("reconcile: settle failed", "payment_id", p.ID, "outcome", st.Outcome, "error", err)
			mm := *m
			mm.Kind, mm.Expected, mm.Found = KindSettleFailed, "unknown, settled as "+st.Outcome, err.Error()
			run.mismatch(mm)
		}
	})
}

// reread reads a payment whose settlement was refused, giving a settlement that another
// import has in flight a moment to land.
func (run *run) reread(id uuid.UUID) (payment.Payment, error) {
	var p payment.Payment
	for attempt := range 5 {
		var err error
		if p, err = run.r.Store.Payment(run.ctx, id); err != nil || p.Status != payment.StatusUnknown {
			return p, err
		}
		select {
		case <-time.After(time.Duration(attempt+1) * rereadDelay):
		case <-run.ctx.Done():
			return p, context.Cause(run.ctx)
		}
	}
	return p, nil
}

func (run *run) log() *slog.Logger { return run.r.logger() }

func (r *Reconciler) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func workflowID(p payment.Payment) string {
	return workflows.PaymentWorkflowID(p.MerchantID, p.IdempotencyKey)
}

func describePayment(p payment.Payment) string {
	s := string(p.Status)
	if p.FailureCode != "" {
		s += " (" + p.FailureCode + ")"
	}
	s += " " + payment.FormatAmount(p.AmountMinor, p.Currency) + " " + p.Currency
	if p.ProviderReference != "" {
		s += ", charge " + p.ProviderReference
	}
	return s
}

func describeLine(l Line) string {
	return fmt.Sprintf("%s %s %s on %s, charge %s", l.Status, l.Amount(), l.Currency, l.SettlementDate, l.ProviderChargeID)
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func joinDays(days []Day) string {
	s := make([]string, len(days))
	for i, d := range days {
		s[i] = string(d)
	}
	return strings.Join(s, ", ")
}
