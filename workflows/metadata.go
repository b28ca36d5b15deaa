package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/payment"
)

// What an operator reads in the Temporal Web UI (docs/reconciliation.md, "Read a payment's
// history"): a workflow's static summary and details say what is at stake, its current details
// what it waits for and since when. None of it is a command in history: replays ignore it.

// summary is a payment's one-line static summary and its static details (markdown).
func (in PaymentInput) summary() (string, string) {
	s := "payment " + payment.FormatAmount(in.AmountMinor, in.Currency) + " " + in.Currency
	if in.Invoice != "" {
		s += " · invoice " + in.Invoice
	}
	if in.CaptureManual {
		s += " · authorize, capture later"
	}
	s += " · merchant " + in.MerchantID.String()
	d := fmt.Sprintf("**Payment** `%s`\n\n- amount: %s %s\n- merchant: `%s`\n- payer account: `%s`\n- invoice: %s",
		in.OperationID, payment.FormatAmount(in.AmountMinor, in.Currency), in.Currency, in.MerchantID, in.AccountID, in.Invoice)
	if in.CaptureManual {
		d += "\n- capture: manual, before " + payment.FormatTime(in.CaptureBefore)
	}
	return s, d
}

// summary is a refund's one-line static summary and its static details (markdown).
func (in RefundInput) summary() (string, string) {
	amount := payment.FormatAmount(in.AmountMinor, in.Currency) + " " + in.Currency
	return "refund " + amount + " of payment " + in.PaymentID.String() + " · merchant " + in.MerchantID.String(),
		fmt.Sprintf("**Refund** `%s`\n\n- amount: %s\n- of payment: `%s`\n- merchant: `%s`", in.OperationID, amount, in.PaymentID, in.MerchantID)
}

// listed is a summary as the PaymentSummary search attribute holds it: cut to what a Keyword
// column of Temporal's SQL visibility takes (255 characters).
func listed(summary string) string {
	if r := []rune(summary); len(r) > 255 {
		return string(r[:254]) + "…"
	}
	return summary
}

// detail sets the workflow's current details: what it waits for, since now.
func (w *opRun) detail(ctx workflow.Context, format string, args ...any) {
	d := fmt.Sprintf(format, args...) + " (since " + stamp(workflow.Now(ctx)) + ")"
	if w.in.Parked { // a continued run: Temporal carries no static summary or details over
		d = w.op.details + "\n\n" + d
	}
	workflow.SetCurrentDetails(ctx, d)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
