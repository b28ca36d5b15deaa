package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
)

// ManualStats are a run's manual-capture payments and their commands, present when it had a
// manual mix (Options.ManualShare). The authorizations are new payments: their latency is in
// PaymentLatency, with the automatic payments'.
type ManualStats struct {
	Share          float64 `json:"share"`              // asked: the share of new payments created with capture manual
	Authorizations int64   `json:"authorizations"`     // new manual payments answered with the payment (201, 402, 202) in the window
	Commands       int64   `json:"commands"`           // capture and cancel requests answered in the window
	Captures       int64   `json:"captures"`           // answered with the payment (201, 202, 402)
	Cancels        int64   `json:"cancels"`            // answered with the payment (200, 202)
	CaptureRate    float64 `json:"captures_per_s"`     // Captures over the window
	CancelRate     float64 `json:"cancels_per_s"`      // Cancels over the window
	Latency        Latency `json:"latency_ms"`         // of the capture and cancel requests alone
	PaymentLatency Latency `json:"payment_latency_ms"` // of the payment requests alone, automatic and manual
}

// ManualOf is what a run saw of one manual payment: its merchant's API key (to read it back),
// and the command (capture or cancel) last answered with the payment, if any.
type ManualOf struct {
	APIKey, Command string
}

// newCommand builds a capture of a random part of auth (1 minor unit up to all of it), or in one
// case of four a cancel, with a fresh key.
func (r *runner) newCommand(auth pooled) request {
	req := request{method: http.MethodPost, token: auth.apiKey, key: uuid.NewString(), isNew: true, kind: kindCancel, of: auth.paymentID}
	if rand.IntN(4) > 0 {
		req.kind = kindCapture
		req.body, _ = json.Marshal(map[string]string{"amount": payment.FormatAmount(1+rand.Int64N(auth.amount), currency)})
	}
	req.url = r.opts.APIURL + "/v1/payments/" + auth.paymentID + "/" + req.kind
	return req
}

// checkManual reads back every manual payment seen, once it is neither processing nor awaiting
// the bank's answer to a command (waiting up to wait), and checks it at the bank simulator: at
// most one authorization, whose captures took no more than the payment's amount and exactly its
// amount_captured (an unknown payment's may differ until reconciliation), nothing of a canceled
// payment, and no void of a succeeded one.
func checkManual(ctx context.Context, apiURL, simURL string, seen map[string]ManualOf, wait time.Duration, v *Verdict) error {
	var err error
	v.ManualChecked, v.DoubleAuthorizations, v.ManualProblems, err = checkEach(ctx, apiURL, simURL, 0, wait, slices.Sorted(maps.Keys(seen)),
		func(ctx context.Context, c checker, id string) (int, int, []string, error) {
			return c.manual(ctx, id, seen[id])
		})
	return err
}

func (c checker) manual(ctx context.Context, id string, of ManualOf) (checked, doubles int, problems []string, err error) {
	var p struct {
		Status, Capture, Amount, Currency string
		AmountCaptured                    string `json:"amount_captured"`
	}
	awaited := func() bool { // the payment's outcome, or its command's, is still to come
		switch payment.Status(p.Status) {
		case payment.StatusProcessing, payment.StatusUnknown:
			return true
		case payment.StatusRequiresCapture:
			return of.Command != ""
		}
		return false
	}
	err = c.await(ctx, func() (bool, error) {
		p.Status = ""
		err := call(ctx, c.hc, request{method: http.MethodGet, url: c.api + "/v1/payments/" + id, token: of.APIKey}, &p)
		return !awaited(), err
	})
	if err != nil {
		return 0, 0, nil, err
	}
	held, err := c.bank.Authorizations(ctx, id)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("bench: %w", err)
	}
	amount, err := amountMinor(p.Amount, p.Currency)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("bench: payment %s: amount %q: %w", id, p.Amount, err)
	}
	var captured int64
	if p.Capture == payment.CaptureManual {
		if captured, err = amountMinor(p.AmountCaptured, p.Currency); err != nil {
			return 0, 0, nil, fmt.Errorf("bench: payment %s: amount_captured %q: %w", id, p.AmountCaptured, err)
		}
	}
	status, money := payment.Status(p.Status), func(minor int64) string { return payment.FormatAmount(minor, p.Currency) }
	late := fmt.Sprintf("still %s %s after the run", status, c.wait)
	if of.Command != "" {
		late += " and its " + of.Command
	}
	var wrong []string
	if n := held.Count + held.Pending; n > 1 { // a late booking placed a hold too
		doubles++
		wrong = append(wrong, fmt.Sprintf("%d authorizations at the bank", n))
	}
	for _, w := range []struct {
		bad  bool
		what string
	}{
		{p.Capture != payment.CaptureManual, fmt.Sprintf("capture %q in kasa", p.Capture)},
		{held.CapturedMinor > amount, "the bank captured more than the amount"},
		{status != payment.StatusUnknown && held.CapturedMinor != captured, "the bank captured " + money(held.CapturedMinor)},
		{status == payment.StatusCanceled && held.CapturedMinor != 0, "canceled, yet captured at the bank"},
		{status == payment.StatusSucceeded && held.Voided, "succeeded, yet voided at the bank"},
		{awaited() && status != payment.StatusUnknown, late},
	} {
		if w.bad {
			wrong = append(wrong, w.what)
		}
	}
	if len(wrong) > 0 {
		problems = append(problems, fmt.Sprintf("manual payment %s: %s in kasa, amount %s, amount_captured %s: %s",
			id, cmp.Or(p.Status, "?"), p.Amount, cmp.Or(p.AmountCaptured, "none"), strings.Join(wrong, "; ")))
	}
	return 1, doubles, problems, nil
}
