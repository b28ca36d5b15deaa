// Package workflows holds kasa's deterministic orchestration: the payment workflow, and every
// name Temporal records in history forever (workflow, activity, signal, search attributes, error
// types, task queue). It never touches the database or the network itself.
package workflows

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/temporal"

	"github.com/kasa-pay/kasa/payment"
)

// Names recorded in workflow histories: never rename them.
const (
	TaskQueue       = "payments"
	WorkflowPayment = "PaymentWorkflow"

	ActivityReserveFunds = "ReserveFunds"
	// ActivityReserve is ReserveFunds for runs of Revision 2 on: it refuses a payment another run
	// already decided.
	ActivityReserve     = "Reserve"
	ActivityCharge      = "Charge"
	ActivityInquire     = "InquireCharge"
	ActivityFinalize    = "Finalize"
	ActivityRelease     = "Release"
	ActivityMarkUnknown = "MarkUnknown"
	ActivityFlagStuck   = "FlagStuck"
	// ActivityMarkAuthorizationUnknown is MarkUnknown for a manual payment's authorization, from
	// Revision 10: it never reopens an authorization another run recorded.
	ActivityMarkAuthorizationUnknown = "MarkAuthorizationUnknown"
	// ActivityReadPaymentStatus reads the payment's status: a parked run of Revision 10 on ends
	// once another run decided it.
	ActivityReadPaymentStatus = "ReadPaymentStatus"
	// ActivityChargePolicy asks the worker, the process that talks to the bank, how to send to
	// it: a payment or refund of Revision 2 on records the answer in its history.
	ActivityChargePolicy = "ChargePolicy"

	// A manual payment's steps: authorize at the bank (and inquire), record the authorization,
	// capture or void at the bank (and inquire), then post the capture or release the hold.
	ActivityAuthorize            = "Authorize"
	ActivityInquireAuthorization = "InquireAuthorization"
	ActivityAuthorized           = "Authorized"
	ActivityCaptureAuthorization = "CaptureAuthorization"
	ActivityInquireCapture       = "InquireCapture"
	ActivityCaptured             = "Captured"
	ActivityVoidAuthorization    = "VoidAuthorization"
	ActivityInquireVoid          = "InquireVoid"
	ActivityCanceled             = "Canceled"

	SignalSettlement = "settlement"
	UpdateSettle     = "settle" // the checked form of the settlement signal
	// A manual payment's capture and cancel: updates whose validators refuse what cannot be done
	// before anything is written, and whose results are the payment's status after them.
	UpdateCapture = "capture"
	UpdateCancel  = "cancel"
	QueryStatus   = "status"
	// SignalRetry tells a stuck payment's workflow that an operator fixed the cause: it runs the
	// failed step again (docs/operations.md, "Stuck payments").
	SignalRetry = "retry"
)

// StatusStuck is the PaymentStatus search attribute of a payment whose workflow waits for an
// operator; the payment itself keeps its status.
const StatusStuck = "stuck"

// Application error types: activities classify, the workflow switches on these.
const (
	ErrTypeInsufficientFunds = "InsufficientFunds"
	ErrTypeDeclined          = "Declined"
	ErrTypeAmbiguous         = "ProviderAmbiguous" // the charge may or may not have happened
	// ErrTypeRejected is no longer returned (a 4xx is ambiguous: a 409 "in progress" may still
	// move money); kept for histories recorded when it counted as a decline.
	ErrTypeRejected          = "ProviderRejected"
	ErrTypeNotFound          = "ChargeNotFound"     // an inquiry found no charge
	ErrTypeInconsistent      = "InconsistentState"  // the database contradicts the step; a person must look
	ErrTypeInquiryNotAllowed = "InquiryUnsupported" // the provider has no status inquiry
	// ErrTypeNotSent: a send failed before it went out (the database could not be read, or its
	// send record not written): nothing reached the bank.
	ErrTypeNotSent = "NotSent"
	// ErrTypeAlreadyDecided: a run's first step found its operation decided by another run; its
	// details are the operation's status.
	ErrTypeAlreadyDecided = "AlreadyDecided"
	// A capture or cancel refused by the workflow's validator: nothing was done.
	ErrTypeNotCapturable  = "NotCapturable"
	ErrTypeCaptureExceeds = "CaptureExceedsCapturable"
	ErrTypeNotCancelable  = "NotCancelable"
	// ErrTypeAuthorizing: a capture or cancel that reached the run before it heard that the
	// authorization was recorded, which the payment may already read: sent again, it is taken.
	ErrTypeAuthorizing = "AuthorizationBeingRecorded"
	// ErrTypeSettlementAmount: a settlement listing another amount than the one kasa asked the
	// bank to move was refused.
	ErrTypeSettlementAmount = "SettlementAmountDiffers"
	// ErrTypeCapturedAtBank: an inquiry found captured the authorization kasa is voiding, a
	// definite answer that the money moved (details: the authorization's id at the bank).
	ErrTypeCapturedAtBank = "AuthorizationCaptured"
	// ErrTypeBankConflict: a settlement was set aside (or, applied, led to a hold) because the
	// bank's own answer contradicts it: the hold is kept and the payment flagged for an operator.
	ErrTypeBankConflict = "BankConflict"
	// ErrTypeSettling: a settlement was refused because another is being applied (its outcome
	// in the details).
	ErrTypeSettling = "SettlementInProgress"
)

// The prefixes begin the stuck reason of an operation held for a bank conflict, so that what
// reads the reason (a reconciliation dry run) can tell such a hold from a failing step, and which
// settlement it refuses: a not_charged one, or (Revision 6 on) a charged one.
const (
	conflictPrefix        = "bank conflict: "
	chargedConflictPrefix = "bank conflict over a charge: "
)

// ConflictReason is the stuck reason of a hold for a bank conflict described by reason, which
// refuses settlements of outcome refused.
func ConflictReason(refused, reason string) string {
	if refused == OutcomeCharged {
		return chargedConflictPrefix + reason
	}
	return conflictPrefix + reason
}

// ConflictRefuses is the settlement outcome a stuck reason's bank conflict refuses; "" when the
// reason is no conflict's.
func ConflictRefuses(stuckReason string) string {
	switch {
	case strings.HasPrefix(stuckReason, chargedConflictPrefix):
		return OutcomeCharged
	case strings.HasPrefix(stuckReason, conflictPrefix):
		return OutcomeNotCharged
	}
	return ""
}

// Search attributes on every payment workflow; operators filter PaymentStatus="unknown".
// PaymentSummary is the static summary again, set at the start: the Web UI's list shows search
// attributes as columns but not the summary, and the operator must see what is at stake there.
var (
	SearchPaymentStatus  = temporal.NewSearchAttributeKeyKeyword("PaymentStatus")
	SearchMerchantID     = temporal.NewSearchAttributeKeyKeyword("MerchantId")
	SearchPaymentSummary = temporal.NewSearchAttributeKeyKeyword("PaymentSummary")
)

// UnknownList is the operator's list filter of the payments and refunds parked unknown
// (docs/reconciliation.md, "Find unknown payments"). A closed run keeps its last PaymentStatus:
// without the running filter the list would also show a long-unknown payment's runs continued
// as new, and a run terminated and then reset, each of them still listed once it is settled.
const UnknownList = `PaymentStatus="unknown" AND ExecutionStatus="Running"`

// Capability is what the provider supports; it picks the charge strategy.
type Capability string

const (
	CapabilityIdempotent Capability = "idempotent"
	CapabilityInquiry    Capability = "inquiry"
	CapabilityNone       Capability = "none"
)

// Capabilities lists every provider capability, from the most to the least the provider offers.
var Capabilities = []Capability{CapabilityIdempotent, CapabilityInquiry, CapabilityNone}

// Safer is whichever of a and b offers less, so the stricter strategy governs when two processes
// disagree; an empty capability names none and yields to the other.
func Safer(a, b Capability) Capability {
	rank := func(c Capability) int {
		for i, k := range Capabilities {
			if k == c {
				return i
			}
		}
		return len(Capabilities) // unknown: treated as the least
	}
	switch {
	case a == "":
		return b
	case b == "":
		return a
	case rank(b) > rank(a):
		return b
	}
	return a
}

// PaymentWorkflowID is `payment/<merchant id>/<idempotency key>`: Temporal itself refuses a second
// workflow for the same key. A key too long for that to fit in maxWorkflowID is shortened (see
// workflowID).
func PaymentWorkflowID(merchantID uuid.UUID, key string) string {
	return workflowID("payment/", merchantID, key)
}

// maxWorkflowID is the longest workflow id a Temporal Server on SQL keeps (its limit.maxIDLength,
// deployment.md), where a key may be 255 characters on its own.
const maxWorkflowID = 255

// workflowID is prefix<merchant id>/<key>, or, when that is longer than maxWorkflowID, the
// key's first characters, a space and the SHA-256 of the whole key in hex, to exactly that
// length: refused, the operation could never start. No key has a space (payment.ValidKey), so
// no key that fits names a shortened id. Keys are ASCII, so a byte is a character.
func workflowID(prefix string, merchantID uuid.UUID, key string) string {
	id := prefix + merchantID.String() + "/" + key
	if len(id) <= maxWorkflowID {
		return id
	}
	sum := sha256.Sum256([]byte(key))
	digest := " " + hex.EncodeToString(sum[:])
	return id[:maxWorkflowID-len(digest)] + digest
}

// PaymentInput is everything the workflow needs; it is recorded in history, so it never changes
// meaning for a running payment even if configuration does.
type PaymentInput struct {
	OperationID uuid.UUID
	MerchantID  uuid.UUID
	AccountID   uuid.UUID
	AmountMinor int64
	Currency    string
	Capability  Capability
	// ChargeBudget bounds how long an idempotent provider is retried before the outcome is
	// parked as unknown. Zero means DefaultChargeBudget.
	ChargeBudget time.Duration
	// ChargeTimeout is one charge or inquiry attempt's StartToClose: how long a silent worker
	// or provider is waited for before the attempt counts as ambiguous. Zero means
	// DefaultChargeTimeout. It must exceed the provider client's own timeout.
	ChargeTimeout time.Duration
	// LocalSteps runs the steps as local activities: the whole payment in one workflow task
	// instead of one per step. Every payment started now has it; payments started before it
	// existed decode it as false and replay as they ran. (The input, not workflow.GetVersion,
	// carries the switch: GetVersion upserts a search attribute, one more visibility write per
	// payment.)
	LocalSteps bool
	// BookingWindow is how long the bank may take to book a charge after kasa stopped waiting:
	// with capability inquiry, a charge still not found is re-sent only once it has passed since
	// the send ended. Zero means DefaultBookingWindow (from Revision 1 on).
	BookingWindow time.Duration
	// Revision is the version of the workflow's rules the payment started under; a running
	// payment keeps it, since its history replays the rules it recorded. 0: before the booking
	// window, numbered sends, the stuck state and ContinueAsNew. InputFor sets CurrentRevision.
	Revision int
	// Parked starts a run continued from one that waited, unknown, for a settlement: it goes
	// straight back to waiting, the next inquiry after InquiryWait.
	Parked      bool
	InquiryWait time.Duration
	// CaptureManual: authorize, wait for a capture or a cancel until CaptureBefore, then capture
	// or void (docs/api.md, "Authorize now, capture later").
	// (omitzero: an automatic payment's history carries none of these.)
	CaptureManual bool      `json:",omitzero"`
	CaptureBefore time.Time `json:",omitzero"`
	// Step is where a continued run of a manual payment was parked (PhaseAuthorize, PhaseCapture
	// or PhaseVoid), with what that step needs: the authorization, the capture's amount, the
	// cancel's failure code.
	Step Step `json:",omitzero"`
	// Invoice is the merchant's invoice id, for the workflow's summary in the Web UI.
	Invoice string `json:",omitzero"`
}

// Phases of a manual payment: what its bank call (and a settlement of it) is about.
const (
	PhaseAuthorize = ""
	PhaseCapture   = "capture"
	PhaseVoid      = "void"
)

// Step is a manual payment's phase and what it needs. CommandID is the merchant's command that
// led to it (none for the authorization, or a void at capture_before).
type Step struct {
	Phase            string
	AuthorizationRef string
	AmountMinor      int64
	FailureCode      string
	CommandID        uuid.UUID `json:",omitzero"`
}

// CurrentRevision is the Revision of every payment and refund started now. Revision 2: the
// input carries no charge policy, the workflow asks its worker for one (ActivityChargePolicy);
// and a not_charged settlement that meets an inquiry finding the charge is a conflict for an
// operator, never a release. Revision 3: a void whose inquiry finds the authorization captured
// keeps the hold for an operator (not_charged refused, a charged settlement naming the capture
// posts it); a settlement the phase before applied is answered once the next phase parks; an
// operator's retry that arrives while the stuck flag is written counts; a void's not_charged
// settlement meeting an inquiry that finds the void done is no conflict; a charged settlement
// naming a capture (the bank's file lists it) settles an unknown void by posting that capture.
// Revision 4: a settlement signalled while the one applied before still runs (its void at the
// bank) is ignored, as is a charged one naming another amount than the operation's, or one of an
// unknown authorization naming no authorization id; an operator's retry of a conflict asks the
// bank again at once (inquiry). Revision 5: a settlement signalled for another operation than
// the run's (operation_id) is ignored. Revision 6: a charged settlement that meets an inquiry
// finding a void's capture is applied, not set aside; a not_charged settlement of an unknown
// void sends the void once more (not with none) and keeps the hold only if the bank says it
// captured; a settlement signalled once an inquiry's answer decided the run is ignored; a charged
// settlement that meets an inquiry finding nothing done (declined, or the void done) is a
// conflict for an operator, as a not_charged one meeting the operation done is; an unknown
// authorization the inquiry still does not find past the booking window fails; a cancel whose
// void the bank answered with a capture is marked as the command taken. Revision 7: a
// cancellation request (the Web UI's, or `temporal workflow cancel`) is logged and ignored.
// Revision 8: a local step's retries wait up to a minute, each on a server timer once longer
// than a workflow task's timeout (a database outage no longer keeps every run's task open).
// Revision 9: a manual payment waits for capture_before by the database's clock, which stamped
// it (the time left as the authorization was recorded), not by the Temporal Server's; and a
// send that failed before it went out (NotSent: the database down) is made again, not parked;
// a run that finds its payment final as it marks it unknown (another run decided it) ends with
// that status, and a moved manual payment whose authorization the ended run recorded waits for
// its capture. Revision 10: a run parked unknown without inquiries reads its operation's status
// now and then (as an inquiry's timer would run) and ends with it once another run has made it
// final; one parked in a manual payment's authorization that reads it recorded takes it on, as
// does one whose mark of its authorization as unknown finds it recorded by another run.
// Revision 11: a manual payment waiting for its capture whose run an operator reset (after a
// terminate by mistake) is taken on by the reset run, which waits for the capture or voids it
// (or, its authorization's answer lost, waits for its settlement again);
// with inquiry, a settlement that arrives between two inquiries is applied only after an inquiry
// asked at once, whose answer it must not contradict. Revision 12: an unknown operation's inquiry
// (which a settlement waits for) gives up after the charge timeout, not the charge budget, so that
// at a bank that does not answer it a settlement import's wait sees the settlement applied.
const CurrentRevision = 12

// ChargePolicy is the configured part of PaymentInput: how charges are sent.
type ChargePolicy struct {
	Capability Capability
	Budget     time.Duration // see PaymentInput.ChargeBudget
	Timeout    time.Duration // see PaymentInput.ChargeTimeout
	// BookingWindow: see PaymentInput.BookingWindow.
	BookingWindow time.Duration
}

// PaymentResult is the workflow's final answer.
type PaymentResult struct {
	Status            string
	FailureCode       string
	ProviderReference string
}

// ChargeInput is what the provider needs; the operation id is its idempotency key.
type ChargeInput struct {
	OperationID uuid.UUID
	AccountID   uuid.UUID
	AmountMinor int64
	Currency    string
	// Capability tells the activity what a repeated attempt may do. A charge run as a local
	// activity is run again when its worker dies before the workflow task completes, so the
	// activity records each attempt durably before sending: a repeat never re-sends to a
	// provider without idempotency ("none"), and asks first with "inquiry". Empty (histories
	// from before local steps): send, as a regular activity limited to one attempt did.
	Capability Capability
	// Send numbers the workflow's sends of this charge (1 for the first). A repeat of the same
	// send, run by a new worker, never re-sends: it inquires, and leaves a re-send to the
	// workflow's booking window. Zero (histories before numbered sends): the attempt count decides.
	Send   int
	Resend Resend `json:",omitzero"`
}

// FlagInput marks a payment as stuck with the reason, or clears the mark (empty reason).
type FlagInput struct {
	OperationID uuid.UUID
	Reason      string
}

// ChargeResult is a definite answer from the provider.
type ChargeResult struct {
	ProviderReference string
	Succeeded         bool
}

// FinalizeInput captures a charged payment.
type FinalizeInput struct {
	OperationID       uuid.UUID
	ProviderReference string
}

// AuthorizedResult is what recording a manual payment's authorization answers: the database's
// clock once it was recorded. capture_before is that clock's time, so a run of Revision 9 on
// waits for it by the time left on that clock, not by the Temporal Server's, which may be minutes
// off. Zero (a worker that answered nothing) leaves the run's own clock to judge.
type AuthorizedResult struct {
	DatabaseNow time.Time `json:",omitzero"`
}

// StatusRead is what a parked run of Revision 10 reads of its operation (ActivityReadPaymentStatus,
// ActivityReadRefundStatus): its status, and the bank's reference the database holds for it (a
// manual payment's authorization, which a run parked in its authorization takes on).
type StatusRead struct {
	Status            string
	ProviderReference string `json:",omitempty"`
}

// BankCallInput is a manual payment's capture or void at the bank: AmountMinor is a capture's.
// Send numbers the workflow's sends of it from 1 (none before sends were numbered).
type BankCallInput struct {
	OperationID      uuid.UUID
	AuthorizationRef string
	AmountMinor      int64
	Send             int    `json:",omitzero"`
	Resend           Resend `json:",omitzero"`
}

// Resend is what a send after an unanswered one (inquiry's re-send) says about the wait before
// it: when the earlier send ended and the booking window waited since. A worker whose own
// window is longer holds the send back until that window has passed as well
// (docs/deployment.md, "Money settings"). Zero: a first send, or a history from before it.
type Resend struct {
	PreviousEnded time.Time     `json:",omitzero"`
	Waited        time.Duration `json:",omitzero"`
	// Since is how long before this send was scheduled the earlier one ended, by the run's
	// clock (Temporal's), which stamped PreviousEnded: a worker's own clock may be minutes off
	// it. Zero: a history from before it, judged by the worker's clock.
	Since time.Duration `json:",omitzero"`
}

// CapturedInput posts a manual payment's capture of AmountMinor, which CommandID asked for.
type CapturedInput struct {
	OperationID       uuid.UUID
	AmountMinor       int64
	ProviderReference string
	CommandID         uuid.UUID `json:",omitzero"`
}

// Command is a capture's (AmountMinor, 0 for all that is capturable) or a cancel's update
// argument; ID is the merchant's command's.
type Command struct {
	ID          uuid.UUID
	AmountMinor int64
}

// ReleaseInput fails a payment; a manual payment's cancel names the command that led to it.
type ReleaseInput struct {
	OperationID uuid.UUID
	FailureCode string
	CommandID   uuid.UUID `json:",omitzero"`
}

// Settlement is the `settlement` signal's payload (docs/reconciliation.md shows operators how to send it).
type Settlement struct {
	Outcome           string `json:"outcome"` // "charged" or "not_charged"
	ProviderReference string `json:"provider_reference,omitempty"`
	Note              string `json:"note,omitempty"`
	// AmountMinor is the amount the bank's settlement file lists as moved (minor units; 0: not
	// said). A manual payment's workflow refuses a charged settlement whose amount is not the
	// capture it sent: the bank then moved other money than kasa asked it to.
	AmountMinor int64 `json:"amount_minor,omitempty"`
	// OperationID, when set, is the payment's or refund's id the settlement is for: a key reused
	// after its record expired names a new payment in the same workflow id.
	OperationID uuid.UUID `json:"operation_id,omitzero"`
}

// Settlement outcomes.
const (
	OutcomeCharged    = "charged"
	OutcomeNotCharged = "not_charged"
)

// InputFor is the workflow input of a payment; the API and the sweeper build it the same way, so
// whichever starts the workflow, it runs the same operation. It names no charge policy: the
// worker's governs (docs/deployment.md, "Money settings").
func InputFor(p payment.Payment) PaymentInput {
	return PaymentInput{
		OperationID: p.ID, MerchantID: p.MerchantID, AccountID: p.AccountID, AmountMinor: p.AmountMinor,
		Currency: p.Currency, LocalSteps: true, Revision: CurrentRevision,
		CaptureManual: p.CaptureManual, CaptureBefore: p.CaptureBefore, Invoice: p.InvoiceID,
	}
}

// WithPolicy is in with the policy's fields set: the workflow then asks no worker for one.
func (in PaymentInput) WithPolicy(c ChargePolicy) PaymentInput {
	in.Capability, in.ChargeBudget, in.ChargeTimeout, in.BookingWindow = c.Capability, c.Budget, c.Timeout, c.BookingWindow
	return in
}

// Refund names, recorded in refund workflow histories: never rename them. A refund takes the
// same signals, update, query and search attributes as a payment.
const (
	WorkflowRefund = "RefundWorkflow"

	ActivityHoldRefund = "HoldRefund"
	// ActivityHoldRefundForRun is HoldRefund for refunds of Revision 2 on: it refuses a refund
	// another run already decided.
	ActivityHoldRefundForRun  = "HoldRefundForRun"
	ActivitySendRefund        = "SendRefund"
	ActivityInquireRefund     = "InquireRefund"
	ActivityPostRefund        = "PostRefund"
	ActivityReleaseRefund     = "ReleaseRefund"
	ActivityMarkRefundUnknown = "MarkRefundUnknown"
	ActivityFlagRefundStuck   = "FlagRefundStuck"
	ActivityReadRefundStatus  = "ReadRefundStatus"
)

// RefundWorkflowID is `refund/<merchant id>/<idempotency key>`: a refund's keys are a key space
// of their own, apart from the merchant's payment keys. A key too long for it is shortened as a
// payment's is.
func RefundWorkflowID(merchantID uuid.UUID, key string) string {
	return workflowID("refund/", merchantID, key)
}

// RefundInput is everything the refund workflow needs, recorded in its history. The charge
// policy fields mean what they mean in PaymentInput, for the bank's refund call.
type RefundInput struct {
	OperationID   uuid.UUID // the refund's id: the bank's idempotency key
	PaymentID     uuid.UUID // the refunded payment: its id is the charge's reference at the bank
	MerchantID    uuid.UUID
	AmountMinor   int64
	Currency      string
	Capability    Capability
	ChargeBudget  time.Duration
	ChargeTimeout time.Duration
	BookingWindow time.Duration
	LocalSteps    bool
	// Parked starts a run continued from one that waited, unknown, for a settlement: it goes
	// straight back to waiting, the next inquiry after InquiryWait.
	Parked      bool
	InquiryWait time.Duration
	// Revision means what it means in PaymentInput; 0 (refunds started before it existed) runs
	// the rules of Revision 1.
	Revision int
}

// RefundInputFor is the workflow input of a refund; the API and the sweeper build it the same
// way. Like InputFor it names no charge policy.
func RefundInputFor(r payment.Refund) RefundInput {
	return RefundInput{
		OperationID: r.ID, PaymentID: r.PaymentID, MerchantID: r.MerchantID, AmountMinor: r.AmountMinor,
		Currency: r.Currency, LocalSteps: true, Revision: CurrentRevision,
	}
}

// WithPolicy is in with the policy's fields set: the workflow then asks no worker for one.
func (in RefundInput) WithPolicy(c ChargePolicy) RefundInput {
	in.Capability, in.ChargeBudget, in.ChargeTimeout, in.BookingWindow = c.Capability, c.Budget, c.Timeout, c.BookingWindow
	return in
}

// SendRefundInput is what the bank needs for a refund; OperationID is its idempotency key.
type SendRefundInput struct {
	OperationID uuid.UUID
	PaymentID   uuid.UUID
	AmountMinor int64
	Currency    string
	// Capability and Send mean what they mean in ChargeInput: a repeated attempt of the same send
	// never re-sends to a bank without idempotency.
	Capability Capability
	Send       int
	Resend     Resend `json:",omitzero"`
}

// RefundSendResult is a definite answer from the bank to a refund or a refund inquiry.
type RefundSendResult struct {
	ProviderReference string
	Succeeded         bool
}

// PostRefundInput books a refund the bank made.
type PostRefundInput struct {
	OperationID       uuid.UUID
	ProviderReference string
}

// ReleaseRefundInput fails a refund and releases its hold.
type ReleaseRefundInput struct {
	OperationID uuid.UUID
	FailureCode string
}

// RefundWorkflowResult is the refund workflow's final answer.
type RefundWorkflowResult struct {
	Status            string
	FailureCode       string
	ProviderReference string
}
