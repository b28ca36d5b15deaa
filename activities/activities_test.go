package activities_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/workflows"
)

// attempts counts BeginChargeAttempt and BeginChargeSend like the payments.charge_attempts
// column does.
type attempts struct {
	activities.Store
	n   int
	row payment.Payment // the payment's status, reference and failure as the store has them
}

// The payer and the refunded payment of the fakes' rows: a payment of 100 TRY, a refund of 3000.
var payer, refunded = payment.NewID(), payment.NewID()

func (a *attempts) Payment(_ context.Context, id uuid.UUID) (payment.Payment, error) {
	p := a.row
	p.ID, p.AccountID, p.AmountMinor, p.Currency = id, payer, 100, "TRY"
	if p.Status == "" {
		p.Status = payment.StatusProcessing
	}
	return p, nil
}

func (a *attempts) BeginChargeAttempt(context.Context, uuid.UUID) (int, error) {
	a.n++
	return a.n, nil
}

func (a *attempts) BeginChargeSend(_ context.Context, _ uuid.UUID, send int) (bool, error) {
	if a.n >= send {
		return false, nil
	}
	a.n = send
	return true, nil
}

// bank records what reached it.
type bank struct {
	activities.Provider // a charge never refunds
	sends, inquiries    int
	existing            *provider.Charge // what an inquiry finds
}

func (b *bank) Charge(_ context.Context, key string, _ provider.ChargeRequest) (provider.Charge, error) {
	b.sends++
	return provider.Charge{ID: "ch_" + key[:8], Status: "succeeded"}, nil
}

func (b *bank) Inquire(context.Context, string) (provider.Charge, error) {
	b.inquiries++
	if b.existing == nil {
		return provider.Charge{}, provider.ErrNotFound
	}
	return *b.existing, nil
}

// A charge run again after its worker died (attempt > 1) does only what the capability allows.
func TestChargeRepeatedAttempts(t *testing.T) {
	earlier := &provider.Charge{ID: "ch_earlier", Status: "succeeded"}
	for _, tc := range []struct {
		name           string
		capability     workflows.Capability
		worker         workflows.Capability // the worker's own; the safer of the two governs
		send           int                  // the workflow's send number (0: histories before numbered sends)
		before         int                  // attempts already recorded
		existing       *provider.Charge
		sends, inquire int
		recorded       int // attempts recorded afterwards
		wantRef        string
		wantErrType    string
	}{
		{"none, first attempt sends", workflows.CapabilityNone, "", 0, 0, nil, 1, 0, 1, "ch_", ""},
		{"none, repeat never re-sends", workflows.CapabilityNone, "", 0, 1, nil, 0, 0, 2, "", workflows.ErrTypeAmbiguous},
		{"inquiry, first attempt sends without asking", workflows.CapabilityInquiry, "", 0, 0, nil, 1, 0, 1, "ch_", ""},
		{"inquiry, repeat finds the earlier charge", workflows.CapabilityInquiry, "", 0, 1, earlier, 0, 1, 2, "ch_earlier", ""},
		{"inquiry, repeat re-sends when the bank has none (before numbered sends)", workflows.CapabilityInquiry, "", 0, 1, nil, 1, 1, 2, "ch_", ""},
		{"idempotent re-sends with the same key, nothing recorded", workflows.CapabilityIdempotent, "", 0, 0, nil, 1, 0, 0, "ch_", ""},
		{"history from before local steps: sends, nothing recorded", "", "", 0, 0, nil, 1, 0, 0, "ch_", ""},
		{"none, send 1 goes out", workflows.CapabilityNone, "", 1, 0, nil, 1, 0, 1, "ch_", ""},
		{"none, send 1 repeated never re-sends", workflows.CapabilityNone, "", 1, 1, nil, 0, 0, 1, "", workflows.ErrTypeAmbiguous},
		{"inquiry, send 2 goes out after send 1", workflows.CapabilityInquiry, "", 2, 1, nil, 1, 0, 2, "ch_", ""},
		{"inquiry, send 2 repeated finds the earlier charge", workflows.CapabilityInquiry, "", 2, 2, earlier, 0, 1, 2, "ch_earlier", ""},
		// The earlier attempt may be booked late: only the workflow re-sends, after the window.
		{"inquiry, send 2 repeated does not re-send when the bank has none yet", workflows.CapabilityInquiry, "", 2, 2, nil, 0, 1, 2, "", workflows.ErrTypeAmbiguous},
		// A workflow started under another process's policy: the worker's stricter one governs.
		{"idempotent input on a none worker: send 1 goes out, recorded", workflows.CapabilityIdempotent, workflows.CapabilityNone, 1, 0, nil, 1, 0, 1, "ch_", ""},
		{"idempotent input on a none worker: send 1 repeated never re-sends", workflows.CapabilityIdempotent, workflows.CapabilityNone, 1, 1, nil, 0, 0, 1, "", workflows.ErrTypeAmbiguous},
		{"idempotent input on an inquiry worker: repeat asks first", workflows.CapabilityIdempotent, workflows.CapabilityInquiry, 1, 1, earlier, 0, 1, 1, "ch_earlier", ""},
		{"none input on an idempotent worker stays none", workflows.CapabilityNone, workflows.CapabilityIdempotent, 1, 1, nil, 0, 0, 1, "", workflows.ErrTypeAmbiguous},
		// A none worker makes no automatic re-send, whatever strategy the workflow recorded.
		{"inquiry input on a none worker: send 2 never goes out", workflows.CapabilityInquiry, workflows.CapabilityNone, 2, 1, nil, 0, 0, 1, "", workflows.ErrTypeAmbiguous},
		{"history from before local steps on a none worker: first attempt sends, recorded", "", workflows.CapabilityNone, 0, 0, nil, 1, 0, 1, "ch_", ""},
		{"history from before local steps on a none worker: a retry never re-sends", "", workflows.CapabilityNone, 0, 1, nil, 0, 0, 2, "", workflows.ErrTypeAmbiguous},
		{"history from before local steps on an inquiry worker: a retry asks first", "", workflows.CapabilityInquiry, 0, 1, earlier, 0, 1, 2, "ch_earlier", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, b := &attempts{n: tc.before}, &bank{existing: tc.existing}
			a := &activities.Activities{Store: st, Provider: b, Policy: workflows.ChargePolicy{Capability: tc.worker}}
			res, err := a.Charge(context.Background(), workflows.ChargeInput{
				OperationID: payment.NewID(), AccountID: payer, AmountMinor: 100, Currency: "TRY", Capability: tc.capability, Send: tc.send,
			})
			require.Equal(t, tc.sends, b.sends, "charges sent")
			require.Equal(t, tc.inquire, b.inquiries, "inquiries")
			require.Equal(t, tc.recorded, st.n, "attempts recorded")
			if tc.wantErrType != "" {
				var appErr *temporal.ApplicationError
				require.True(t, errors.As(err, &appErr), "%v", err)
				require.Equal(t, tc.wantErrType, appErr.Type())
				require.True(t, appErr.NonRetryable())
				return
			}
			require.NoError(t, err)
			require.True(t, res.Succeeded)
			require.Contains(t, res.ProviderReference, tc.wantRef)
		})
	}
}

// A send run again after its answer was already written to the payment (the workflow task that
// ran it, and the step after it, was lost with Temporal and runs again) answers with what the
// payment records: never a second send, and never an unknown outcome for an answer kasa has.
func TestSendAnsweredBeforeIsAnsweredFromThePayment(t *testing.T) {
	for _, c := range []workflows.Capability{workflows.CapabilityNone, workflows.CapabilityInquiry, workflows.CapabilityIdempotent} {
		for _, tc := range []struct {
			name        string
			manual      bool
			row         payment.Payment
			wantRef     string
			wantErrType string
		}{
			{"charged", false, payment.Payment{Status: payment.StatusSucceeded, ProviderReference: "ch_earlier"}, "ch_earlier", ""},
			{"authorized", true, payment.Payment{Status: payment.StatusRequiresCapture, ProviderReference: "au_earlier"}, "au_earlier", ""},
			{"declined", false, payment.Payment{Status: payment.StatusFailed, FailureCode: payment.FailureDeclined}, "", workflows.ErrTypeDeclined},
		} {
			t.Run(string(c)+", "+tc.name, func(t *testing.T) {
				st, b := &attempts{n: 1, row: tc.row}, &bank{existing: &provider.Charge{ID: "ch_other", Status: "succeeded"}}
				a := &activities.Activities{Store: st, Provider: b}
				in := workflows.ChargeInput{OperationID: payment.NewID(), AccountID: payer, AmountMinor: 100, Currency: "TRY", Capability: c, Send: 1}
				send := a.Charge
				if tc.manual {
					send = a.Authorize
				}
				res, err := send(context.Background(), in)
				require.Zero(t, b.sends, "nothing sent again")
				require.Zero(t, b.inquiries, "nothing asked: the payment knows")
				if tc.wantErrType != "" {
					var appErr *temporal.ApplicationError
					require.ErrorAs(t, err, &appErr)
					require.Equal(t, tc.wantErrType, appErr.Type())
					return
				}
				require.NoError(t, err)
				require.Equal(t, workflows.ChargeResult{ProviderReference: tc.wantRef, Succeeded: true}, res)
			})
		}
	}
}

// refundAttempts counts BeginRefundAttempt and BeginRefundSend like the refunds.send_attempts
// column does, and records which database steps ran.
type refundAttempts struct {
	activities.Store
	n     int
	steps []string
	row   payment.Refund // the refund's status, failure and reference as recorded (zero: processing)
}

func (a *refundAttempts) Refund(_ context.Context, id uuid.UUID) (payment.Refund, error) {
	r := a.row
	r.ID, r.PaymentID, r.AmountMinor, r.Currency = id, refunded, 3000, "TRY"
	if r.Status == "" {
		r.Status = payment.StatusProcessing
	}
	return r, nil
}

func (a *refundAttempts) BeginRefundAttempt(context.Context, uuid.UUID) (int, error) {
	a.n++
	return a.n, nil
}

func (a *refundAttempts) BeginRefundSend(_ context.Context, _ uuid.UUID, send int) (bool, error) {
	if a.n >= send {
		return false, nil
	}
	a.n = send
	return true, nil
}

func (a *refundAttempts) HoldRefund(context.Context, uuid.UUID) error {
	a.steps = append(a.steps, "hold")
	return payment.ErrInsufficientFunds
}

func (a *refundAttempts) PostRefund(_ context.Context, _ uuid.UUID, ref string) (payment.Refund, error) {
	a.steps = append(a.steps, "post "+ref)
	return payment.Refund{}, nil
}

func (a *refundAttempts) ReleaseRefund(_ context.Context, _ uuid.UUID, code string) (payment.Refund, error) {
	a.steps = append(a.steps, "release "+code)
	return payment.Refund{}, nil
}

func (a *refundAttempts) MarkRefundUnknown(context.Context, uuid.UUID) (payment.Refund, error) {
	a.steps = append(a.steps, "unknown")
	return payment.Refund{}, payment.ErrInconsistent
}

func (a *refundAttempts) FlagRefundStuck(_ context.Context, _ uuid.UUID, reason string) error {
	a.steps = append(a.steps, "flag "+reason)
	return nil
}

// refundBank records the refunds that reached it and the key and references each carried.
type refundBank struct {
	activities.Provider // a refund never charges
	sends, inquiries    int
	key                 string
	req                 provider.RefundRequest
	status              string           // the answer to a send ("" succeeded)
	existing            *provider.Refund // what an inquiry finds
	err                 error            // the send's error
}

func (b *refundBank) Refund(_ context.Context, key string, r provider.RefundRequest) (provider.Refund, error) {
	b.sends++
	b.key, b.req = key, r
	if b.err != nil {
		return provider.Refund{}, b.err
	}
	status := b.status
	if status == "" {
		status = provider.StatusSucceeded
	}
	return provider.Refund{ID: "re_" + key[:8], Reference: r.Reference, Status: status}, nil
}

func (b *refundBank) InquireRefund(context.Context, string) (provider.Refund, error) {
	b.inquiries++
	if b.existing == nil {
		return provider.Refund{}, provider.ErrNotFound
	}
	return *b.existing, nil
}

// A refund's send is protected like a charge's: run again after its worker died, it does only
// what the capability allows, and never sends a second refund to a bank that cannot dedupe it.
func TestSendRefundRepeatedAttempts(t *testing.T) {
	earlier := &provider.Refund{ID: "re_earlier", Status: "succeeded"}
	for _, tc := range []struct {
		name           string
		capability     workflows.Capability
		worker         workflows.Capability // the worker's own; the safer of the two governs
		send, before   int
		existing       *provider.Refund
		sends, inquire int
		recorded       int
		wantRef        string
		wantErrType    string
	}{
		{"none, first send goes out", workflows.CapabilityNone, "", 1, 0, nil, 1, 0, 1, "re_", ""},
		{"none, repeat never re-sends", workflows.CapabilityNone, "", 1, 1, nil, 0, 0, 1, "", workflows.ErrTypeAmbiguous},
		{"none, attempt count before numbered sends", workflows.CapabilityNone, "", 0, 1, nil, 0, 0, 2, "", workflows.ErrTypeAmbiguous},
		{"inquiry, first send goes out without asking", workflows.CapabilityInquiry, "", 1, 0, nil, 1, 0, 1, "re_", ""},
		{"inquiry, repeat finds the earlier refund", workflows.CapabilityInquiry, "", 1, 1, earlier, 0, 1, 1, "re_earlier", ""},
		{"inquiry, repeat does not re-send when the bank has none yet", workflows.CapabilityInquiry, "", 2, 2, nil, 0, 1, 2, "", workflows.ErrTypeAmbiguous},
		{"inquiry, send 2 goes out after send 1", workflows.CapabilityInquiry, "", 2, 1, nil, 1, 0, 2, "re_", ""},
		{"idempotent re-sends with the same key, nothing recorded", workflows.CapabilityIdempotent, "", 1, 0, nil, 1, 0, 0, "re_", ""},
		{"idempotent input on a none worker: repeat never re-sends", workflows.CapabilityIdempotent, workflows.CapabilityNone, 1, 1, nil, 0, 0, 1, "", workflows.ErrTypeAmbiguous},
		{"inquiry input on a none worker: send 2 never goes out", workflows.CapabilityInquiry, workflows.CapabilityNone, 2, 1, nil, 0, 0, 1, "", workflows.ErrTypeAmbiguous},
		{"history from before local steps on a none worker: a retry never re-sends", "", workflows.CapabilityNone, 0, 1, nil, 0, 0, 2, "", workflows.ErrTypeAmbiguous},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, b := &refundAttempts{n: tc.before}, &refundBank{existing: tc.existing}
			a := &activities.Activities{Store: st, Provider: b, Policy: workflows.ChargePolicy{Capability: tc.worker}}
			in := workflows.SendRefundInput{
				OperationID: payment.NewID(), PaymentID: refunded, AmountMinor: 3000, Currency: "TRY", Capability: tc.capability, Send: tc.send,
			}
			res, err := a.SendRefund(context.Background(), in)
			require.Equal(t, tc.sends, b.sends, "refunds sent")
			require.Equal(t, tc.inquire, b.inquiries, "inquiries")
			require.Equal(t, tc.recorded, st.n, "sends recorded")
			if tc.sends > 0 {
				require.Equal(t, in.OperationID.String(), b.key, "the refund id is the bank's idempotency key")
				require.Equal(t, provider.RefundRequest{
					Reference: in.OperationID.String(), ChargeReference: in.PaymentID.String(), AmountMinor: 3000, Currency: "TRY",
				}, b.req)
			}
			if tc.wantErrType != "" {
				var appErr *temporal.ApplicationError
				require.True(t, errors.As(err, &appErr), "%v", err)
				require.Equal(t, tc.wantErrType, appErr.Type())
				require.True(t, appErr.NonRetryable())
				return
			}
			require.NoError(t, err)
			require.True(t, res.Succeeded)
			require.Contains(t, res.ProviderReference, tc.wantRef)
		})
	}
}

// A refund's send repeated after its answer was written (the workflow task that ran the steps,
// lost with Temporal, runs them again) answers with that record, as a payment's does: never
// unknown for a refund that succeeded or was declined.
func TestSendRefundAnsweredBeforeIsAnsweredFromTheRefund(t *testing.T) {
	for _, c := range []workflows.Capability{workflows.CapabilityNone, workflows.CapabilityInquiry, workflows.CapabilityIdempotent} {
		for _, tc := range []struct {
			name        string
			row         payment.Refund
			wantErrType string
		}{
			{"refunded", payment.Refund{Status: payment.StatusSucceeded, ProviderReference: "re_earlier"}, ""},
			{"declined", payment.Refund{Status: payment.StatusFailed, FailureCode: payment.FailureDeclined}, workflows.ErrTypeDeclined},
		} {
			t.Run(string(c)+", "+tc.name, func(t *testing.T) {
				st, b := &refundAttempts{n: 1, row: tc.row}, &refundBank{existing: &provider.Refund{ID: "re_other", Status: "succeeded"}}
				a := &activities.Activities{Store: st, Provider: b}
				res, err := a.SendRefund(context.Background(), workflows.SendRefundInput{
					OperationID: payment.NewID(), PaymentID: refunded, AmountMinor: 3000, Currency: "TRY", Capability: c, Send: 1,
				})
				require.Zero(t, b.sends, "nothing sent again")
				require.Zero(t, b.inquiries, "nothing asked: the refund knows")
				if tc.wantErrType != "" {
					var appErr *temporal.ApplicationError
					require.ErrorAs(t, err, &appErr)
					require.Equal(t, tc.wantErrType, appErr.Type())
					return
				}
				require.NoError(t, err)
				require.Equal(t, workflows.RefundSendResult{ProviderReference: "re_earlier", Succeeded: true}, res)
			})
		}
	}
}

// The bank's answers to a refund are classified as a charge's are: only a decline fails it.
func TestSendRefundClassifiesAnswers(t *testing.T) {
	for _, tc := range []struct {
		name         string
		bank         refundBank
		wantType     string
		nonRetryable bool
	}{
		{"declined", refundBank{status: provider.StatusDeclined}, workflows.ErrTypeDeclined, true},
		{"ambiguous", refundBank{err: provider.ErrAmbiguous}, workflows.ErrTypeAmbiguous, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &activities.Activities{Store: &refundAttempts{}, Provider: &tc.bank}
			_, err := a.SendRefund(context.Background(), workflows.SendRefundInput{
				OperationID: payment.NewID(), PaymentID: refunded, AmountMinor: 3000, Currency: "TRY", Capability: workflows.CapabilityIdempotent, Send: 1,
			})
			var appErr *temporal.ApplicationError
			require.True(t, errors.As(err, &appErr), "%v", err)
			require.Equal(t, tc.wantType, appErr.Type())
			require.Equal(t, tc.nonRetryable, appErr.NonRetryable())
		})
	}
}

// The refund's database steps reach the store with their arguments, classified.
func TestRefundSteps(t *testing.T) {
	st := &refundAttempts{}
	b := &refundBank{existing: &provider.Refund{ID: "re_1", Status: provider.StatusDeclined}}
	a := &activities.Activities{Store: st, Provider: b}
	ctx, id := context.Background(), payment.NewID()

	err := a.HoldRefund(ctx, id)
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "%v", err)
	require.Equal(t, workflows.ErrTypeInsufficientFunds, appErr.Type())

	res, err := a.InquireRefund(ctx, id)
	require.NoError(t, err)
	require.Equal(t, workflows.RefundSendResult{ProviderReference: "re_1"}, res, "a declined refund found by inquiry did not succeed")
	b.existing = nil
	_, err = a.InquireRefund(ctx, id)
	require.True(t, errors.As(err, &appErr), "%v", err)
	require.Equal(t, workflows.ErrTypeNotFound, appErr.Type())

	require.NoError(t, a.PostRefund(ctx, workflows.PostRefundInput{OperationID: id, ProviderReference: "re_1"}))
	require.NoError(t, a.ReleaseRefund(ctx, workflows.ReleaseRefundInput{OperationID: id, FailureCode: "declined"}))
	require.NoError(t, a.FlagRefundStuck(ctx, workflows.FlagInput{OperationID: id, Reason: "why"}))
	err = a.MarkRefundUnknown(ctx, id)
	require.True(t, errors.As(err, &appErr), "%v", err)
	require.Equal(t, workflows.ErrTypeInconsistent, appErr.Type())
	require.Equal(t, []string{"hold", "post re_1", "release declined", "flag why", "unknown"}, st.steps)
}

// What reaches the bank is the row's: a charge or refund whose input differs from its row is a
// contradiction for an operator, and nothing is sent.
func TestSendsFollowTheRow(t *testing.T) {
	b, rb := &bank{}, &refundBank{}
	a := &activities.Activities{Store: &attempts{}, Provider: b}
	_, err := a.Charge(context.Background(), workflows.ChargeInput{
		OperationID: payment.NewID(), AccountID: payer, AmountMinor: 999, Currency: "TRY", Capability: workflows.CapabilityIdempotent, Send: 1,
	})
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "%v", err)
	require.Equal(t, workflows.ErrTypeInconsistent, appErr.Type())
	require.True(t, appErr.NonRetryable())
	require.Zero(t, b.sends)

	a = &activities.Activities{Store: &refundAttempts{}, Provider: rb}
	_, err = a.SendRefund(context.Background(), workflows.SendRefundInput{
		OperationID: payment.NewID(), PaymentID: refunded, AmountMinor: 3000, Currency: "EUR", Capability: workflows.CapabilityIdempotent, Send: 1,
	})
	require.True(t, errors.As(err, &appErr), "%v", err)
	require.Equal(t, workflows.ErrTypeInconsistent, appErr.Type())
	require.Zero(t, rb.sends)
}

// decidedStore answers that another run decided the operation.
type decidedStore struct{ activities.Store }

func (decidedStore) ReserveRun(_ context.Context, id uuid.UUID, runID string) error {
	if runID == "" {
		return errors.New("no run named")
	}
	return &payment.DecidedError{ID: id.String(), Status: payment.StatusSucceeded}
}

// A first step that finds its payment decided by another run tells the workflow so, with the
// status, and is not retried.
func TestReserveOfADecidedPayment(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	a := &activities.Activities{Store: decidedStore{}}
	env.RegisterActivity(a.Reserve)
	_, err := env.ExecuteActivity(a.Reserve, payment.NewID())
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "%v", err)
	require.Equal(t, workflows.ErrTypeAlreadyDecided, appErr.Type())
	require.True(t, appErr.NonRetryable())
	var status string
	require.NoError(t, appErr.Details(&status))
	require.Equal(t, "succeeded", status)
}

// authBank is a bank whose authorization is in one state.
type authBank struct {
	activities.Provider
	state string
}

func (b authBank) InquireAuthorization(context.Context, string) (provider.Authorization, error) {
	return provider.Authorization{ID: "au_1", State: b.state}, nil
}

// An inquiry after a capture or a void reads the authorization's state. A void the bank never
// made because it captured is not a decline: releasing the hold would lose the money the bank
// took, so it is ambiguous, for an operator.
func TestInquiriesReadTheAuthorizationsState(t *testing.T) {
	tests := []struct {
		state     string
		inquire   func(*activities.Activities, context.Context, uuid.UUID) (workflows.ChargeResult, error)
		name      string
		succeeded bool
		errType   string
	}{
		{provider.StateCaptured, (*activities.Activities).InquireCapture, "capture found", true, ""},
		{provider.StateAuthorized, (*activities.Activities).InquireCapture, "capture not yet made", false, workflows.ErrTypeNotFound},
		{provider.StateVoided, (*activities.Activities).InquireCapture, "capture of a voided authorization", false, workflows.ErrTypeDeclined},
		{provider.StateVoided, (*activities.Activities).InquireVoid, "void found", true, ""},
		{provider.StateExpired, (*activities.Activities).InquireVoid, "void of an expired hold", true, ""},
		{provider.StateAuthorized, (*activities.Activities).InquireVoid, "void not yet made", false, workflows.ErrTypeNotFound},
		{provider.StateDeclined, (*activities.Activities).InquireVoid, "void of a declined authorization", false, workflows.ErrTypeDeclined},
		{provider.StateCaptured, (*activities.Activities).InquireVoid, "void of a captured authorization", false, workflows.ErrTypeCapturedAtBank},
		{provider.StateExpired, (*activities.Activities).InquireCapture, "capture of an expired hold", false, workflows.ErrTypeDeclined},
		{provider.StateDeclined, (*activities.Activities).InquireCapture, "capture of a declined authorization", false, workflows.ErrTypeDeclined},
		// A state kasa cannot read says nothing of the capture or the void.
		{"", (*activities.Activities).InquireCapture, "capture, no state", false, workflows.ErrTypeAmbiguous},
		{"capture_pending", (*activities.Activities).InquireCapture, "capture, an unknown state", false, workflows.ErrTypeAmbiguous},
		{"", (*activities.Activities).InquireVoid, "void, no state", false, workflows.ErrTypeAmbiguous},
		{"capture_pending", (*activities.Activities).InquireVoid, "void, an unknown state", false, workflows.ErrTypeAmbiguous},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &activities.Activities{Provider: authBank{state: tt.state}}
			res, err := tt.inquire(a, context.Background(), payment.NewID())
			require.Equal(t, tt.succeeded, res.Succeeded)
			if tt.errType == "" {
				require.NoError(t, err)
				return
			}
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			require.Equal(t, tt.errType, appErr.Type())
		})
	}
}

// refusedVoids is a bank that refuses every void, its authorization in state (or its inquiry
// failing with err).
type refusedVoids struct {
	activities.Provider
	state string
	err   error
}

func (refusedVoids) Void(context.Context, string, string) (provider.VoidResult, error) {
	return provider.VoidResult{ID: "vo_1", AuthorizationID: "au_1", Status: provider.StatusDeclined}, nil
}

func (b refusedVoids) InquireAuthorization(context.Context, string) (provider.Authorization, error) {
	return provider.Authorization{ID: "au_1", State: b.state}, b.err
}

// A void the bank refuses is asked after: the authorization found captured is the bank's
// definite answer that the money moved (the workflow holds it for an operator); refused for any
// other reason, or when the bank cannot be asked, it stays ambiguous.
func TestRefusedVoidAsksWhetherTheBankCaptured(t *testing.T) {
	for _, tt := range []struct {
		name    string
		bank    refusedVoids
		errType string
	}{
		{"captured", refusedVoids{state: provider.StateCaptured}, workflows.ErrTypeCapturedAtBank},
		{"still authorized", refusedVoids{state: provider.StateAuthorized}, workflows.ErrTypeAmbiguous},
		{"cannot be asked", refusedVoids{err: errors.New("HTTP 501")}, workflows.ErrTypeAmbiguous},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := &activities.Activities{Provider: tt.bank, Policy: workflows.ChargePolicy{Capability: workflows.CapabilityIdempotent}}
			_, err := a.VoidAuthorization(context.Background(), workflows.BankCallInput{OperationID: payment.NewID(), AuthorizationRef: "au_1", Send: 1})
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			require.Equal(t, tt.errType, appErr.Type())
		})
	}
}

// lostCaptures is a bank whose captures and voids get no answer.
type lostCaptures struct {
	activities.Provider
	captures, voids *int
}

func (b lostCaptures) Capture(context.Context, string, string, int64) (provider.CaptureResult, error) {
	*b.captures++
	return provider.CaptureResult{}, provider.ErrAmbiguous
}

func (b lostCaptures) Void(context.Context, string, string) (provider.VoidResult, error) {
	*b.voids++
	return provider.VoidResult{}, provider.ErrAmbiguous
}

// A capture or void runs as a regular activity that Temporal retries as its payment's recorded
// policy allows (here three attempts), and the workflow sends it again (Send 2) only after an
// inquiry found nothing. The stricter policy governs: a worker whose own bank is not idempotent
// takes no retry, and one whose bank cannot be asked (none) takes no second send.
func TestCaptureAndVoidSendsFollowTheStricterPolicy(t *testing.T) {
	for _, tt := range []struct {
		worker      workflows.Capability
		send, sends int
	}{
		{workflows.CapabilityIdempotent, 1, 3}, {workflows.CapabilityInquiry, 1, 1}, {workflows.CapabilityNone, 1, 1},
		{workflows.CapabilityIdempotent, 2, 3}, {workflows.CapabilityInquiry, 2, 1}, {workflows.CapabilityNone, 2, 0}, {"", 2, 0},
	} {
		for _, name := range []string{workflows.ActivityCaptureAuthorization, workflows.ActivityVoidAuthorization} {
			t.Run(fmt.Sprintf("%s/send %d/%s", tt.worker, tt.send, name), func(t *testing.T) {
				var suite testsuite.WorkflowTestSuite
				env := suite.NewTestWorkflowEnvironment()
				var captures, voids int
				a := &activities.Activities{Provider: lostCaptures{captures: &captures, voids: &voids},
					Policy: workflows.ChargePolicy{Capability: tt.worker}}
				env.RegisterActivityWithOptions(a.CaptureAuthorization, activity.RegisterOptions{Name: workflows.ActivityCaptureAuthorization})
				env.RegisterActivityWithOptions(a.VoidAuthorization, activity.RegisterOptions{Name: workflows.ActivityVoidAuthorization})
				env.RegisterWorkflowWithOptions(func(ctx workflow.Context) error {
					ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
						RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 3}})
					in := workflows.BankCallInput{OperationID: payment.NewID(), AuthorizationRef: "au_1", AmountMinor: 100, Send: tt.send}
					return workflow.ExecuteActivity(ctx, name, in).Get(ctx, nil)
				}, workflow.RegisterOptions{Name: "bankCall"})
				env.ExecuteWorkflow("bankCall")
				var appErr *temporal.ApplicationError
				require.ErrorAs(t, env.GetWorkflowError(), &appErr)
				require.Equal(t, workflows.ErrTypeAmbiguous, appErr.Type(), "an unanswered call stays ambiguous")
				require.Equal(t, tt.sends, captures+voids, "sends to the bank")
			})
		}
	}
}

// The workflow re-sends after the booking window it recorded; a worker whose own window is
// longer (the deployment's setting grew since) holds the re-send back until its window has
// passed since the earlier send ended, as the stricter policy governs: the send is ambiguous.
func TestResendWaitsForTheWorkersBookingWindow(t *testing.T) {
	worker := workflows.ChargePolicy{Capability: workflows.CapabilityInquiry, BookingWindow: 5 * time.Minute}
	for _, tc := range []struct {
		name   string
		resend workflows.Resend
		sent   bool
	}{
		{"inside the worker's window", workflows.Resend{PreviousEnded: time.Now().Add(-40 * time.Second), Waited: 30 * time.Second}, false},
		{"past the worker's window", workflows.Resend{PreviousEnded: time.Now().Add(-6 * time.Minute), Waited: 30 * time.Second}, true},
		{"the workflow waited the worker's window", workflows.Resend{PreviousEnded: time.Now(), Waited: 5 * time.Minute}, true},
		// The run's clock (Temporal's) stamped PreviousEnded; this worker's runs minutes ahead of it.
		{"inside the worker's window by the run's clock, this worker's clock ahead", workflows.Resend{
			PreviousEnded: time.Now().Add(-6 * time.Minute), Waited: 30 * time.Second, Since: 40 * time.Second}, false},
		{"past the worker's window by the run's clock, this worker's clock behind", workflows.Resend{
			PreviousEnded: time.Now().Add(time.Minute), Waited: 30 * time.Second, Since: 6 * time.Minute}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, b := &attempts{n: 1}, &bank{}
			_, err := (&activities.Activities{Store: st, Provider: b, Policy: worker}).Charge(context.Background(), workflows.ChargeInput{
				OperationID: payment.NewID(), AccountID: payer, AmountMinor: 100, Currency: "TRY",
				Capability: workflows.CapabilityInquiry, Send: 2, Resend: tc.resend,
			})
			rs, rb := &refundAttempts{n: 1}, &refundBank{}
			_, rerr := (&activities.Activities{Store: rs, Provider: rb, Policy: worker}).SendRefund(context.Background(), workflows.SendRefundInput{
				OperationID: payment.NewID(), PaymentID: refunded, AmountMinor: 3000, Currency: "TRY",
				Capability: workflows.CapabilityInquiry, Send: 2, Resend: tc.resend,
			})
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestActivityEnvironment()
			var captures, voids int
			a := &activities.Activities{Provider: lostCaptures{captures: &captures, voids: &voids}, Policy: worker}
			env.RegisterActivityWithOptions(a.CaptureAuthorization, activity.RegisterOptions{Name: workflows.ActivityCaptureAuthorization})
			_, cerr := env.ExecuteActivity(workflows.ActivityCaptureAuthorization, workflows.BankCallInput{
				OperationID: payment.NewID(), AuthorizationRef: "au_1", AmountMinor: 100, Send: 2, Resend: tc.resend,
			})
			if tc.sent { // (this bank's captures go unanswered)
				require.NoError(t, err)
				require.NoError(t, rerr)
				require.Equal(t, []int{1, 1, 1}, []int{b.sends, rb.sends, captures})
				return
			}
			for _, err := range []error{err, rerr, cerr} {
				var appErr *temporal.ApplicationError
				require.ErrorAs(t, err, &appErr)
				require.Equal(t, workflows.ErrTypeAmbiguous, appErr.Type())
			}
			require.Equal(t, []int{0, 0, 0}, []int{b.sends, rb.sends, captures}, "nothing re-sent")
		})
	}
}

// moneyBank finds every operation succeeded, naming amount and currency.
type moneyBank struct {
	activities.Provider
	amount   int64
	currency string
}

func (b moneyBank) Inquire(_ context.Context, ref string) (provider.Charge, error) {
	return provider.Charge{ID: "ch_1", Reference: ref, Status: provider.StatusSucceeded, AmountMinor: b.amount, Currency: b.currency}, nil
}

func (b moneyBank) InquireRefund(_ context.Context, ref string) (provider.Refund, error) {
	return provider.Refund{ID: "re_1", Reference: ref, Status: provider.StatusSucceeded, AmountMinor: b.amount, Currency: b.currency}, nil
}

func (b moneyBank) InquireAuthorization(_ context.Context, ref string) (provider.Authorization, error) {
	return provider.Authorization{ID: "au_1", Reference: ref, Status: provider.StatusSucceeded, State: provider.StateAuthorized,
		AmountMinor: b.amount, Currency: b.currency}, nil
}

// rows is a store with the fakes' payment and refund.
type rows struct{ *attempts }

func (rows) Refund(ctx context.Context, id uuid.UUID) (payment.Refund, error) {
	return (&refundAttempts{}).Refund(ctx, id)
}

// An inquiry names only the reference: an answer naming other money than the operation's (the
// payment's 100 TRY, the refund's 3000 TRY) is ambiguous, never posted as the operation's.
func TestInquiryNamingOtherMoneyIsAmbiguous(t *testing.T) {
	inquiries := []struct {
		name    string
		want    int64 // the operation's amount
		inquire func(a *activities.Activities) (bool, error)
	}{
		{"charge", 100, func(a *activities.Activities) (bool, error) {
			r, err := a.InquireCharge(context.Background(), payment.NewID())
			return r.Succeeded, err
		}},
		{"authorization", 100, func(a *activities.Activities) (bool, error) {
			r, err := a.InquireAuthorization(context.Background(), payment.NewID())
			return r.Succeeded, err
		}},
		{"refund", 3000, func(a *activities.Activities) (bool, error) {
			r, err := a.InquireRefund(context.Background(), payment.NewID())
			return r.Succeeded, err
		}},
	}
	for _, tc := range []struct {
		name      string
		amount    func(want int64) int64
		currency  string
		ambiguous bool
	}{
		{"the operation's money", func(w int64) int64 { return w }, "TRY", false},
		{"no money named", func(int64) int64 { return 0 }, "", false},
		{"another amount", func(w int64) int64 { return w + 1 }, "TRY", true},
		{"another currency", func(w int64) int64 { return w }, "EUR", true},
	} {
		for _, in := range inquiries {
			t.Run(tc.name+"/"+in.name, func(t *testing.T) {
				a := &activities.Activities{Store: rows{&attempts{}}, Provider: moneyBank{amount: tc.amount(in.want), currency: tc.currency}}
				ok, err := in.inquire(a)
				if tc.ambiguous {
					var appErr *temporal.ApplicationError
					require.ErrorAs(t, err, &appErr)
					require.Equal(t, workflows.ErrTypeAmbiguous, appErr.Type())
					return
				}
				require.NoError(t, err)
				require.True(t, ok)
			})
		}
	}
}

// failingStore fails the read of the operation, or the record of its send, as a database that is
// down does.
type failingStore struct {
	attempts
	refunds      refundAttempts
	read, record bool
}

var errDown = errors.New("connection refused")

func (f *failingStore) Payment(ctx context.Context, id uuid.UUID) (payment.Payment, error) {
	if f.read {
		return payment.Payment{}, errDown
	}
	return f.attempts.Payment(ctx, id)
}

func (f *failingStore) BeginChargeSend(ctx context.Context, id uuid.UUID, send int) (bool, error) {
	if f.record {
		return false, errDown
	}
	return f.attempts.BeginChargeSend(ctx, id, send)
}

func (f *failingStore) Refund(ctx context.Context, id uuid.UUID) (payment.Refund, error) {
	if f.read {
		return payment.Refund{}, errDown
	}
	return f.refunds.Refund(ctx, id)
}

func (f *failingStore) BeginRefundSend(ctx context.Context, id uuid.UUID, send int) (bool, error) {
	if f.record {
		return false, errDown
	}
	return f.refunds.BeginRefundSend(ctx, id, send)
}

// A send whose operation cannot be read, or whose send cannot be recorded, fails before anything
// goes to the bank, and says so (NotSent, retryable): the workflow may send it again, where any
// other failure of a send to a bank without idempotency is ambiguous.
func TestSendThatFailsBeforeGoingOutSaysNotSent(t *testing.T) {
	for _, c := range []workflows.Capability{workflows.CapabilityNone, workflows.CapabilityInquiry, workflows.CapabilityIdempotent} {
		for _, fail := range []string{"read", "record"} {
			if fail == "record" && c == workflows.CapabilityIdempotent {
				continue // an idempotent bank's sends are not recorded
			}
			t.Run(string(c)+", "+fail, func(t *testing.T) {
				st := &failingStore{read: fail == "read", record: fail == "record"}
				b, rb := &bank{}, &refundBank{}
				a := &activities.Activities{Store: st, Provider: b}
				_, err := a.Charge(context.Background(), workflows.ChargeInput{
					OperationID: payment.NewID(), AccountID: payer, AmountMinor: 100, Currency: "TRY", Capability: c, Send: 1,
				})
				requireNotSent(t, err)
				a.Provider = rb
				_, err = a.SendRefund(context.Background(), workflows.SendRefundInput{
					OperationID: payment.NewID(), PaymentID: refunded, AmountMinor: 3000, Currency: "TRY", Capability: c, Send: 1,
				})
				requireNotSent(t, err)
				require.Zero(t, b.sends+rb.sends, "nothing reached the bank")
			})
		}
	}
}

func requireNotSent(t *testing.T, err error) {
	t.Helper()
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "%v", err)
	require.Equal(t, workflows.ErrTypeNotSent, appErr.Type())
	require.False(t, appErr.NonRetryable(), "an idempotent send is retried within its budget")
	require.ErrorIs(t, err, errDown)
}

// finalRow is a store whose payment another run decided: marking it unknown is refused.
type finalRow struct {
	attempts
}

func (f *finalRow) MarkUnknown(context.Context, uuid.UUID) (payment.Payment, error) {
	return payment.Payment{}, fmt.Errorf("%w: payment is %s, cannot become unknown", payment.ErrInconsistent, f.row.Status)
}

// Marking unknown a payment found final says which status it found, for the workflow to end with
// it (Revision 9 on); one found in no final status is a plain inconsistency, for an operator.
func TestMarkUnknownOfAFinalPaymentNamesItsStatus(t *testing.T) {
	for _, tc := range []struct {
		found payment.Status
		want  string // the details' status; "" none
	}{
		{payment.StatusSucceeded, "succeeded"},
		{payment.StatusFailed, "failed"},
		{payment.StatusRequiresCapture, ""},
	} {
		t.Run(string(tc.found), func(t *testing.T) {
			st := &finalRow{attempts{row: payment.Payment{Status: tc.found}}}
			err := (&activities.Activities{Store: st}).MarkUnknown(context.Background(), payment.NewID())
			var appErr *temporal.ApplicationError
			require.True(t, errors.As(err, &appErr), "%v", err)
			require.Equal(t, workflows.ErrTypeInconsistent, appErr.Type())
			var status string
			if tc.want == "" {
				require.Error(t, appErr.Details(&status), "no status named")
				return
			}
			require.NoError(t, appErr.Details(&status))
			require.Equal(t, tc.want, status)
		})
	}
}
