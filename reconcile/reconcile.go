package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
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
	// statuses, of one of the merchants (all merchants when merchants is empty), with the time
	// its outcome was decided: when it left processing (became unknown, or succeeded), which
	// nothing later moves (a refund moves its updated_at; settling an unknown one, its updated_at
	// and its posting's time).
	EachPaymentCreated(ctx context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID, fn func(p payment.Payment, decided time.Time) error) error
	// RefundsByID, Refund and EachRefundCreated are the same for refunds (a settlement of an
	// unknown refund moves its updated_at, not the time its outcome was decided).
	RefundsByID(ctx context.Context, ids []uuid.UUID) ([]payment.Refund, error)
	Refund(ctx context.Context, id uuid.UUID) (payment.Refund, error)
	EachRefundCreated(ctx context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID, fn func(r payment.Refund, decided time.Time) error) error
	// CaptureInFlight says whether a manual payment's capture was sent and has not finished.
	CaptureInFlight(ctx context.Context, paymentID uuid.UUID) (bool, error)
	// EachCaptureDecided calls fn for every manual payment created before from, with one of the
	// statuses, whose capture succeeded or whose capture or void became unknown in [from, to),
	// with when that happened and when the capture or void may first have been sent (its window
	// starts there, not at the authorization).
	EachCaptureDecided(ctx context.Context, from, to time.Time, statuses []payment.Status, merchants []uuid.UUID, fn func(p payment.Payment, decided, sentFrom time.Time) error) error
	// Now is the database's clock, which stamped every time these methods return: an import
	// judges what a file's as_of proves by it, never by its own host's clock.
	Now(ctx context.Context) (time.Time, error)
	// SettlementListings records that a file lists each of refs on the day beside it (unless
	// record is false), then returns every day an import listed each of them on; kind is
	// "charge" or "refund".
	SettlementListings(ctx context.Context, kind string, refs []uuid.UUID, days []time.Time, record bool) (map[uuid.UUID][]time.Time, error)
	// RecordSettlementCompletions records that an import proved days complete for kind's
	// operations of merchants (uuid.Nil: every merchant), each up to the asOf beside it.
	RecordSettlementCompletions(ctx context.Context, kind string, merchants []uuid.UUID, days, asOf []time.Time) error
	// SettlementCompletions returns how far imports proved each of days complete for kind's
	// operations: the latest as_of by merchant, of merchants or uuid.Nil (every merchant).
	SettlementCompletions(ctx context.Context, kind string, days []time.Time, merchants []uuid.UUID) (map[time.Time]map[uuid.UUID]time.Time, error)
}

// Settler resolves an unknown payment or refund through its workflow's checked `settle` update
// (workflows.Starter). One that is not unknown answers workflows.ErrSettlementRejected.
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

// Reconciler matches settlement files to payments and refunds. It is safe for concurrent use; importing
// the same file twice changes nothing the second time.
type Reconciler struct {
	Store   Store
	Settler Settler
	// Concurrency bounds the settle updates in flight (default DefaultConcurrency).
	Concurrency int
	// SettleTimeout bounds one settle update; one whose workflow does not take it in time
	// (no worker polls its task queue...) is reported as settle_failed, one taken but not yet
	// applied as pending (ReasonSettling). Default DefaultSettleTimeout.
	SettleTimeout time.Duration
	// BookingWindow is how long the bank may take to book a charge or a refund after kasa
	// stopped waiting for it (KASA_PROVIDER_BOOKING_WINDOW); an unlisted payment or refund is
	// decided only once the file covers that long after its outcome was (became unknown, or
	// succeeded). Default DefaultBookingWindow.
	BookingWindow time.Duration
	// Workers, when set, tells the booking windows the workers ran with: the longest of those
	// (reported within WorkerWindowMemory) governs when it exceeds BookingWindow, since the
	// workers' setting is the deployment's (docs/deployment.md, "Money settings").
	Workers WorkerWindows
	Logger  *slog.Logger
	// Runs, when set, keeps every finished reconciliation (the audit trail and the outcome
	// metrics); Source says who ran it ("cli" or "api").
	Runs   RunRecorder
	Source string
	// Now, when set, stands in for the database's clock as the import's now (tests that import
	// after a midnight to come): a file proves nothing booked after it.
	Now func() time.Time
}

// WorkerWindows reads the longest booking window workers reported within since (store.Store).
type WorkerWindows interface {
	LongestBookingWindow(ctx context.Context, since time.Duration) (time.Duration, error)
}

// WorkerWindowMemory is how far back a worker's booking window still governs imports.
const WorkerWindowMemory = 7 * 24 * time.Hour

// RunRecorder keeps finished reconciliations (store.Store).
type RunRecorder interface {
	RecordReconciliation(ctx context.Context, r store.ReconciliationRun) error
}

// Options narrow one import.
type Options struct {
	// Days declares the UTC days the file covers. Empty: the days of its settlement_date values.
	// Declaring them lets a file with no lines (nothing settled that day) resolve that day's
	// unknown payments (and refunds) as not charged; every line's date must then be one of them.
	Days []Day
	// Merchants and AllMerchants declare the import's scope: the merchants whose payments and
	// refunds the file speaks for (providers may send one file per merchant). Only they are
	// checked for coverage (releasing unlisted unknown payments and refunds, reporting
	// succeeded-but-missing); with the file's own scope row as well, only the merchants both
	// declare. Declaring neither, with no scope row in the file, releases nothing unlisted.
	// Listed lines are matched whatever their merchant. The two are exclusive.
	Merchants    []uuid.UUID
	AllMerchants bool
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

// Reconcile matches parsed lines to payments and refunds (see the package documentation and
// docs/reconciliation.md). Charge lines are matched to payments, refund lines to refunds, each the
// same way:
//
//   - listed and unknown: settled as charged (for a refund: it was paid back), with
//     provider_reference = provider_charge_id;
//   - listed and succeeded with the same amount and currency: matched;
//   - listed with another amount or currency, listed but failed, or listed without a payment
//     (refund) of that id: a mismatch, and the payment (refund) is left as it is;
//   - listed and processing: pending;
//   - listed on more than one line: a charged_twice mismatch, and left as it is;
//   - not listed, unknown or succeeded, created on a covered day, within the scope: its window
//     runs from its creation to the booking window after its outcome was decided (it became
//     unknown, or succeeded). Only once the file covers that whole window is it decided:
//     unknown and every day of the window complete by a trailer: settled as not charged;
//     succeeded: a mismatch. Otherwise it is pending, with the reason. A day an earlier import
//     proved complete (a trailer, in a scope covering it) and did not list it on counts as a
//     complete day of the file, so the day before a covered day is looked at too, for the
//     windows that run over midnight into it;
//   - not listed, unknown, created on a covered day, outside an undeclared scope (no merchants
//     declared; refunds in a file with the type column that does not declare them): pending
//     (scope_not_declared), never released.
//
// The scope is declared by the import (Options) and by the file's scope row; refunds are
// covered only when the file's scope row says so. A file without the type column lists
// charges only: it never releases a refund, reports one missing or mentions one.
//
// A settlement the workflow refuses because the operation is no longer unknown (a concurrent or
// earlier import, an operator) is not an error: it is re-read and matched as it is now.
// The error is non-nil only when the import could not run (database or Temporal unavailable);
// what it settled before that stays settled, and a re-run continues safely.
func (r *Reconciler) Reconcile(ctx context.Context, f *File, o Options) (*Report, error) {
	days, err := coveredDays(f, o.Days)
	if err != nil {
		return nil, err
	}
	sc, err := scopeOf(f, o)
	if err != nil {
		return nil, err
	}
	// The database's clock stamped when each outcome was decided; this host's may be minutes
	// ahead of it, and would let a file prove a window that has not passed.
	var now time.Time
	if r.Now != nil {
		now = r.Now()
	} else if now, err = r.Store.Now(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	run := &run{r: r, ctx: ctx, cancel: cancel, dry: o.DryRun, now: now, window: r.BookingWindow,
		covered: map[Day]bool{}, complete: map[Day]time.Time{},
		listed: map[kind]map[uuid.UUID]bool{charge: {}, refund: {}}}
	if run.window <= 0 {
		run.window = DefaultBookingWindow
	}
	if r.Workers != nil {
		w, err := r.Workers.LongestBookingWindow(ctx, WorkerWindowMemory)
		if err != nil {
			return nil, err
		}
		run.window = max(run.window, w)
	}
	run.report.DryRun = o.DryRun
	run.report.Days = days
	run.report.Scope = sc.name()
	run.report.ChargesCovered = sc.charges
	run.report.RefundsCovered = sc.refunds
	for _, l := range f.Lines {
		if l.Type == TypeRefund {
			run.report.RefundLines++
		} else {
			run.report.Lines++
		}
	}
	for _, d := range days {
		run.covered[d] = true
	}
	for _, t := range f.Trailers {
		// The file cannot know what was booked after it was read.
		run.complete[t.Day] = earliest(t.AsOf, run.now)
		run.report.Complete = append(run.report.Complete, Completeness{Day: t.Day, AsOf: t.AsOf})
	}
	for _, m := range sc.merchants {
		run.report.Merchants = append(run.report.Merchants, m.String())
	}
	n := r.Concurrency
	if n <= 0 {
		n = DefaultConcurrency
	}
	run.sem = make(chan struct{}, n)

	// 1. Every line, in batches of one type: one query per batch. A reference listed more than
	// once is matched once, with all its lines.
	lines := map[kind][]Line{}
	same := map[kind]map[uuid.UUID][]Line{charge: {}, refund: {}}
	for _, l := range f.Lines {
		k := charge
		if l.Type == TypeRefund {
			k = refund
		}
		if len(same[k][l.Reference]) == 0 {
			lines[k] = append(lines[k], l)
		}
		same[k][l.Reference] = append(same[k][l.Reference], l)
	}
	done := 0
	for _, k := range []kind{charge, refund} {
		for start := 0; start < len(lines[k]); start += batchSize {
			batch := lines[k][start:min(start+batchSize, len(lines[k]))]
			ids := make([]uuid.UUID, len(batch))
			for i, l := range batch {
				ids[i] = l.Reference
				run.listed[k][l.Reference] = true
			}
			byID, err := run.lookup(k, ids)
			if err != nil {
				return nil, run.abort(fmt.Errorf("read %ss: %w", k.noun(), err))
			}
			earlier, err := run.listings(k, byID, same[k])
			if err != nil {
				return nil, run.abort(fmt.Errorf("read the days %ss were listed on: %w", k.noun(), err))
			}
			for _, l := range batch {
				all := same[k][l.Reference]
				done += len(all)
				o, ok := byID[l.Reference]
				switch {
				case !ok:
					for _, l := range all {
						run.mismatch(k, Mismatch{Kind: KindUnknownReference, Line: l.Number, Reference: l.Reference.String(),
							ProviderChargeID: l.ProviderChargeID, Expected: "no " + k.noun() + " with this id", Found: describeLine(l)})
					}
				case len(all) > 1:
					run.listedTwice(o, all)
				case len(earlier[l.Reference]) > 0:
					run.listedOnAnotherDay(o, l, earlier[l.Reference])
				default:
					run.matchLine(l, o, true)
				}
			}
			if ctx.Err() != nil {
				return nil, run.abort(context.Cause(ctx))
			}
			if o.Progress != nil {
				o.Progress(done, len(f.Lines))
			}
		}
	}
	run.wg.Wait()
	if err := run.recordCompletions(sc, f); err != nil {
		return nil, run.abort(fmt.Errorf("record the days the file proves complete: %w", err))
	}

	// 2. Coverage: what the covered days should have listed and did not, within the scope; and
	// the unknown ones an undeclared scope leaves out, which stay pending. The day before a
	// covered day is looked at too, for the windows that run over midnight into it: an earlier
	// import may have proved that day complete.
	var unlisted, outside []op
	for _, k := range []kind{charge, refund} {
		check, merchants, ok := sc.coverage(k, f.Typed)
		if !ok {
			continue
		}
		statuses := []payment.Status{payment.StatusUnknown}
		if check {
			statuses = append(statuses, payment.StatusSucceeded)
		}
		seen := map[uuid.UUID]bool{} // a manual payment may come by its creation and by its capture
		keep := func(o op) {
			if seen[o.id] {
				return
			}
			seen[o.id] = true
			switch {
			case run.listed[k][o.id]:
			case check:
				unlisted = append(unlisted, o)
			default:
				outside = append(outside, o)
			}
		}
		scan := days
		for _, d := range days {
			if prev := d.Prev(); check && !run.covered[prev] {
				scan = append(slices.Clip(scan), prev)
			}
		}
		for _, d := range scan {
			// Of a day the file does not cover, only the windows that reach the next day, which it does.
			reaches := func(o op) bool { return run.covered[d] || !o.decided.Add(run.window).Before(d.End()) }
			var err error
			if k == refund {
				err = r.Store.EachRefundCreated(ctx, d.Start(), d.End(), statuses, merchants, func(rf payment.Refund, decided time.Time) error {
					o := refundOp(rf)
					o.decided = decided
					if reaches(o) {
						keep(o)
					}
					return nil
				})
			} else {
				err = r.Store.EachPaymentCreated(ctx, d.Start(), d.End(), statuses, merchants, func(p payment.Payment, decided time.Time) error {
					o := paymentOp(p)
					o.decided = decided
					if o.manual && !decided.Before(d.End()) && (o.status == payment.StatusSucceeded || o.providerRef != "") {
						return nil // its capture or void decided on a later day: that day's import looks at it (below)
					}
					if reaches(o) {
						keep(o)
					}
					return nil
				})
				// A manual payment's capture or void may come days after its authorization: its
				// window runs from when it was sent.
				if err == nil {
					err = r.Store.EachCaptureDecided(ctx, d.Start(), d.End(), statuses, merchants, func(p payment.Payment, decided, sentFrom time.Time) error {
						o := paymentOp(p)
						o.created, o.decided = sentFrom, decided
						if reaches(o) {
							keep(o)
						}
						return nil
					})
				}
			}
			if err != nil {
				return nil, run.abort(fmt.Errorf("read %ss created on %s: %w", k.noun(), d, err))
			}
		}
	}
	// Which days of the unlisted ones' windows earlier imports proved complete: read after this
	// import recorded its own days, and before the listings (below), which an import records
	// before its days.
	if err := run.readCompletions(unlisted); err != nil {
		return nil, run.abort(fmt.Errorf("read the days earlier imports proved complete: %w", err))
	}
	earlier, err := run.listedEarlier(unlisted)
	if err != nil {
		return nil, run.abort(fmt.Errorf("read the days unlisted payments and refunds were listed on: %w", err))
	}
	for _, o := range unlisted {
		days := earlier[o.kind][o.id]
		here := slices.ContainsFunc(days, func(d Day) bool { return run.covered[d] })
		switch {
		case len(days) == 0, o.status != payment.StatusUnknown && here:
			run.checkUnlisted(o)
		case o.status != payment.StatusUnknown:
			// succeeded, and listed on another day only: the import of that day matched it
		case here:
			run.pending(o.kind, pendingOf(o, ReasonListedEarlier, 0, "an earlier import found it listed on "+joinDays(days)+
				", while it was in flight, and this file does not list it: the bank's files disagree, so settle it by hand once the bank says which is right"))
		default: // the bank booked it on a day this file does not cover: that day's file settles it
			run.pending(o.kind, pendingOf(o, ReasonWindowNotCovered, 0, "an earlier import found it listed on "+joinDays(days)+
				", while it was in flight: import a file covering that day"))
		}
	}
	for _, o := range outside {
		run.pending(o.kind, pendingOf(o, ReasonScopeNotDeclared, 0, sc.undeclared(o.kind)))
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
// failure is logged, not returned. The run's counts are of payments and refunds together (the
// outcome metrics and the last run's mismatches count both); its report tells them apart.
func (r *Reconciler) record(ctx context.Context, rep *Report) {
	if r.Runs == nil {
		return
	}
	// An import stopped just after its last settlement still made them: the run is kept.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	body, err := json.Marshal(rep)
	if err == nil {
		days := make([]time.Time, len(rep.Days))
		for i, d := range rep.Days {
			days[i] = d.Start()
		}
		c := rep.Counts
		err = r.Runs.RecordReconciliation(ctx, store.ReconciliationRun{
			ID: payment.NewID(), Source: r.Source, Days: days, Lines: rep.Lines + rep.RefundLines,
			Matched: c.Matched + c.RefundMatched, ResolvedCharged: c.ResolvedCharged + c.RefundResolvedCharged,
			ResolvedNotCharged: c.ResolvedNotCharged + c.RefundResolvedNotCharged,
			Pending:            c.Pending + c.RefundPending, Mismatches: c.Mismatches + c.RefundMismatches, Report: body,
		})
	}
	if err != nil {
		r.logger().Warn("reconciliation finished but was not recorded", "error", err)
	}
}

// coveredDays is the declared days, or the days of the lines and trailers; with declared days
// every line and trailer must fall on one of them.
func coveredDays(f *File, declared []Day) ([]Day, error) {
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
		for _, l := range f.Lines {
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

// kind says whether a line or an operation is a charge (a payment) or a refund: their report
// entries and counts are kept apart.
type kind int

const (
	charge kind = iota
	refund
)

// listing is the kind's name in the settlement listings.
func (k kind) listing() string {
	if k == refund {
		return "refund"
	}
	return "charge"
}

func (k kind) noun() string {
	if k == refund {
		return "refund"
	}
	return "payment"
}

// op is a payment or a refund as reconciliation sees it: both are matched and settled alike.
type op struct {
	kind                     kind
	id, paymentID, merchant  uuid.UUID
	key                      string
	amount                   int64
	currency                 string
	status                   payment.Status
	failureCode, providerRef string
	// decided is when its outcome was decided: it left processing (became unknown, or
	// succeeded). The bank books a charge, if at all, by the booking window after the last
	// send, and kasa sends nothing after that moment.
	created, decided time.Time
	// manual: a manual payment, whose line is its capture (of at most amount, its authorization,
	// until it succeeded with what it captured) with the capture's own id at the bank.
	manual bool
	stuck  string // why its workflow waits for an operator: a bank conflict refuses not_charged
}

func paymentOp(p payment.Payment) op {
	amount := p.AmountMinor
	if p.CaptureManual && p.Status == payment.StatusSucceeded {
		amount = p.CapturedMinor
	}
	return op{kind: charge, id: p.ID, paymentID: p.ID, merchant: p.MerchantID, key: p.IdempotencyKey, amount: amount,
		currency: p.Currency, status: p.Status, failureCode: p.FailureCode, providerRef: p.ProviderReference,
		created: p.CreatedAt, decided: p.UpdatedAt, manual: p.CaptureManual, stuck: p.StuckReason}
}

func refundOp(r payment.Refund) op {
	return op{kind: refund, id: r.ID, paymentID: r.PaymentID, merchant: r.MerchantID, key: r.IdempotencyKey, amount: r.AmountMinor,
		currency: r.Currency, status: r.Status, failureCode: r.FailureCode, providerRef: r.ProviderReference,
		created: r.CreatedAt, decided: r.UpdatedAt, stuck: r.StuckReason}
}

func (o op) workflowID() string {
	if o.kind == refund {
		return workflows.RefundWorkflowID(o.merchant, o.key)
	}
	return workflows.PaymentWorkflowID(o.merchant, o.key)
}

// refundID is the refund's id in report entries ("" for a payment).
func (o op) refundID() string {
	if o.kind == refund {
		return o.id.String()
	}
	return ""
}

// describe is what kasa recorded, for a mismatch's "expected".
func (o op) describe() string {
	s := string(o.status)
	if o.failureCode != "" {
		s += " (" + o.failureCode + ")"
	}
	s += " " + payment.FormatAmount(o.amount, o.currency) + " " + o.currency
	if o.providerRef != "" {
		s += ", " + bankNoun(o.kind) + " " + o.providerRef
	}
	return s
}

// bankNoun names the bank's id of a charge or a refund.
func bankNoun(k kind) string {
	if k == refund {
		return "refund"
	}
	return "charge"
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
	listed   map[kind]map[uuid.UUID]bool
	sem      chan struct{}
	wg       sync.WaitGroup
	// earlier is how far imports proved the days of the unlisted operations' windows complete,
	// by kind, day and merchant (uuid.Nil: every merchant).
	earlier map[kind]map[Day]map[uuid.UUID]time.Time

	mu     sync.Mutex
	report Report
}

func (run *run) abort(err error) error {
	run.cancel(err)
	run.wg.Wait()
	return err
}

// lookup reads the payments or refunds among ids that exist.
func (run *run) lookup(k kind, ids []uuid.UUID) (map[uuid.UUID]op, error) {
	out := make(map[uuid.UUID]op, len(ids))
	if k == refund {
		found, err := run.r.Store.RefundsByID(run.ctx, ids)
		for _, rf := range found {
			out[rf.ID] = refundOp(rf)
		}
		return out, err
	}
	found, err := run.r.Store.PaymentsByID(run.ctx, ids)
	for _, p := range found {
		out[p.ID] = paymentOp(p)
	}
	return out, err
}

func (run *run) mismatch(k kind, m Mismatch) {
	run.mu.Lock()
	defer run.mu.Unlock()
	if k == refund {
		run.report.RefundMismatches = append(run.report.RefundMismatches, m)
		return
	}
	run.report.Mismatches = append(run.report.Mismatches, m)
}

func (run *run) pending(k kind, p Pending) {
	run.mu.Lock()
	defer run.mu.Unlock()
	if k == refund {
		run.report.RefundPending = append(run.report.RefundPending, p)
		return
	}
	run.report.Pending = append(run.report.Pending, p)
}

func (run *run) matched(k kind) {
	run.mu.Lock()
	defer run.mu.Unlock()
	if k == refund {
		run.report.Counts.RefundMatched++
		return
	}
	run.report.Counts.Matched++
}

// resolved records an operation settled (or, in a dry run, that would be).
func (run *run) resolved(o op, st workflows.Settlement, line int, chargeID string) {
	run.mu.Lock()
	defer run.mu.Unlock()
	c := &run.report.Counts
	res := Resolution{Outcome: st.Outcome, Line: line, Reference: o.id.String(), PaymentID: o.paymentID.String(), RefundID: o.refundID(),
		MerchantID: o.merchant.String(), WorkflowID: o.workflowID(), ProviderChargeID: chargeID}
	switch {
	case o.kind == refund && st.Outcome == workflows.OutcomeCharged:
		c.RefundResolvedCharged++
	case o.kind == refund:
		c.RefundResolvedNotCharged++
	case st.Outcome == workflows.OutcomeCharged:
		c.ResolvedCharged++
	default:
		c.ResolvedNotCharged++
	}
	if o.kind == refund {
		run.report.RefundResolved = append(run.report.RefundResolved, res)
		return
	}
	run.report.Resolved = append(run.report.Resolved, res)
}

// entry is the start of a mismatch about o.
func entry(o op, line int, chargeID string) Mismatch {
	return Mismatch{Line: line, Reference: o.id.String(), PaymentID: o.paymentID.String(), RefundID: o.refundID(),
		MerchantID: o.merchant.String(), WorkflowID: o.workflowID(), ProviderChargeID: chargeID}
}

func pendingOf(o op, reason string, line int, detail string) Pending {
	return Pending{Reason: reason, Line: line, Reference: o.id.String(), PaymentID: o.paymentID.String(), RefundID: o.refundID(),
		MerchantID: o.merchant.String(), WorkflowID: o.workflowID(), Status: string(o.status), Detail: detail}
}

// matchLine classifies a listed payment or refund; settle is false once a settlement was refused
// (it is then matched as it is, never settled again by this import).
func (run *run) matchLine(l Line, o op, settle bool) {
	m := entry(o, l.Number, l.ProviderChargeID)
	if o.status == payment.StatusRequiresCapture && o.kind == charge {
		// Its capture may be booked at the bank while kasa still awaits the answer.
		inFlight, err := run.r.Store.CaptureInFlight(run.ctx, o.id)
		if err != nil {
			run.cancel(fmt.Errorf("read the captures of payment %s: %w", o.id, err))
			return
		}
		if inFlight {
			run.pending(o.kind, pendingOf(o, ReasonProcessing, l.Number,
				"a capture was asked for and has not finished (in flight, or it never reached the workflow): import the file again once it has"))
			return
		}
	}
	switch {
	case o.status == payment.StatusFailed, o.status == payment.StatusCanceled, o.status == payment.StatusRequiresCapture:
		m.Kind, m.Expected, m.Found = KindChargedButFailed, o.describe(), describeLine(l)
		if o.kind == refund {
			m.Kind = KindRefundedButFailed
		}
		run.mismatch(o.kind, m)
	case o.currency != l.Currency:
		m.Kind, m.Expected, m.Found = KindCurrencyDiffers, o.describe(), describeLine(l)
		run.mismatch(o.kind, m)
	case o.amount != l.AmountMinor && !(o.manual && o.status != payment.StatusSucceeded && l.AmountMinor <= o.amount):
		m.Kind, m.Expected, m.Found = KindAmountDiffers, o.describe(), describeLine(l)
		run.mismatch(o.kind, m)
	case o.status == payment.StatusProcessing:
		run.pending(o.kind, pendingOf(o, ReasonProcessing, l.Number, "still processing: import the file again once it has finished"))
	case o.status == payment.StatusSucceeded:
		if o.providerRef != "" && o.providerRef != l.ProviderChargeID && !o.manual {
			noun := bankNoun(o.kind)
			m.Kind, m.Expected, m.Found = KindProviderReferenceDiffers, noun+" "+o.providerRef, noun+" "+l.ProviderChargeID
			run.mismatch(o.kind, m)
			return
		}
		run.matched(o.kind)
	case o.status == payment.StatusUnknown && settle:
		st := workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: l.ProviderChargeID, AmountMinor: l.AmountMinor,
			Note: fmt.Sprintf("reconciliation: settlement file line %d, settled %s", l.Number, l.SettlementDate)}
		run.settle(o, st, func(status string) {
			if status == string(payment.StatusSucceeded) {
				run.resolved(o, st, l.Number, l.ProviderChargeID)
				return
			}
			m.Kind, m.Expected, m.Found = KindSettleFailed, "unknown, settled as charged", "the workflow answered "+status
			run.mismatch(o.kind, m)
		}, func(now op) { run.matchLine(l, now, false) }, &m)
	default: // unknown, but its settlement was just refused
		m.Kind, m.Expected, m.Found = KindSettleFailed, o.describe(), describeLine(l)+": the workflow refused the settlement while the "+o.kind.noun()+" is unknown; try again"
		run.mismatch(o.kind, m)
	}
}

// checkUnlisted handles an unknown or succeeded payment or refund created on a covered day that
// the file does not list. The bank booked it, if at all, between its creation and the booking
// window after its outcome was decided (when it became unknown, or succeeded; kasa sends nothing
// later). Not its updated_at: a refund moves that and would stretch the window to days the
// charge was never booked on. The file decides it only if it covers that whole window, and
// releases it only if every day of the window is complete by a trailer.
func (run *run) checkUnlisted(o op) {
	bookBy := o.decided.Add(run.window)
	var missing, open, unproven, before []Day
	for d := DayOf(o.created); d <= DayOf(bookBy); d = d.Next() {
		// A day an earlier import proved complete (for a scope covering o) up to the window's end
		// on it counts as a complete day of this file: no import listed o there (Reconcile).
		asOf, ok := run.complete[d]
		if e := run.provedEarlier(o, d); !e.Before(earliest(d.End(), bookBy)) && (!ok || e.After(asOf)) {
			asOf, ok = e, true
			before = append(before, d)
		} else if !run.covered[d] {
			missing = append(missing, d)
			continue
		}
		if !ok {
			asOf = run.now
			unproven = append(unproven, d)
		}
		if asOf.Before(earliest(d.End(), bookBy)) {
			open = append(open, d)
		}
	}
	m := entry(o, 0, "")
	window := fmt.Sprintf("created %s, outcome decided %s, the bank may book it until %s",
		payment.FormatTime(o.created), payment.FormatTime(o.decided), payment.FormatTime(bookBy))
	switch {
	case len(missing) > 0:
		// It may have been booked on a day this file does not cover: deciding "not charged" (or
		// "missing") from it could release money the bank did move.
		run.pending(o.kind, pendingOf(o, ReasonWindowNotCovered, 0, window+": the file does not cover "+joinDays(missing)+
			", and no earlier import proved it complete for this "+o.kind.noun()+" far enough"))
		return
	case len(open) > 0:
		// The bank may still book it, or booked it after the file was made.
		detail := window + ": import a file made after that"
		if run.now.Before(bookBy) {
			detail = window + ": import again after that"
		}
		run.pending(o.kind, pendingOf(o, ReasonBookingWindow, 0, detail))
		return
	case o.status == payment.StatusUnknown && len(unproven) > 0:
		// Without a trailer the file may have been cut short: its silence proves nothing.
		run.pending(o.kind, pendingOf(o, ReasonFileNotComplete, 0, "the file has no trailer for "+joinDays(unproven)+
			": it may be cut short, so it cannot prove the "+o.kind.noun()+" did not happen"))
		return
	case o.manual && o.status == payment.StatusUnknown && o.providerRef == "":
		// Its authorization got no answer: files list captures, never authorizations, so no
		// file's silence proves the bank holds none, which kasa could then never void.
		run.pending(o.kind, pendingOf(o, ReasonAuthorizationUnknown, 0,
			"its authorization got no answer, and settlement files do not list authorizations: settle it by hand once the bank says whether it holds one"))
		return
	}
	switch o.status {
	case payment.StatusSucceeded:
		m.Kind, m.Expected, m.Found = KindSucceededButMissing, o.describe(), "not listed on "+joinDays(run.report.Days)
		run.mismatch(o.kind, m)
	case payment.StatusUnknown:
		st := workflows.Settlement{Outcome: workflows.OutcomeNotCharged,
			Note: "reconciliation: not in the settlement file for " + joinDays(run.report.Days)}
		if len(before) > 0 {
			st.Note += ", nor on " + joinDays(before) + ", which an earlier import proved complete"
		}
		run.settle(o, st, func(status string) {
			// A manual payment whose capture or void was not charged is let go: canceled.
			if status == string(payment.StatusFailed) || (o.manual && status == string(payment.StatusCanceled)) {
				run.resolved(o, st, 0, "")
				return
			}
			if o.manual && status == string(payment.StatusUnknown) { // its void's answer was lost too
				run.pending(o.kind, pendingOf(o, ReasonVoidUnknown, 0,
					"not captured: its authorization's void got no answer either; a later import settles it, the hold kept until then"))
				return
			}
			m.Kind, m.Expected, m.Found = KindSettleFailed, "unknown, settled as not charged", "the workflow answered "+status
			run.mismatch(o.kind, m)
		}, func(now op) {
			switch now.status {
			case payment.StatusSucceeded: // settled as charged meanwhile, yet not in the file
				m.Kind, m.Expected, m.Found = KindSucceededButMissing, now.describe(), "not listed on "+joinDays(run.report.Days)
				run.mismatch(o.kind, m)
			case payment.StatusFailed, payment.StatusCanceled: // released meanwhile: nothing left to do
			default:
				m.Kind, m.Expected, m.Found = KindSettleFailed, now.describe(), "not listed: the workflow refused the settlement while the "+o.kind.noun()+" is unknown; try again"
				run.mismatch(o.kind, m)
			}
		}, &m)
	}
}

// recordCompletions records the days this file's trailers prove complete, for the scope it covers
// (not in a dry run), so that a later import may count them. It runs once the file's listings are
// recorded: an import that sees these days complete sees what this one listed on them.
func (run *run) recordCompletions(sc scope, f *File) error {
	if run.dry || len(f.Trailers) == 0 {
		return nil
	}
	days, asOf := make([]time.Time, len(f.Trailers)), make([]time.Time, len(f.Trailers))
	for i, t := range f.Trailers {
		days[i], asOf[i] = t.Day.Start(), run.complete[t.Day]
	}
	for _, k := range []kind{charge, refund} {
		check, merchants, ok := sc.coverage(k, f.Typed)
		if !ok || !check {
			continue
		}
		if merchants == nil {
			merchants = []uuid.UUID{uuid.Nil}
		}
		if err := run.r.Store.RecordSettlementCompletions(run.ctx, k.listing(), merchants, days, asOf); err != nil {
			return err
		}
	}
	return nil
}

// readCompletions reads how far imports proved the days of ops' windows complete.
func (run *run) readCompletions(ops []op) error {
	run.earlier = map[kind]map[Day]map[uuid.UUID]time.Time{}
	for _, k := range []kind{charge, refund} {
		days, merchants := map[Day]bool{}, map[uuid.UUID]bool{}
		for _, o := range ops {
			if o.kind != k {
				continue
			}
			merchants[o.merchant] = true
			for d := DayOf(o.created); d <= DayOf(o.decided.Add(run.window)); d = d.Next() {
				days[d] = true
			}
		}
		if len(days) == 0 {
			continue
		}
		var ds []time.Time
		for d := range days {
			ds = append(ds, d.Start())
		}
		got, err := run.r.Store.SettlementCompletions(run.ctx, k.listing(), ds, slices.Collect(maps.Keys(merchants)))
		if err != nil {
			return err
		}
		run.earlier[k] = map[Day]map[uuid.UUID]time.Time{}
		for d, byMerchant := range got {
			run.earlier[k][DayOf(d)] = byMerchant
		}
	}
	return nil
}

// provedEarlier is how far imports proved day d complete for o (by a scope of its merchant or of
// every merchant); zero if none did.
func (run *run) provedEarlier(o op, d Day) time.Time {
	byMerchant := run.earlier[o.kind][d]
	at := byMerchant[o.merchant]
	if all := byMerchant[uuid.Nil]; all.After(at) {
		at = all
	}
	return at
}

// listedTwice reports a payment or refund the file lists on more than one line: the bank says it
// moved the money more than once. Nothing is settled for it (not even an unknown one as
// charged): which charge is kasa's, and what to give back, is for a person to decide.
func (run *run) listedTwice(o op, lines []Line) {
	m := entry(o, lines[0].Number, lines[0].ProviderChargeID)
	nums := make([]string, len(lines))
	found := make([]string, len(lines))
	for i, l := range lines {
		nums[i] = fmt.Sprint(l.Number)
		found[i] = describeLine(l)
	}
	listed := strings.Join(nums[:len(nums)-1], ", ") + " and " + nums[len(nums)-1]
	m.Kind, m.Expected = KindChargedTwice, o.describe()+", once"
	m.Found = "listed on lines " + listed + ": " + strings.Join(found, "; ")
	run.mismatch(o.kind, m)
}

// listings records the days this file lists the found operations on (not in a dry run), and
// returns, for each, the days an import listed it on that this file does not.
func (run *run) listings(k kind, found map[uuid.UUID]op, lines map[uuid.UUID][]Line) (map[uuid.UUID][]Day, error) {
	var refs []uuid.UUID
	var days []time.Time
	for id := range found {
		for _, l := range lines[id] {
			refs, days = append(refs, id), append(days, l.SettlementDate.Start())
		}
	}
	if len(refs) == 0 {
		return nil, nil
	}
	listed, err := run.r.Store.SettlementListings(run.ctx, k.listing(), refs, days, !run.dry)
	out := map[uuid.UUID][]Day{}
	for id, ds := range listed {
		for _, d := range ds {
			if day := DayOf(d); !slices.ContainsFunc(lines[id], func(l Line) bool { return l.SettlementDate == day }) {
				out[id] = append(out[id], day)
			}
		}
	}
	return out, err
}

// listedEarlier is, for ops (which this file does not list), the days an earlier import listed
// them on.
func (run *run) listedEarlier(ops []op) (map[kind]map[uuid.UUID][]Day, error) {
	ids := map[kind][]uuid.UUID{}
	for _, o := range ops {
		ids[o.kind] = append(ids[o.kind], o.id)
	}
	out := map[kind]map[uuid.UUID][]Day{}
	for k, all := range ids {
		out[k] = map[uuid.UUID][]Day{}
		for batch := range slices.Chunk(all, batchSize) {
			listed, err := run.r.Store.SettlementListings(run.ctx, k.listing(), batch, nil, false)
			if err != nil {
				return nil, err
			}
			for id, days := range listed {
				for _, d := range days {
					out[k][id] = append(out[k][id], DayOf(d))
				}
			}
		}
	}
	return out, nil
}

// listedOnAnotherDay reports a payment or refund an earlier import listed on another day than
// this file does: the bank says it moved the money again. As for one listed twice in a file,
// nothing is settled for it.
func (run *run) listedOnAnotherDay(o op, l Line, earlier []Day) {
	slices.Sort(earlier)
	days := make([]string, len(earlier))
	for i, d := range earlier {
		days[i] = string(d)
	}
	m := entry(o, l.Number, l.ProviderChargeID)
	m.Kind, m.Expected = KindChargedTwice, o.describe()+", once"
	m.Found = fmt.Sprintf("listed on line %d (%s) and, by an earlier import, on %s: %s", l.Number, l.SettlementDate,
		strings.Join(days, ", "), describeLine(l))
	run.mismatch(o.kind, m)
}

// settle sends the settlement in the background (bounded by the semaphore). done gets the
// final status; refused gets the operation as it is now when the workflow refused the
// settlement because it is no longer unknown. Other failures are settle_failed mismatches
// built on m; an unavailable Temporal or database aborts the import.
func (run *run) settle(o op, st workflows.Settlement, done func(status string), refused func(op), m *Mismatch) {
	if run.dry {
		// What the workflow answers when it accepts the settlement, or refuses it for a conflict.
		if workflows.ConflictRefuses(o.stuck) == st.Outcome {
			mm := *m
			mm.Kind, mm.Expected, mm.Found = KindBankConflict, "unknown, settled as "+st.Outcome, o.stuck
			run.mismatch(o.kind, mm)
			return
		}
		if st.Outcome == workflows.OutcomeCharged {
			done(string(payment.StatusSucceeded))
		} else {
			done(string(payment.StatusFailed))
		}
		return
	}
	st.OperationID = o.id // the key may name another operation by the time the settlement arrives
	select {
	case run.sem <- struct{}{}:
	case <-run.ctx.Done():
		return
	}
	if run.ctx.Err() != nil { // a slot freed as the import was stopped: select picks either
		<-run.sem
		return
	}
	run.wg.Go(func() {
		defer func() { <-run.sem }()
		timeout := run.r.SettleTimeout
		if timeout <= 0 {
			timeout = DefaultSettleTimeout
		}
		ctx, cancel := context.WithTimeout(run.ctx, timeout)
		status, err := run.r.Settler.Settle(ctx, o.workflowID(), st)
		timedOut := ctx.Err() != nil
		cancel()
		noun := o.kind.noun()
		switch {
		case err == nil:
			run.log().Info("reconcile: settled", noun+"_id", o.id, "outcome", st.Outcome, "status", status)
			done(status)
		case run.ctx.Err() != nil:
			// the import is being aborted
		case errors.Is(err, workflows.ErrStillRunning):
			run.pending(o.kind, pendingOf(o, ReasonSettling, m.Line, "its workflow took the settlement as "+st.Outcome+
				" and is still applying it: import again later to see the outcome"))
		case errors.Is(err, workflows.ErrBankConflict):
			mm := *m
			mm.Kind, mm.Expected, mm.Found = KindBankConflict, "unknown, settled as "+st.Outcome, err.Error()
			run.mismatch(o.kind, mm)
		case errors.Is(err, workflows.ErrSettlementAmountDiffers):
			// Only the workflow knows what a manual payment's unknown capture asked for.
			mm := *m
			mm.Kind, mm.Expected, mm.Found = KindAmountDiffers, o.describe()+", its capture as kasa sent it", err.Error()
			run.mismatch(o.kind, mm)
		case errors.Is(err, workflows.ErrSettlementRejected):
			now, rerr := run.reread(o)
			switch {
			case rerr != nil:
				run.cancel(fmt.Errorf("re-read %s %s: %w", noun, o.id, rerr))
			case now.status != payment.StatusUnknown:
				refused(now)
			default:
				mm := *m
				mm.Kind, mm.Expected, mm.Found = KindSettleFailed, "unknown, settled as "+st.Outcome, err.Error()
				run.mismatch(o.kind, mm)
			}
		case workflows.IsUnavailable(err) && !timedOut:
			run.cancel(fmt.Errorf("settle %s %s: %w", noun, o.id, err))
		default:
			run.log().Warn("reconcile: settle failed", noun+"_id", o.id, "outcome", st.Outcome, "error", err)
			mm := *m
			mm.Kind, mm.Expected, mm.Found = KindSettleFailed, "unknown, settled as "+st.Outcome, err.Error()
			run.mismatch(o.kind, mm)
		}
	})
}

// reread reads a payment or refund whose settlement was refused, giving a settlement that
// another import has in flight a moment to land.
func (run *run) reread(o op) (op, error) {
	for attempt := range 5 {
		var err error
		if o.kind == refund {
			var rf payment.Refund
			rf, err = run.r.Store.Refund(run.ctx, o.id)
			o = refundOp(rf)
		} else {
			var p payment.Payment
			p, err = run.r.Store.Payment(run.ctx, o.id)
			o = paymentOp(p)
		}
		if err != nil || o.status != payment.StatusUnknown {
			return o, err
		}
		select {
		case <-time.After(time.Duration(attempt+1) * rereadDelay):
		case <-run.ctx.Done():
			return o, context.Cause(run.ctx)
		}
	}
	return o, nil
}

func (run *run) log() *slog.Logger { return run.r.logger() }

func (r *Reconciler) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func describeLine(l Line) string {
	k := charge
	if l.Type == TypeRefund {
		k = refund
	}
	return fmt.Sprintf("%s %s %s on %s, %s %s", l.Status, l.Amount(), l.Currency, l.SettlementDate, bankNoun(k), l.ProviderChargeID)
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
