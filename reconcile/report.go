package reconcile

import (
	"encoding/json"
	"sort"
	"time"
)

// Mismatch kinds: a disagreement between the bank's file and kasa that a person must look at.
// Reconciliation never changes such a payment or refund. The kinds are the same for refunds
// (whose "charge" is the bank's refund), except KindRefundedButFailed.
const (
	// The file lists the payment with another amount / currency than kasa recorded.
	KindAmountDiffers   = "amount_differs"
	KindCurrencyDiffers = "currency_differs"
	// The bank charged a payment that kasa recorded as failed (the payer's money was taken).
	KindChargedButFailed = "charged_but_failed"
	// The bank paid back a refund that kasa recorded as failed (its hold was released).
	KindRefundedButFailed = "refunded_but_failed"
	// The file lists a reference kasa has no payment (on a charge line) or refund (on a refund
	// line) for.
	KindUnknownReference = "unknown_reference"
	// kasa recorded a payment as succeeded whose whole charge window the file covers, but the
	// bank does not list it.
	KindSucceededButMissing = "succeeded_but_missing"
	// The bank's charge id differs from the one kasa recorded (a second charge?).
	KindProviderReferenceDiffers = "provider_reference_differs"
	// The file lists the payment (refund) on more than one line: the bank moved the money more
	// than once. Nothing is settled for it; its other lines' payments are reconciled as usual.
	KindChargedTwice = "charged_twice"
	// An unknown payment could not be settled (no worker answered in time, the workflow refused
	// the settlement while the database still says unknown...). Re-running the import is safe.
	KindSettleFailed = "settle_failed"
	// The bank's own answer (an inquiry, or its refusal of a void) contradicts the settlement:
	// the workflow kept the hold and flagged the payment stuck. A person asks the bank which is
	// right, then settles it by hand (docs/operations.md); importing again changes nothing.
	KindBankConflict = "bank_conflict"
)

// Pending reasons: not a mismatch, but not reconciled by this file either.
const (
	// The file lists a payment that is still processing: the next import matches it.
	ReasonProcessing = "processing"
	// The payment's charge may have happened on a day the file does not cover (it was created
	// near midnight, or stayed in flight across days): reconcile with a file covering those days.
	ReasonWindowNotCovered = "charge_window_not_covered"
	// The bank may still book the payment's charge (its booking window has not passed), or booked
	// it after the file was made: reconcile with a file made after the window.
	ReasonBookingWindow = "booking_window_open"
	// An unknown payment the file does not list, on a day the file does not prove complete (no
	// trailer: it may have been cut short): reconcile with the bank's complete file.
	ReasonFileNotComplete = "file_not_complete"
	// An unknown payment or refund the file does not list, outside a scope nobody declared (the
	// import names no merchants and the file has no scope row; or the file does not say it
	// covers refunds): the file's silence proves nothing about it. Import with a scope.
	ReasonScopeNotDeclared = "scope_not_declared"
	// A manual payment whose unknown capture the file proves not charged: kasa let its
	// authorization go, and the bank's answer to that void was lost too. It stays unknown, its
	// hold kept, until a later import (or an inquiry) settles the void.
	ReasonVoidUnknown = "void_unknown"
	// A manual payment whose authorization got no answer: files list captures, never
	// authorizations, so no file proves the bank holds none. An operator settles it once the
	// bank says (docs/reconciliation.md).
	ReasonAuthorizationUnknown = "authorization_unknown"
	// An unknown payment or refund whose workflow took the settlement and is still applying it
	// (a manual payment's void at the bank): the next import finds it settled.
	ReasonSettling = "settling"
	// An unknown payment or refund the file does not list, which an earlier import found listed
	// (while it was in flight): the bank's files disagree, and a person settles it by hand.
	ReasonListedEarlier = "listed_earlier"
)

// Counts tallies the outcomes of one import: the payments', and beside them the refunds'.
type Counts struct {
	Matched            int `json:"matched"`              // listed, succeeded, amount and currency agree
	ResolvedCharged    int `json:"resolved_charged"`     // was unknown, listed: settled as charged
	ResolvedNotCharged int `json:"resolved_not_charged"` // was unknown, its days covered, not listed: settled as not charged
	Pending            int `json:"pending"`              // see Report.Pending
	Mismatches         int `json:"mismatches"`           // see Report.Mismatches
	// The same for refunds: resolved_charged is a refund the bank paid back, not_charged one it did not.
	RefundMatched            int `json:"refund_matched"`
	RefundResolvedCharged    int `json:"refund_resolved_charged"`
	RefundResolvedNotCharged int `json:"refund_resolved_not_charged"`
	RefundPending            int `json:"refund_pending"`    // see Report.RefundPending
	RefundMismatches         int `json:"refund_mismatches"` // see Report.RefundMismatches
}

// Mismatch is one disagreement. Expected is what kasa's records say, Found what the settlement
// file says. A refund's entry carries its id (RefundID, = Reference) and its payment's
// (PaymentID); its WorkflowID is the refund's workflow.
type Mismatch struct {
	Kind             string `json:"kind"`
	Line             int    `json:"line,omitempty"` // 0: found by the coverage check, not on a line
	Reference        string `json:"reference"`
	PaymentID        string `json:"payment_id,omitempty"`
	RefundID         string `json:"refund_id,omitempty"`
	MerchantID       string `json:"merchant_id,omitempty"`
	WorkflowID       string `json:"workflow_id,omitempty"`
	ProviderChargeID string `json:"provider_charge_id,omitempty"`
	Expected         string `json:"expected"`
	Found            string `json:"found"`
}

// Resolution is an unknown payment or refund this import settled (in a dry run: would settle).
type Resolution struct {
	Outcome          string `json:"outcome"`        // charged or not_charged
	Line             int    `json:"line,omitempty"` // 0: not listed (not charged)
	Reference        string `json:"reference"`
	PaymentID        string `json:"payment_id"`
	RefundID         string `json:"refund_id,omitempty"`
	MerchantID       string `json:"merchant_id"`
	WorkflowID       string `json:"workflow_id"`
	ProviderChargeID string `json:"provider_charge_id,omitempty"`
}

// Completeness is a day the file declares complete by its trailer: every settlement the bank
// booked on Day up to AsOf.
type Completeness struct {
	Day  Day       `json:"day"`
	AsOf time.Time `json:"as_of"`
}

// Pending is a payment or refund this import could not reconcile yet, without anything being wrong.
type Pending struct {
	Reason     string `json:"reason"`
	Line       int    `json:"line,omitempty"`
	Reference  string `json:"reference"`
	PaymentID  string `json:"payment_id"`
	RefundID   string `json:"refund_id,omitempty"`
	MerchantID string `json:"merchant_id"`
	WorkflowID string `json:"workflow_id"`
	Status     string `json:"status"`
	Detail     string `json:"detail,omitempty"`
}

// Report is the result of one import; it renders as the admin endpoint's JSON body and
// `kasa reconcile --json`.
type Report struct {
	DryRun   bool           `json:"dry_run"`  // nothing was changed: the report says what an import would do
	Days     []Day          `json:"days"`     // the UTC days the file covers
	Complete []Completeness `json:"complete"` // the days its trailers prove complete
	// Scope is what the import and the file declare together: ScopeAll, ScopeMerchants (those in
	// Merchants) or ScopeNone (nothing unlisted is released).
	Scope     string   `json:"scope"`
	Merchants []string `json:"merchants,omitempty"`
	Lines     int      `json:"lines"` // the payment (charge) lines matched
	// RefundLines counts the refund lines matched (to refunds).
	RefundLines int `json:"refund_lines"`
	// ChargesCovered and RefundsCovered: the line types whose absence from the file can release
	// an unknown operation of a merchant in scope. Charges unless the file's scope row says
	// otherwise; refunds only when it declares them (the type column alone does not).
	ChargesCovered bool         `json:"charges_covered"`
	RefundsCovered bool         `json:"refunds_covered"`
	Counts         Counts       `json:"counts"`
	Resolved       []Resolution `json:"resolved"`
	Mismatches     []Mismatch   `json:"mismatches"`
	Pending        []Pending    `json:"pending"`
	// The refunds', beside the payments'.
	RefundResolved   []Resolution `json:"refund_resolved"`
	RefundMismatches []Mismatch   `json:"refund_mismatches"`
	RefundPending    []Pending    `json:"refund_pending"`
}

// OK reports whether no mismatch, of a payment or a refund, is left unresolved (pending ones
// are not mismatches).
func (r Report) OK() bool { return len(r.Mismatches) == 0 && len(r.RefundMismatches) == 0 }

// MarshalJSON adds "ok" and renders empty lists as [].
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	out := struct {
		OK bool `json:"ok"`
		*plain
	}{OK: r.OK(), plain: (*plain)(&r)}
	if out.Mismatches == nil {
		out.Mismatches = []Mismatch{}
	}
	if out.Pending == nil {
		out.Pending = []Pending{}
	}
	if out.Days == nil {
		out.Days = []Day{}
	}
	if out.Complete == nil {
		out.Complete = []Completeness{}
	}
	if out.Resolved == nil {
		out.Resolved = []Resolution{}
	}
	if out.RefundMismatches == nil {
		out.RefundMismatches = []Mismatch{}
	}
	if out.RefundPending == nil {
		out.RefundPending = []Pending{}
	}
	if out.RefundResolved == nil {
		out.RefundResolved = []Resolution{}
	}
	return json.Marshal(out)
}

func (r *Report) sort() {
	for _, ms := range [][]Mismatch{r.Mismatches, r.RefundMismatches} {
		sort.SliceStable(ms, func(i, j int) bool {
			a, b := ms[i], ms[j]
			return before(a.Line, a.Reference, b.Line, b.Reference)
		})
	}
	for _, rs := range [][]Resolution{r.Resolved, r.RefundResolved} {
		sort.SliceStable(rs, func(i, j int) bool {
			a, b := rs[i], rs[j]
			return before(a.Line, a.Reference, b.Line, b.Reference)
		})
	}
	for _, ps := range [][]Pending{r.Pending, r.RefundPending} {
		sort.SliceStable(ps, func(i, j int) bool {
			a, b := ps[i], ps[j]
			return before(a.Line, a.Reference, b.Line, b.Reference)
		})
	}
	r.Counts.Mismatches = len(r.Mismatches)
	r.Counts.Pending = len(r.Pending)
	r.Counts.RefundMismatches = len(r.RefundMismatches)
	r.Counts.RefundPending = len(r.RefundPending)
}

// before orders report entries: lines first (by number), then the coverage findings (line 0),
// each by reference.
func before(aLine int, aRef string, bLine int, bRef string) bool {
	if (aLine == 0) != (bLine == 0) {
		return aLine != 0
	}
	if aLine != bLine {
		return aLine < bLine
	}
	return aRef < bRef
}
