package workflows

import (
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/payment"
)

// refundRevision is the Revision of the payment rules a refund whose input names none runs under
// (refunds started before RefundInput.Revision): the booking window, numbered sends, the stuck
// state and ContinueAsNew.
const refundRevision = 1

// RefundWorkflow: hold -> send the refund to the bank (strategy by capability) -> post or
// release. Only a decline fails a refund; an outcome that cannot be known is parked as unknown,
// its hold kept, until a settlement (charged: refunded, not_charged: not refunded) resolves it.
func RefundWorkflow(ctx workflow.Context, in RefundInput) (RefundWorkflowResult, error) {
	refuseNewer(in.Revision)
	rev := max(in.Revision, refundRevision)
	ctx = ignoreCancel(ctx, rev)
	if rev >= 2 && in.Capability == "" {
		c, err := workerPolicy(ctx, rev)
		if err != nil {
			return RefundWorkflowResult{}, err
		}
		in = in.WithPolicy(c)
	}
	rules := PaymentInput{
		OperationID: in.OperationID, Capability: in.Capability, ChargeBudget: in.ChargeBudget,
		ChargeTimeout: in.ChargeTimeout, BookingWindow: in.BookingWindow, LocalSteps: in.LocalSteps,
		Revision: rev, Parked: in.Parked, InquiryWait: in.InquiryWait,
	}
	hold := ActivityHoldRefund
	if rev >= 2 {
		hold = ActivityHoldRefundForRun
	}
	_, details := in.summary()
	w := &opRun{in: rules, status: payment.StatusProcessing, op: operation{
		noun: "refund", id: in.OperationID, workflow: WorkflowRefund, details: details, amount: in.AmountMinor,
		reserve: hold, send: ActivitySendRefund, inquire: ActivityInquireRefund, post: ActivityPostRefund,
		release: ActivityReleaseRefund, markUnknown: ActivityMarkRefundUnknown, flagStuck: ActivityFlagRefundStuck,
		readStatus: ActivityReadRefundStatus,
		sendArg: func(send int, re Resend) any {
			return SendRefundInput{
				OperationID: in.OperationID, PaymentID: in.PaymentID, AmountMinor: in.AmountMinor, Currency: in.Currency,
				Capability: in.Capability, Send: send, Resend: re,
			}
		},
		postArg:    func(ref string) any { return PostRefundInput{OperationID: in.OperationID, ProviderReference: ref} },
		releaseArg: func(code string) any { return ReleaseRefundInput{OperationID: in.OperationID, FailureCode: code} },
		continued: func(wait time.Duration) any {
			next := in
			next.Parked, next.InquiryWait = true, wait
			return next
		},
	}}
	res, err := w.run(ctx)
	return RefundWorkflowResult(res), err
}
