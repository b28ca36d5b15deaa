package workflows_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/worker"
	"github.com/kasa-pay/kasa/workflows"
)

var (
	opID       = uuid.MustParse("0b6f3c1e-6a55-4a43-9a39-3f1f4f8d2a01")
	merchantID = uuid.MustParse("5d0c2f6e-2b0f-4a8e-8f0c-9a3e7b1c4d02")
	accountID  = uuid.MustParse("9e8d7c6b-5a49-4382-a716-b5c4d3e2f103")
)

const (
	statusProcessing = "processing"
	statusSucceeded  = "succeeded"
	statusFailed     = "failed"
	statusUnknown    = "unknown"
)

// errUnexpected is what every unmocked stub activity returns. It is non-retryable so that an
// unexpected call fails fast instead of being retried forever by the step retry policy.
func errUnexpected(name string) error {
	return temporal.NewNonRetryableApplicationError("unexpected call to unmocked activity "+name, "UnexpectedCall", nil)
}

// stub and stubResult are unmocked activities, registered under name: the tests mock them by
// name, and a call that no mock catches fails fast.
func stub[In any](name string) func(context.Context, In) error {
	return func(context.Context, In) error { return errUnexpected(name) }
}

func stubResult[In, Out any](name string) func(context.Context, In) (Out, error) {
	return func(context.Context, In) (Out, error) {
		var none Out
		return none, errUnexpected(name)
	}
}

// stubActivities are the payment's and the refund's activities by name, with the exact
// signatures of activities.Activities.
var stubActivities = map[string]any{
	workflows.ActivityReserveFunds:             stub[uuid.UUID](workflows.ActivityReserveFunds),
	workflows.ActivityReserve:                  stub[uuid.UUID](workflows.ActivityReserve),
	workflows.ActivityCharge:                   stubResult[workflows.ChargeInput, workflows.ChargeResult](workflows.ActivityCharge),
	workflows.ActivityInquire:                  stubResult[uuid.UUID, workflows.ChargeResult](workflows.ActivityInquire),
	workflows.ActivityFinalize:                 stub[workflows.FinalizeInput](workflows.ActivityFinalize),
	workflows.ActivityRelease:                  stub[workflows.ReleaseInput](workflows.ActivityRelease),
	workflows.ActivityMarkUnknown:              stub[uuid.UUID](workflows.ActivityMarkUnknown),
	workflows.ActivityFlagStuck:                stub[workflows.FlagInput](workflows.ActivityFlagStuck),
	workflows.ActivityMarkAuthorizationUnknown: stub[uuid.UUID](workflows.ActivityMarkAuthorizationUnknown),
	workflows.ActivityReadPaymentStatus:        stubResult[uuid.UUID, workflows.StatusRead](workflows.ActivityReadPaymentStatus),
	workflows.ActivityChargePolicy: func(context.Context) (workflows.ChargePolicy, error) {
		return workflows.ChargePolicy{}, errUnexpected(workflows.ActivityChargePolicy)
	},

	workflows.ActivityAuthorize:            stubResult[workflows.ChargeInput, workflows.ChargeResult](workflows.ActivityAuthorize),
	workflows.ActivityInquireAuthorization: stubResult[uuid.UUID, workflows.ChargeResult](workflows.ActivityInquireAuthorization),
	workflows.ActivityAuthorized:           stubResult[workflows.FinalizeInput, workflows.AuthorizedResult](workflows.ActivityAuthorized),
	workflows.ActivityCaptureAuthorization: stubResult[workflows.BankCallInput, workflows.ChargeResult](workflows.ActivityCaptureAuthorization),
	workflows.ActivityInquireCapture:       stubResult[uuid.UUID, workflows.ChargeResult](workflows.ActivityInquireCapture),
	workflows.ActivityCaptured:             stub[workflows.CapturedInput](workflows.ActivityCaptured),
	workflows.ActivityVoidAuthorization:    stubResult[workflows.BankCallInput, workflows.ChargeResult](workflows.ActivityVoidAuthorization),
	workflows.ActivityInquireVoid:          stubResult[uuid.UUID, workflows.ChargeResult](workflows.ActivityInquireVoid),
	workflows.ActivityCanceled:             stub[workflows.ReleaseInput](workflows.ActivityCanceled),

	workflows.ActivityHoldRefund:        stub[uuid.UUID](workflows.ActivityHoldRefund),
	workflows.ActivityHoldRefundForRun:  stub[uuid.UUID](workflows.ActivityHoldRefundForRun),
	workflows.ActivitySendRefund:        stubResult[workflows.SendRefundInput, workflows.RefundSendResult](workflows.ActivitySendRefund),
	workflows.ActivityInquireRefund:     stubResult[uuid.UUID, workflows.RefundSendResult](workflows.ActivityInquireRefund),
	workflows.ActivityPostRefund:        stub[workflows.PostRefundInput](workflows.ActivityPostRefund),
	workflows.ActivityReleaseRefund:     stub[workflows.ReleaseRefundInput](workflows.ActivityReleaseRefund),
	workflows.ActivityMarkRefundUnknown: stub[uuid.UUID](workflows.ActivityMarkRefundUnknown),
	workflows.ActivityFlagRefundStuck:   stub[workflows.FlagInput](workflows.ActivityFlagRefundStuck),
	workflows.ActivityReadRefundStatus:  stubResult[uuid.UUID, workflows.StatusRead](workflows.ActivityReadRefundStatus),
}

// The stubs must keep the real activities' signatures, or the mocks would test a different
// contract than the worker registers.
func TestStubActivitySignaturesMatchActivities(t *testing.T) {
	real := registered{}
	worker.Register(real, &activities.Activities{})
	require.Len(t, stubActivities, len(real))
	for name, fn := range real {
		require.Contains(t, stubActivities, name)
		require.Equal(t, reflect.TypeOf(fn), reflect.TypeOf(stubActivities[name]), "signature of %s", name)
	}
}

// registered records the activities a worker registers, by name.
type registered map[string]any

func (registered) RegisterWorkflowWithOptions(any, workflow.RegisterOptions) {}
func (r registered) RegisterActivityWithOptions(a any, o activity.RegisterOptions) {
	r[o.Name] = a
}

// Activity errors as the real activities classify them.
func ambiguous() error {
	return temporal.NewApplicationError("provider timed out", workflows.ErrTypeAmbiguous)
}

func declined() error {
	return temporal.NewNonRetryableApplicationError("charge declined", workflows.ErrTypeDeclined, nil, "ch_declined")
}

func rejected() error {
	return temporal.NewNonRetryableApplicationError("400 Bad Request", workflows.ErrTypeRejected, nil)
}

func notFound() error {
	return temporal.NewNonRetryableApplicationError("no such charge", workflows.ErrTypeNotFound, nil)
}

func insufficientFunds() error {
	return temporal.NewNonRetryableApplicationError("insufficient funds", workflows.ErrTypeInsufficientFunds, nil)
}

func charged(ref string) workflows.ChargeResult {
	return workflows.ChargeResult{ProviderReference: ref, Succeeded: true}
}

func paymentInput(c workflows.Capability) workflows.PaymentInput {
	return workflows.PaymentInput{
		OperationID: opID, MerchantID: merchantID, AccountID: accountID,
		AmountMinor: 12_345, Currency: "EUR", Capability: c,
	}
}

// wantChargeInput is what the workflow sends the charge: with local steps it names the
// capability, so a repeated attempt knows what it may do.
func wantChargeInput(in workflows.PaymentInput) workflows.ChargeInput {
	want := workflows.ChargeInput{OperationID: opID, AccountID: accountID, AmountMinor: 12_345, Currency: "EUR"}
	if in.LocalSteps {
		want.Capability = in.Capability
	}
	if in.Revision >= 1 {
		want.Send = 1
	}
	return want
}

// harness is one test workflow environment with the payment and refund workflows and stub activities
// registered, recording every PaymentStatus upsert and the (test-clock) time of every activity call.
type harness struct {
	t   *testing.T
	env *testsuite.TestWorkflowEnvironment

	start time.Time // the test clock when the workflow started

	mu       sync.Mutex
	statuses []string               // PaymentStatus values upserted, in order
	calledAt map[string][]time.Time // activity name -> test-clock times of its calls
	observed []string               // notes recorded by delayed callbacks, checked after the run
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	// The SDK logs every activity failure and timer; keep it out of the output unless the test fails.
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("workflow log:\n%s", logs.String())
		}
	})
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	env := suite.NewTestWorkflowEnvironment()
	// No SetStartTime: the SDK checks a local activity's deadline, computed on the test clock,
	// against the wall clock, so a test clock in the past times every retried local step out.
	env.SetTestTimeout(30 * time.Second) // wall clock; a stuck workflow fails instead of hanging
	env.RegisterWorkflowWithOptions(workflows.PaymentWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowPayment})
	env.RegisterWorkflowWithOptions(workflows.RefundWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowRefund})
	for name, fn := range stubActivities {
		env.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
	// What the Starter sets when it starts the workflow.
	require.NoError(t, env.SetTypedSearchAttributesOnStart(temporal.NewSearchAttributes(
		workflows.SearchPaymentStatus.ValueSet(statusProcessing),
		workflows.SearchMerchantID.ValueSet(merchantID.String()),
	)))
	h := &harness{t: t, env: env, start: env.Now(), calledAt: map[string][]time.Time{}}
	env.OnUpsertTypedSearchAttributes(mock.Anything).Run(func(args mock.Arguments) {
		sa, ok := args.Get(0).(temporal.SearchAttributes)
		if !ok {
			h.note("upsert with unexpected argument type %T", args.Get(0))
			return
		}
		v, ok := sa.GetKeyword(workflows.SearchPaymentStatus)
		if !ok {
			h.note("upsert without PaymentStatus")
			return
		}
		h.mu.Lock()
		h.statuses = append(h.statuses, v)
		h.mu.Unlock()
	}).Return()
	return h
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (h *harness) note(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.observed = append(h.observed, fmt.Sprintf(format, args...))
}

// on mocks an activity by name for any input and records the time of every call.
func (h *harness) on(name string) *testsuite.MockCallWrapper {
	return h.env.OnActivity(name, mock.Anything, mock.Anything).Run(func(mock.Arguments) {
		now := h.env.Now()
		h.mu.Lock()
		h.calledAt[name] = append(h.calledAt[name], now)
		h.mu.Unlock()
	})
}

// fallbacks mocks the database steps as succeeding, and the provider calls as unexpected, for
// whatever a case did not mock itself (registered last, so the case's own mocks win).
func (h *harness) fallbacks() {
	h.on(workflows.ActivityReserveFunds).Return(nil)
	h.on(workflows.ActivityReserve).Return(nil)
	h.on(workflows.ActivityFinalize).Return(nil)
	h.on(workflows.ActivityRelease).Return(nil)
	h.on(workflows.ActivityMarkUnknown).Return(nil)
	h.on(workflows.ActivityMarkAuthorizationUnknown).Return(nil)
	h.on(workflows.ActivityFlagStuck).Return(nil)
	h.on(workflows.ActivityReadPaymentStatus).Return(workflows.StatusRead{Status: statusUnknown}, nil) // parked, as the run left it
	h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, errUnexpected(workflows.ActivityCharge))
	h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, errUnexpected(workflows.ActivityInquire))
}

// signalAt sends a settlement signal after d on the test clock.
func (h *harness) signalAt(d time.Duration, s any) {
	h.env.RegisterDelayedCallback(func() { h.env.SignalWorkflow(workflows.SignalSettlement, s) }, d)
}

// expectWaitingAt records, at d on the test clock, whether the workflow is still running with
// status unknown; run checks it afterwards.
func (h *harness) expectWaitingAt(d time.Duration) {
	h.env.RegisterDelayedCallback(func() {
		if h.env.IsWorkflowCompleted() {
			h.note("at %v: workflow already completed, want it waiting for a settlement", d)
			return
		}
		if got := h.queryStatus(); got != statusUnknown {
			h.note("at %v: status query = %q, want %q", d, got, statusUnknown)
		}
	}, d)
}

func (h *harness) queryStatus() string {
	v, err := h.env.QueryWorkflow(workflows.QueryStatus)
	if err != nil {
		return "query error: " + err.Error()
	}
	var s string
	if err := v.Get(&s); err != nil {
		return "decode error: " + err.Error()
	}
	return s
}

// run executes the payment workflow to completion and returns its result.
func (h *harness) run(in workflows.PaymentInput) workflows.PaymentResult {
	h.t.Helper()
	h.fallbacks()
	return complete[workflows.PaymentResult](h, workflows.WorkflowPayment, in)
}

// complete executes the workflow name to completion, without an error and with every delayed
// callback's expectation met, and returns its result.
func complete[R any](h *harness, name string, in any) R {
	h.t.Helper()
	h.env.ExecuteWorkflow(name, in)
	require.True(h.t, h.env.IsWorkflowCompleted(), "workflow did not complete")
	require.NoError(h.t, h.env.GetWorkflowError())
	var res R
	require.NoError(h.t, h.env.GetWorkflowResult(&res))
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Empty(h.t, h.observed)
	return res
}

// continuedAsNew executes the workflow name until it continues as a new run of itself and
// returns the new run's input.
func continuedAsNew[In any](h *harness, name string, in In) In {
	h.t.Helper()
	h.env.ExecuteWorkflow(name, in)
	require.True(h.t, h.env.IsWorkflowCompleted())
	var can *workflow.ContinueAsNewError
	require.ErrorAs(h.t, h.env.GetWorkflowError(), &can)
	require.Equal(h.t, name, can.WorkflowType.Name)
	var next In
	require.NoError(h.t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	return next
}

// retryAt sends the operator's retry signal after d; the workflow must still be running.
func (h *harness) retryAt(d time.Duration) {
	h.env.RegisterDelayedCallback(func() {
		if h.env.IsWorkflowCompleted() {
			h.note("completed before the operator's retry")
		}
		h.env.SignalWorkflow(workflows.SignalRetry, nil)
	}, d)
}

func (h *harness) calls(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.calledAt[name])
}

// offsets returns when an activity was called, relative to the workflow start.
func (h *harness) offsets(name string) []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []time.Duration
	for _, at := range h.calledAt[name] {
		out = append(out, at.Sub(h.start))
	}
	return out
}

// workflowCase is one case of a workflow's table-driven tests, for either kind of operation.
type workflowCase[In, Out any] struct {
	name  string
	in    In
	setup func(h *harness)

	want Out
	// Exact number of calls per activity; activities not listed must not be called.
	calls map[string]int
	// PaymentStatus search attribute upserts, in order (the start value is "processing").
	statuses []string
	check    func(t *testing.T, h *harness)
}

type (
	paymentCase = workflowCase[workflows.PaymentInput, workflows.PaymentResult]
	refundCase  = workflowCase[workflows.RefundInput, workflows.RefundWorkflowResult]
)

// opKind is what the case runner needs of one kind of operation: a row, not a copy of the runner.
type opKind[In, Out any] struct {
	run      func(h *harness, in In) Out
	setLocal func(in *In, local bool)
	// inputs are the inputs the called activities must get; outcome reads a result.
	inputs  func(in In) map[string]any
	outcome func(out Out) (status, providerRef, failureCode string)
	// finished is the step that ends a succeeded (ref) or a failed (failure code) operation, and
	// its input.
	succeeded func(ref string) (string, any)
	failed    func(code string) (string, any)
}

var paymentKind = opKind[workflows.PaymentInput, workflows.PaymentResult]{
	run:      (*harness).run,
	setLocal: func(in *workflows.PaymentInput, local bool) { in.LocalSteps = local },
	inputs: func(in workflows.PaymentInput) map[string]any {
		return map[string]any{
			workflows.ActivityReserveFunds: opID, workflows.ActivityReserve: opID, workflows.ActivityCharge: wantChargeInput(in),
			workflows.ActivityInquire: opID, workflows.ActivityMarkUnknown: opID,
		}
	},
	outcome: func(r workflows.PaymentResult) (string, string, string) {
		return r.Status, r.ProviderReference, r.FailureCode
	},
	succeeded: func(ref string) (string, any) {
		return workflows.ActivityFinalize, workflows.FinalizeInput{OperationID: opID, ProviderReference: ref}
	},
	failed: func(code string) (string, any) {
		return workflows.ActivityRelease, workflows.ReleaseInput{OperationID: opID, FailureCode: code}
	},
}

// runCases runs every case with local steps and with regular activities, and checks the effects
// every case promises beside its own checks.
func runCases[In, Out any](t *testing.T, k opKind[In, Out], cases []workflowCase[In, Out]) {
	t.Helper()
	stepKinds(t, func(t *testing.T, local bool) {
		for _, tc := range cases {
			k.setLocal(&tc.in, local)
			t.Run(tc.name, func(t *testing.T) {
				h := newHarness(t)
				if tc.setup != nil {
					tc.setup(h)
				}
				res := k.run(h, tc.in)
				require.Equal(t, tc.want, res)
				status, ref, code := k.outcome(tc.want)
				h.requireEffects(t, tc.calls, k.inputs(tc.in), tc.statuses, status)
				if status == statusSucceeded {
					name, in := k.succeeded(ref)
					h.env.AssertActivityCalled(t, name, mock.Anything, in)
				}
				if status == statusFailed {
					name, in := k.failed(code)
					h.env.AssertActivityCalled(t, name, mock.Anything, in)
				}
				if tc.check != nil {
					tc.check(t, h)
				}
			})
		}
	})
}

// stepKinds runs the cases with local steps (every new workflow) and with regular activities
// (workflows started before LocalSteps existed, still replayed and resumed).
func stepKinds(t *testing.T, run func(t *testing.T, local bool)) {
	t.Helper()
	for _, local := range []bool{true, false} {
		t.Run(map[bool]string{true: "local", false: "regular"}[local], func(t *testing.T) { run(t, local) })
	}
}

// requireEffects checks what every workflow case promises: the exact calls of every activity
// (one not in calls is never called), the input of each called activity that inputs names, the
// PaymentStatus upserts in order, and the status query after completion.
func (h *harness) requireEffects(t *testing.T, calls map[string]int, inputs map[string]any, statuses []string, status string) {
	t.Helper()
	for name := range stubActivities {
		require.Equal(t, calls[name], h.calls(name), "calls to %s (at %v)", name, h.offsets(name))
	}
	for name, in := range inputs {
		if calls[name] > 0 {
			h.env.AssertActivityCalled(t, name, mock.Anything, in)
		}
	}
	h.mu.Lock()
	upserts := append([]string(nil), h.statuses...)
	h.mu.Unlock()
	require.Equal(t, statuses, upserts, "PaymentStatus upserts")
	require.Equal(t, status, h.queryStatus(), "status query after completion")
}

func runPaymentCases(t *testing.T, cases []paymentCase) { t.Helper(); runCases(t, paymentKind, cases) }

func TestPaymentWorkflowDefiniteOutcomes(t *testing.T) {
	runPaymentCases(t, []paymentCase{
		{
			name: "happy path",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(charged("ch_ok"), nil)
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_ok"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityFinalize: 1},
			statuses: []string{statusSucceeded},
		},
		{
			name: "happy path idempotent",
			in:   paymentInput(workflows.CapabilityIdempotent),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(charged("ch_ok"), nil)
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_ok"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityFinalize: 1},
			statuses: []string{statusSucceeded},
		},
		{
			name: "happy path inquiry",
			in:   paymentInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(charged("ch_ok"), nil)
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_ok"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityFinalize: 1},
			statuses: []string{statusSucceeded},
		},
		{
			name: "database outage during reserve is retried",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				h.on(workflows.ActivityReserveFunds).Return(temporal.NewApplicationError("connection refused", "")).Twice()
				h.on(workflows.ActivityCharge).Return(charged("ch_ok"), nil)
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_ok"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 3, workflows.ActivityCharge: 1, workflows.ActivityFinalize: 1},
			statuses: []string{statusSucceeded},
		},
		{
			// Longer than a step's StartToClose (15 s): a database outage delays a payment,
			// it never fails it (local activities stop retrying at ScheduleToClose).
			name: "a database outage longer than a step's timeout is waited out",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				h.on(workflows.ActivityReserveFunds).Return(temporal.NewApplicationError("connection refused", "")).Times(8)
				h.on(workflows.ActivityCharge).Return(charged("ch_ok"), nil)
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_ok"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 9, workflows.ActivityCharge: 1, workflows.ActivityFinalize: 1},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				reserves := h.offsets(workflows.ActivityReserveFunds)
				require.Greater(t, reserves[len(reserves)-1], 20*time.Second)
			},
		},
		{
			name: "insufficient funds",
			in:   paymentInput(workflows.CapabilityIdempotent),
			setup: func(h *harness) {
				h.on(workflows.ActivityReserveFunds).Return(insufficientFunds())
			},
			want:     workflows.PaymentResult{Status: statusFailed, FailureCode: "insufficient_funds"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 1, workflows.ActivityRelease: 1},
			statuses: []string{statusFailed},
		},
		{
			name: "declined",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, declined())
			},
			want:     workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityRelease: 1},
			statuses: []string{statusFailed},
		},
		{
			name: "declined idempotent is not retried",
			in:   paymentInput(workflows.CapabilityIdempotent),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, declined())
			},
			want:     workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityRelease: 1},
			statuses: []string{statusFailed},
		},
		{
			name: "declined inquiry does not inquire",
			in:   paymentInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, declined())
			},
			want:     workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityRelease: 1},
			statuses: []string{statusFailed},
		},
		{
			name: "a rejection recorded before 4xx became ambiguous still fails",
			in:   paymentInput(workflows.CapabilityIdempotent),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, rejected())
			},
			want:     workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityRelease: 1},
			statuses: []string{statusFailed},
		},
	})
}

func TestPaymentWorkflowCapabilityNoneAmbiguous(t *testing.T) {
	ambiguousOnce := func(h *harness) {
		h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
	}
	parkedCalls := func(extra string) map[string]int {
		return map[string]int{
			workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityMarkUnknown: 1, extra: 1,
		}
	}
	runPaymentCases(t, []paymentCase{
		{
			name: "settled as charged",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				ambiguousOnce(h)
				h.expectWaitingAt(time.Hour)
				h.signalAt(2*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_1"})
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_1"},
			calls:    parkedCalls(workflows.ActivityFinalize),
			statuses: []string{statusUnknown, statusSucceeded},
		},
		{
			name: "settled as not charged",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				ambiguousOnce(h)
				h.expectWaitingAt(time.Hour)
				h.signalAt(2*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged, Note: "absent from settlement file"})
			},
			want:     workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			calls:    parkedCalls(workflows.ActivityRelease),
			statuses: []string{statusUnknown, statusFailed},
		},
		{
			name: "malformed outcome is ignored",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				ambiguousOnce(h)
				h.signalAt(time.Hour, workflows.Settlement{Outcome: "maybe", ProviderReference: "ch_bogus"})
				h.expectWaitingAt(90 * time.Minute)
				h.signalAt(2*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_1"})
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_1"},
			calls:    parkedCalls(workflows.ActivityFinalize),
			statuses: []string{statusUnknown, statusSucceeded},
		},
		{
			name: "undecodable payload is dropped",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				ambiguousOnce(h)
				h.signalAt(time.Hour, "charged") // a bare string, not a Settlement object
				h.expectWaitingAt(90 * time.Minute)
				h.signalAt(2*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_1"})
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_1"},
			calls:    parkedCalls(workflows.ActivityFinalize),
			statuses: []string{statusUnknown, statusSucceeded},
		},
		{
			name: "settlement as operator sends it from the UI (JSON field names)",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				ambiguousOnce(h)
				h.signalAt(time.Hour, map[string]string{"outcome": "charged", "provider_reference": "ch_1", "note": "checked by phone"})
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_1"},
			calls:    parkedCalls(workflows.ActivityFinalize),
			statuses: []string{statusUnknown, statusSucceeded},
		},
		{
			name: "charge timeout is ambiguous and not retried",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				// The provider never answered within StartToCloseTimeout.
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{},
					temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_START_TO_CLOSE, nil))
				h.expectWaitingAt(time.Hour)
				h.signalAt(2*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_late"})
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_late"},
			calls:    parkedCalls(workflows.ActivityFinalize),
			statuses: []string{statusUnknown, statusSucceeded},
		},
		{
			name: "empty capability behaves as none",
			in:   paymentInput(""),
			setup: func(h *harness) {
				ambiguousOnce(h)
				h.signalAt(time.Hour, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_1"})
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_1"},
			calls:    parkedCalls(workflows.ActivityFinalize),
			statuses: []string{statusUnknown, statusSucceeded},
		},
		{
			name: "unclassified error is ambiguous and not retried",
			in:   paymentInput(workflows.CapabilityNone),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, errors.New("connection reset by peer"))
				h.signalAt(time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
			},
			want:     workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			calls:    parkedCalls(workflows.ActivityRelease),
			statuses: []string{statusUnknown, statusFailed},
		},
	})
}

func TestPaymentWorkflowCapabilityIdempotent(t *testing.T) {
	budget := func(d time.Duration) workflows.PaymentInput {
		in := paymentInput(workflows.CapabilityIdempotent)
		in.ChargeBudget = d
		return in
	}
	runPaymentCases(t, []paymentCase{
		{
			name: "ambiguous twice then charged",
			in:   paymentInput(workflows.CapabilityIdempotent),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous()).Twice()
				h.on(workflows.ActivityCharge).Return(charged("ch_3"), nil)
			},
			want:     workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_3"},
			calls:    map[string]int{workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 3, workflows.ActivityFinalize: 1},
			statuses: []string{statusSucceeded},
		},
		{
			name: "always ambiguous exhausts the budget and waits for a settlement",
			in:   budget(5 * time.Second),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
				h.expectWaitingAt(time.Hour)
				h.signalAt(2*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
			},
			want: workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			calls: map[string]int{
				// Retries at 0, 0.2, 0.6, 1.4 and 3s; the next (6.2s) is past the 5s budget.
				workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 5, workflows.ActivityMarkUnknown: 1,
				workflows.ActivityRelease: 1,
			},
			statuses: []string{statusUnknown, statusFailed},
			check: func(t *testing.T, h *harness) {
				charges := h.offsets(workflows.ActivityCharge)
				require.Less(t, charges[len(charges)-1], 5*time.Second, "a charge was sent after the budget")
				marked := h.offsets(workflows.ActivityMarkUnknown)
				require.GreaterOrEqual(t, marked[0], charges[len(charges)-1])
				require.LessOrEqual(t, marked[0], 5*time.Second)
				require.Equal(t, []time.Duration{2 * time.Hour}, h.offsets(workflows.ActivityRelease))
			},
		},
	})
}

func TestPaymentWorkflowCapabilityInquiry(t *testing.T) {
	runPaymentCases(t, []paymentCase{
		{
			name: "ambiguous, inquiry finds the charge",
			in:   paymentInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
				h.on(workflows.ActivityInquire).Return(charged("ch_found"), nil)
			},
			want: workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_found"},
			calls: map[string]int{
				workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityInquire: 1,
				workflows.ActivityFinalize: 1,
			},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{2 * time.Second}, h.offsets(workflows.ActivityInquire),
					"the inquiry waits before asking")
			},
		},
		{
			name: "ambiguous, inquiry finds a declined charge",
			in:   paymentInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
				h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{ProviderReference: "ch_d"}, nil)
			},
			want: workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			calls: map[string]int{
				workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityInquire: 1,
				workflows.ActivityRelease: 1,
			},
			statuses: []string{statusFailed},
		},
		{
			name: "ambiguous, inquiry finds nothing, the re-send succeeds",
			in:   paymentInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous()).Once()
				h.on(workflows.ActivityCharge).Return(charged("ch_2"), nil)
				h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound())
			},
			want: workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_2"},
			calls: map[string]int{
				workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 2, workflows.ActivityInquire: 1,
				workflows.ActivityFinalize: 1,
			},
			statuses: []string{statusSucceeded},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{0, 2 * time.Second}, h.offsets(workflows.ActivityCharge))
			},
		},
		{
			name: "ambiguous, inquiry finds nothing, the re-send is declined",
			in:   paymentInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous()).Once()
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, declined())
				h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound())
			},
			want: workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			calls: map[string]int{
				workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 2, workflows.ActivityInquire: 1,
				workflows.ActivityRelease: 1,
			},
			statuses: []string{statusFailed},
		},
		{
			name: "inquiry unavailable for the whole budget parks the payment without re-sending",
			in: func() workflows.PaymentInput {
				in := paymentInput(workflows.CapabilityInquiry)
				in.ChargeBudget = 5 * time.Second
				return in
			}(),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
				// Ambiguous inquiries are retried within the budget, then the payment is parked;
				// the parked loop keeps inquiring until the 4th round finds the charge.
				h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, ambiguous()).Times(5)
				h.on(workflows.ActivityInquire).Return(charged("ch_i"), nil)
			},
			want: workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_i"},
			calls: map[string]int{
				workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 1, workflows.ActivityInquire: 6,
				workflows.ActivityMarkUnknown: 1, workflows.ActivityFinalize: 1,
			},
			statuses: []string{statusUnknown, statusSucceeded},
		},
	})
}

// While unknown with capability inquiry, the workflow keeps inquiring on a growing timer until the
// provider finds the charge.
func TestPaymentWorkflowInquiryWhileUnknown(t *testing.T) {
	runPaymentCases(t, []paymentCase{
		{
			name: "re-inquires until found",
			in:   paymentInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
				// Three not-found inquiries each allow a re-send, up to 3 sends; the third
				// parks the payment. Two more rounds while unknown find nothing, the third finds it.
				h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound()).Times(5)
				h.on(workflows.ActivityInquire).Return(charged("ch_late"), nil)
				h.expectWaitingAt(7 * time.Second)
				h.expectWaitingAt(15 * time.Second)
			},
			want: workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_late"},
			calls: map[string]int{
				workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 3, workflows.ActivityInquire: 6,
				workflows.ActivityMarkUnknown: 1, workflows.ActivityFinalize: 1,
			},
			statuses: []string{statusUnknown, statusSucceeded},
			check: func(t *testing.T, h *harness) {
				s := time.Second
				require.Equal(t, []time.Duration{0, 2 * s, 4 * s}, h.offsets(workflows.ActivityCharge))
				require.Equal(t, []time.Duration{6 * s}, h.offsets(workflows.ActivityMarkUnknown))
				// Before each send, then while unknown after 2s, 4s and 8s.
				require.Equal(t, []time.Duration{2 * s, 4 * s, 6 * s, 8 * s, 12 * s, 20 * s},
					h.offsets(workflows.ActivityInquire))
			},
		},
		{
			name: "a settlement signal wins over the next inquiry",
			in:   paymentInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
				h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound())
				h.signalAt(10*time.Second, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
			},
			want: workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"},
			calls: map[string]int{
				// 3 inquiries before the sends, then at 8s; the signal at 10s beats the 12s one.
				workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 3, workflows.ActivityInquire: 4,
				workflows.ActivityMarkUnknown: 1, workflows.ActivityRelease: 1,
			},
			statuses: []string{statusUnknown, statusFailed},
			check: func(t *testing.T, h *harness) {
				require.Equal(t, []time.Duration{10 * time.Second}, h.offsets(workflows.ActivityRelease))
			},
		},
		{
			name: "the interval between inquiries is capped at an hour",
			in:   paymentInput(workflows.CapabilityInquiry),
			setup: func(h *harness) {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
				h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound()).Times(3 + 14)
				h.on(workflows.ActivityInquire).Return(charged("ch_h"), nil)
			},
			want: workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_h"},
			calls: map[string]int{
				workflows.ActivityReserveFunds: 1, workflows.ActivityCharge: 3, workflows.ActivityInquire: 18,
				workflows.ActivityMarkUnknown: 1, workflows.ActivityFinalize: 1,
			},
			statuses: []string{statusUnknown, statusSucceeded},
			check: func(t *testing.T, h *harness) {
				at := h.offsets(workflows.ActivityInquire)[3:]
				var gaps []time.Duration
				prev := 6 * time.Second // parked at 6s
				for _, a := range at {
					gaps = append(gaps, a-prev)
					prev = a
				}
				s := time.Second
				// 2s doubling: 2,4,...,2048s, then capped at 3600s.
				want := []time.Duration{2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 64 * s, 128 * s, 256 * s, 512 * s,
					1024 * s, 2048 * s, time.Hour, time.Hour, time.Hour, time.Hour}
				require.Equal(t, want, gaps)
			},
		},
	})
}

// An undecodable settlement payload (e.g. a bare string sent from the UI) must be dropped without
// stopping the periodic inquiry of a parked payment (a blocking Receive in the selector callback
// would wait there for the next signal and starve the timer).
func TestPaymentWorkflowUndecodableSettlementKeepsInquiring(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
	h.on(workflows.ActivityInquire).Return(workflows.ChargeResult{}, notFound()).Times(5)
	h.on(workflows.ActivityInquire).Return(charged("ch_late"), nil)
	// Parked at 6s with the next inquiry due at 8s; the corrupt payload arrives in between.
	h.signalAt(7*time.Second, "charged")
	// With the bug the workflow would wait for this signal; it must have finished long before.
	h.signalAt(time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})

	res := h.run(paymentInput(workflows.CapabilityInquiry))
	require.Equal(t, workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_late"}, res)
	require.Zero(t, h.calls(workflows.ActivityRelease))
	require.Equal(t, 6, h.calls(workflows.ActivityInquire), "inquiries at %v", h.offsets(workflows.ActivityInquire))
	require.Less(t, h.offsets(workflows.ActivityFinalize)[0], time.Minute)
}

// The provider calls' timeouts carry the strategy: an idempotent provider is retried within its
// budget (ScheduleToCloseTimeout), and inquiries are bounded by the same budget. (The test
// environment does not expose the retry policy to activities; attempt counts are covered above.)
func TestPaymentWorkflowProviderCallTimeouts(t *testing.T) {
	cases := []struct {
		name       string
		capability workflows.Capability
		budget     time.Duration
		activity   string
		want       time.Duration // ScheduleToCloseTimeout
	}{
		{name: "idempotent charge default budget", capability: workflows.CapabilityIdempotent, activity: workflows.ActivityCharge, want: workflows.DefaultChargeBudget},
		{name: "idempotent charge explicit budget", capability: workflows.CapabilityIdempotent, budget: 45 * time.Second, activity: workflows.ActivityCharge, want: 45 * time.Second},
		{name: "inquiry default budget", capability: workflows.CapabilityInquiry, activity: workflows.ActivityInquire, want: workflows.DefaultChargeBudget},
		{name: "inquiry explicit budget", capability: workflows.CapabilityInquiry, budget: 45 * time.Second, activity: workflows.ActivityInquire, want: 45 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			var mu sync.Mutex
			var infos []activity.Info
			record := func(ctx context.Context) {
				mu.Lock()
				defer mu.Unlock()
				infos = append(infos, activity.GetInfo(ctx))
			}
			if tc.activity == workflows.ActivityInquire {
				h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
				h.on(workflows.ActivityInquire).Return(func(ctx context.Context, _ uuid.UUID) (workflows.ChargeResult, error) {
					record(ctx)
					return charged("ch_x"), nil
				})
			} else {
				h.on(workflows.ActivityCharge).Return(func(ctx context.Context, _ workflows.ChargeInput) (workflows.ChargeResult, error) {
					record(ctx)
					return charged("ch_x"), nil
				})
			}
			in := paymentInput(tc.capability)
			in.ChargeBudget = tc.budget
			res := h.run(in)
			require.Equal(t, workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_x"}, res)

			mu.Lock()
			defer mu.Unlock()
			require.Len(t, infos, 1)
			require.Equal(t, tc.want, infos[0].ScheduleToCloseTimeout)
			require.Equal(t, 30*time.Second, infos[0].StartToCloseTimeout)
		})
	}
}

// An unknown payment's inquiry, which a settlement waits for, is retried for the charge budget
// until Revision 12, and from it for one attempt's timeout (the charge timeout), no longer than
// the budget: inside the minute a settlement import waits for each settlement.
func TestParkedInquiryTimeouts(t *testing.T) {
	cases := []struct {
		revision        int
		budget, timeout time.Duration
		want            time.Duration // ScheduleToCloseTimeout
	}{
		{revision: 11, want: workflows.DefaultChargeBudget},
		{revision: 11, budget: 45 * time.Second, timeout: 20 * time.Second, want: 45 * time.Second},
		{revision: 12, want: workflows.DefaultChargeTimeout},
		{revision: 12, budget: 45 * time.Second, timeout: 20 * time.Second, want: 20 * time.Second},
		{revision: 12, budget: 10 * time.Second, want: 10 * time.Second},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("revision %d budget %v timeout %v", tc.revision, tc.budget, tc.timeout), func(t *testing.T) {
			h := newHarness(t)
			var mu sync.Mutex
			var infos []activity.Info
			h.on(workflows.ActivityInquire).Return(func(ctx context.Context, _ uuid.UUID) (workflows.ChargeResult, error) {
				mu.Lock()
				defer mu.Unlock()
				infos = append(infos, activity.GetInfo(ctx))
				return charged("ch_x"), nil
			})
			in := paymentInput(workflows.CapabilityInquiry)
			in.Revision, in.Parked, in.InquiryWait = tc.revision, true, 2*time.Second
			in.ChargeBudget, in.ChargeTimeout = tc.budget, tc.timeout
			require.Equal(t, workflows.PaymentResult{Status: statusSucceeded, ProviderReference: "ch_x"}, h.run(in))

			mu.Lock()
			defer mu.Unlock()
			require.Len(t, infos, 1)
			require.Equal(t, tc.want, infos[0].ScheduleToCloseTimeout)
			require.Equal(t, min(cmp.Or(tc.timeout, workflows.DefaultChargeTimeout), tc.want), infos[0].StartToCloseTimeout)
		})
	}
}

// updateAt sends the checked `settle` update after d and records how the workflow answered it.
func (h *harness) updateAt(d time.Duration, id string, s workflows.Settlement, answers map[string]string) {
	h.env.RegisterDelayedCallback(func() { h.update(id, s, answers) }, d)
}

// update sends the `settle` update now (from a mocked activity: while it runs) and records the
// answer under id.
func (h *harness) update(id string, s workflows.Settlement, answers map[string]string) {
	h.env.UpdateWorkflow(workflows.UpdateSettle, id, h.answerTo(id, answers), s)
}

// answerTo records an update's answer under id: the status, or why it was rejected or failed.
func (h *harness) answerTo(id string, answers map[string]string) *testsuite.TestUpdateCallback {
	record := func(a string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		answers[id] = a
	}
	return &testsuite.TestUpdateCallback{
		OnAccept: func() {},
		OnReject: func(err error) { record("rejected: " + err.Error()) },
		OnComplete: func(v any, err error) {
			if err != nil {
				record("failed: " + err.Error())
				return
			}
			record(fmt.Sprint(v))
		},
	}
}

// The `settle` update is the checked form: early, malformed and repeated settlements are
// rejected to the caller and change nothing; the accepted one answers with the final status.
func TestPaymentWorkflowSettleUpdate(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivityCharge).After(time.Minute).Return(workflows.ChargeResult{}, ambiguous())
	answers := map[string]string{}
	h.updateAt(30*time.Second, "early", workflows.Settlement{Outcome: workflows.OutcomeCharged}, answers)
	h.updateAt(time.Hour, "malformed", workflows.Settlement{Outcome: "maybe"}, answers)
	h.updateAt(2*time.Hour, "accepted", workflows.Settlement{Outcome: workflows.OutcomeNotCharged}, answers)
	h.updateAt(2*time.Hour+time.Second, "again", workflows.Settlement{Outcome: workflows.OutcomeCharged}, answers)
	// An early signal is ignored too (it cannot be rejected to its sender).
	h.signalAt(30*time.Second, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_early"})
	h.expectWaitingAt(90 * time.Minute)

	res := h.run(paymentInput(workflows.CapabilityNone))
	require.Equal(t, workflows.PaymentResult{Status: statusFailed, FailureCode: "declined"}, res)
	require.Contains(t, answers["early"], "rejected: payment is processing, not unknown")
	require.Contains(t, answers["malformed"], "rejected: outcome must be")
	require.Equal(t, statusFailed, answers["accepted"])
	require.Equal(t, 0, h.calls(workflows.ActivityFinalize), "no settlement but the accepted one had an effect")
	require.Equal(t, 1, h.calls(workflows.ActivityRelease))
}

// A database outage makes a local step retry for as long as it lasts. From Revision 8 its waits
// grow to a minute, longer than a workflow task's timeout, so the SDK waits for each on a server
// timer instead of keeping the task open (completing it every few seconds, history events and
// Temporal tasks for the whole outage); runs of earlier Revisions keep their ten seconds.
func TestLocalStepRetryWaitsPastATaskFromRevision8(t *testing.T) {
	for rev, want := range map[int]time.Duration{7: 10 * time.Second, 8: time.Minute} {
		t.Run(fmt.Sprintf("revision %d", rev), func(t *testing.T) {
			h := newHarness(t)
			h.on(workflows.ActivityReserve).Return(temporal.NewApplicationError("connection refused", "")).Times(12)
			h.on(workflows.ActivityCharge).Return(charged("ch_ok"), nil)
			in := paymentInput(workflows.CapabilityNone)
			in.LocalSteps, in.Revision = true, rev
			require.Equal(t, statusSucceeded, h.run(in).Status)
			reserves := h.offsets(workflows.ActivityReserve)
			require.Len(t, reserves, 13)
			var longest time.Duration
			for i := 1; i < len(reserves); i++ {
				longest = max(longest, reserves[i]-reserves[i-1])
			}
			require.Equal(t, want, longest.Round(time.Second))
		})
	}
}

// A send that failed before it went out (the database unreadable, its send record not written:
// the activity says NotSent) moved nothing at the bank. From Revision 9 it is made again after a
// pause, even with a bank that allows no re-send, and the payment ends as the bank answers;
// runs of earlier Revisions park it unknown as any failed send.
func TestSendThatNeverWentOutIsMadeAgainFromRevision9(t *testing.T) {
	notSent := temporal.NewApplicationError("connection refused", workflows.ErrTypeNotSent)
	for _, tc := range []struct {
		rev        int
		capability workflows.Capability
		want       string
		charges    int
	}{
		{8, workflows.CapabilityNone, statusUnknown, 1},
		{9, workflows.CapabilityNone, statusSucceeded, 4},
		{9, workflows.CapabilityInquiry, statusSucceeded, 4},
	} {
		t.Run(fmt.Sprintf("revision %d, %s", tc.rev, tc.capability), func(t *testing.T) {
			h := newHarness(t)
			h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, notSent).Times(3)
			h.on(workflows.ActivityCharge).Return(charged("ch_ok"), nil).Maybe()
			in := paymentInput(tc.capability)
			in.LocalSteps, in.Revision = true, tc.rev
			if tc.want == statusUnknown {
				h.signalAt(time.Hour, workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
			}
			res := h.run(in)
			require.Equal(t, tc.charges, h.calls(workflows.ActivityCharge))
			if tc.want == statusUnknown {
				require.Equal(t, 1, h.calls(workflows.ActivityMarkUnknown), "parked unknown")
				return
			}
			require.Equal(t, tc.want, res.Status)
			require.Zero(t, h.calls(workflows.ActivityMarkUnknown), "never unknown")
		})
	}
}

// A run whose payment another run decided while it sent (a run moved off a task queue nobody
// polled, raced by a late worker that ran the first): its send is a repeat, ambiguous, and
// marking the payment unknown finds it final. From Revision 9 the run ends with the payment's
// status, nothing owed, rather than wait for an operator with the payment already final.
func TestRunEndsWhenAnotherRunDecidedItsPaymentFromRevision9(t *testing.T) {
	h := newHarness(t)
	h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
	h.on(workflows.ActivityMarkUnknown).Return(temporal.NewNonRetryableApplicationError(
		"payment is succeeded, cannot become unknown", workflows.ErrTypeInconsistent, nil, statusSucceeded))
	in := paymentInput(workflows.CapabilityNone)
	in.LocalSteps, in.Revision = true, 9
	res := h.run(in)
	require.Equal(t, statusSucceeded, res.Status)
	require.Zero(t, h.calls(workflows.ActivityFlagStuck), "no operator is asked for")
	require.Zero(t, h.calls(workflows.ActivityRelease)+h.calls(workflows.ActivityFinalize), "the other run moved the money")
}

// A run parked unknown without inquiries (none, idempotent) reads its payment's status as an
// inquiry's timer would run, from Revision 10: once another run has made the payment final (it
// decided it just after this run parked it), the run ends with that status, moving nothing. A
// run of Revision 9 reads nothing and waits for a settlement.
func TestParkedRunEndsOnceAnotherRunDecidedItsPaymentFromRevision10(t *testing.T) {
	for _, tc := range []struct {
		name     string
		revision int
		want     string
		reads    int
	}{
		{"revision 10", 10, statusFailed, 3},
		{"revision 9", 9, statusSucceeded, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.on(workflows.ActivityCharge).Return(workflows.ChargeResult{}, ambiguous())
			h.on(workflows.ActivityReadPaymentStatus).Return(workflows.StatusRead{Status: statusUnknown}, nil).Times(2)
			h.on(workflows.ActivityReadPaymentStatus).Return(workflows.StatusRead{Status: statusFailed}, nil)
			in := paymentInput(workflows.CapabilityNone)
			in.LocalSteps, in.Revision = true, tc.revision
			h.signalAt(2*time.Hour, workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_file"})
			res := h.run(in)
			require.Equal(t, tc.want, res.Status)
			require.Equal(t, tc.reads, h.calls(workflows.ActivityReadPaymentStatus))
			require.Equal(t, 1, h.calls(workflows.ActivityMarkUnknown))
			if tc.revision >= 10 {
				require.Zero(t, h.calls(workflows.ActivityRelease)+h.calls(workflows.ActivityFinalize), "the other run moved the money")
				require.Equal(t, []time.Duration{2 * time.Second, 6 * time.Second, 14 * time.Second},
					h.offsets(workflows.ActivityReadPaymentStatus)[:3:3], "read as an inquiry would be, on a growing timer")
			}
		})
	}
}
