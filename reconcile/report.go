package reconcile

import (
	"encoding/json"
	"sort"
	"time"
)

// Mismatch kinds: a disagreement between the bank's file and kasa that a person must look at.
// Reconciliation never changes such a payment.
const (
	// The file lists the payment with another amount / currency than kasa recorded.
	KindAmountDiffers   = "amount_differs"
	KindCurrencyDiffers = "currency_differs"
	// The bank charged a payment that kasa recorded as failed (the payer's money was taken).
	KindChargedButFailed = "charged_but_failed"
	// The file lists a reference kasa has no payment for.
	KindUnknownReference = "unknown_reference"
	// kasa recorded a payment as succeeded whose whole charge window the file covers, but the
	// bank does not list it.
	KindSucceededButMissing = "succeeded_but_missing"
	// The bank's charge id differs from the one kasa recorded (a second charge?).
	KindProviderReferenceDiffers = "provider_reference_differs"
	// An unknown payment could not be settled (no worker answered in time, the workflow refused
	// the settlement while the database still says unknown...). Re-running the import is safe.
	KindSettleFailed = "settle_failed"
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
)

// Counts tallies the outcomes of one import.
type Counts struct {
	Matched            int `json:"matched"`              // listed, succeeded, amount and currency agree
	ResolvedCharged    int `json:"resolved_charged"`     // was unknown, listed: settled as charged
	ResolvedNotCharged int `json:"resolved_not_charged"` // was unknown, its days covered, not listed: settled as not charged
	Pending            int `json:"pending"`              // see Report.Pending
	Mismatches         int `json:"mismatches"`           // see Report.Mismatches
}

// Mismatch is one disagreement. Expected is what kasa's records say, Found what the settlement
// file says.
type Mismatch struct {
	Kind             string `json:"kind"`
	Line             int    `json:"line,omitempty"` // 0: found by the coverage check, not on a line
	Reference        string `json:"reference"`
	PaymentID        string `json:"payment_id,omitempty"`
	MerchantID       string `json:"merchant_id,omitempty"`
	WorkflowID       string `json:"workflow_id,omitempty"`
	ProviderChargeID string `json:"provider_charge_id,omitempty"`
	Expected         string `json:"expected"`
	Found            string `json:"found"`
}

// Resolution is an unknown payment this import settled (in a dry run: would settle).
type Resolution struct {
	Outcome          string `json:"outcome"`        // charged or not_charged
	Line             int    `json:"line,omitempty"` // 0: not listed (not charged)
	Reference        string `json:"reference"`
	PaymentID        string `json:"payment_id"`
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

// Pending is a payment this import could not reconcile yet, without anything being wrong.
type Pending struct {
	Reason     string `json:"reason"`
	Line       int    `json:"line,omitempty"`
	Reference  string `json:"reference"`
	PaymentID  string `json:"payment_id"`
	MerchantID string `json:"merchant_id"`
	WorkflowID string `json:"workflow_id"`
	Status     string `json:"status"`
	Detail     string `json:"detail,omitempty"`
}

// Report is the result of one import; it renders as the admin endpoint's JSON body and
// `kasa reconcile --json`.
type Report struct {
	DryRun    bool           `json:"dry_run"`             // nothing was changed: the report says what an import would do
	Days      []Day          `json:"days"`                // the UTC days the file covers
	Complete  []Completeness `json:"complete"`            // the days its trailers prove complete
	Merchants []string       `json:"merchants,omitempty"` // coverage limited to these merchants (empty: all)
	Lines     int            `json:"lines"`               // the payment (charge) lines matched
	// RefundLines counts the file's refund lines. They are kept aside: nothing is matched to
	// them, and they neither cover a day nor list a payment. Omitted from the JSON when 0.
	RefundLines int          `json:"refund_lines,omitempty"`
	Counts      Counts       `json:"counts"`
	Resolved    []Resolution `json:"resolved"`
	Mismatches  []Mismatch   `json:"mismatches"`
	Pending     []Pending    `json:"pending"`
}

// OK reports whether no mismatch is left unresolved (pending payments are not mismatches).
func (r Report) OK() bool { return len(r.Mismatches) == 0 }

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
	return json.Marshal(out)
}

func (r *Report) sort() {
	sort.SliceStable(r.Mismatches, func(i, j int) bool {
		a, b := r.Mismatches[i], r.Mismatches[j]
		return before(a.Line, a.Reference, b.Line, b.Reference)
	})
	sort.SliceStable(r.Resolved, func(i, j int) bool {
		a, b := r.Resolved[i], r.Resolved[j]
		return before(a.Line, a.Reference, b.Line, b.Reference)
	})
	sort.SliceStable(r.Pending, func(i, j int) bool {
		a, b := r.Pending[i], r.Pending[j]
		return before(a.Line, a.Reference, b.Line, b.Reference)
	})
	r.Counts.Mismatches = len(r.Mismatches)
	r.Counts.Pending = len(r.Pending)
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
