package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/banksim"
)

// The mixes: refunds and manual captures sent beside new payments (Options.RefundShare and
// ManualShare), and the checks that read them back from kasa and the bank simulator.

// RefundStats are a run's refunds, present when it had a refund mix (Options.RefundShare).
type RefundStats struct {
	Share    float64 `json:"share"`         // asked: the share of operations that are refunds
	Requests int64   `json:"requests"`      // refund requests answered in the window
	New      int64   `json:"new_refunds"`   // answered with a refund (201, 202, 402)
	Rate     float64 `json:"refunds_per_s"` // New over the window
	Latency  Latency `json:"latency_ms"`    // of the refund requests alone
}

// RefundOf is what a run saw of one refund: its payment, and the payment's merchant's API key (to
// read both back; the check reads the refund's status from kasa).
type RefundOf struct {
	PaymentID, APIKey string
}

const (
	// refundParts: each refund asks for a quarter of its payment's amount (rounded up; the last
	// part what is left), so a payment takes up to four refunds. A share above 0.8 runs out.
	refundParts = 4
	poolCap     = 100_000     // payments a run's pool keeps at most
	settleWait  = time.Minute // how long a check waits for refunds and payments still in flight
)

// partPool is a run's payments with what is left to take of each, handed out in parts (at most
// parts per payment: refundParts quarters to refund, or one whole authorization to capture or
// cancel), and the count of operations and parts taken that keeps a mix at its share.
type partPool struct {
	parts      int64
	mu         sync.Mutex
	ops, taken int64
	open       []pooled
}

type pooled struct {
	paymentID, apiKey string
	amount, left      int64
}

// add puts a payment in the pool.
func (p *partPool) add(paymentID, apiKey string, amount int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.open) < poolCap && amount > 0 {
		p.open = append(p.open, pooled{paymentID: paymentID, apiKey: apiKey, amount: amount, left: amount})
	}
}

// take decides one operation: a part of a pooled payment (its payment, key and amount) when the
// parts taken so far fall short of share of the operations (share 1: whenever one is open), else
// (false) a payment. A part taken is never given back, even if its command fails: the generator
// may under-refund, never over-refund.
func (p *partPool) take(share float64) (pooled, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ops++
	if len(p.open) == 0 || float64(p.taken+1) > share*float64(p.ops) {
		return pooled{}, false
	}
	i := rand.IntN(len(p.open))
	rf := &p.open[i]
	amount := min((rf.amount+p.parts-1)/p.parts, rf.left)
	rf.left -= amount
	part := pooled{paymentID: rf.paymentID, apiKey: rf.apiKey, amount: amount}
	if rf.left == 0 {
		p.open[i] = p.open[len(p.open)-1]
		p.open = p.open[:len(p.open)-1]
	}
	p.taken++
	return part, true
}

// newRefund builds a partial refund of part with a fresh key.
func (r *runner) newRefund(part pooled) request {
	body, _ := json.Marshal(map[string]string{"amount": payment.FormatAmount(part.amount, currency)})
	return request{method: http.MethodPost, url: r.opts.APIURL + "/v1/payments/" + part.paymentID + "/refunds",
		token: part.apiKey, key: uuid.NewString(), body: body, isNew: true, kind: kindRefund, of: part.paymentID}
}

// checkRefunds checks every payment the refunds seen were of, once none of its refunds is
// processing (waiting up to a minute): each refund kasa lists for it was refunded at the bank
// simulator once if it succeeded and never if it failed (an unknown one at most once), its
// amount_refunded is the sum of its succeeded refunds, and every refund seen is among those listed.
func checkRefunds(ctx context.Context, apiURL, simURL string, seen map[string]RefundOf, pageSize int, v *Verdict) (err error) {
	byPayment := map[string][]string{} // payment id -> the refund ids seen
	keys := map[string]string{}
	for id, rf := range seen {
		byPayment[rf.PaymentID] = append(byPayment[rf.PaymentID], id)
		keys[rf.PaymentID] = rf.APIKey
	}
	v.RefundsChecked, v.RefundDoubles, v.RefundProblems, err = checkEach(ctx, apiURL, simURL, pageSize, settleWait, slices.Sorted(maps.Keys(byPayment)),
		func(ctx context.Context, c checker, id string) (int, int, []string, error) {
			return c.refunds(ctx, keys[id], id, byPayment[id])
		})
	return err
}

// checkEach checks each of ids on 16 goroutines, with one checker that waits for what is still in
// flight until wait from now, and sums what the checks found (problems sorted).
func checkEach(ctx context.Context, apiURL, simURL string, pageSize int, wait time.Duration, ids []string,
	check func(ctx context.Context, c checker, id string) (checked, doubles int, problems []string, err error),
) (checked, doubles int, problems []string, err error) {
	hc := newClient(16)
	defer hc.CloseIdleConnections()
	c := checker{hc: hc, api: strings.TrimRight(apiURL, "/"), bank: banksim.Control{URL: simURL, Client: hc},
		pageSize: pageSize, wait: wait, deadline: time.Now().Add(wait)}
	var mu sync.Mutex
	err = parallel(ctx, len(ids), 16, func(ctx context.Context, i int) error {
		n, d, p, err := check(ctx, c, ids[i])
		mu.Lock()
		defer mu.Unlock()
		checked, doubles, problems = checked+n, doubles+d, append(problems, p...)
		return err
	})
	slices.Sort(problems)
	return checked, doubles, problems, err
}

// checker reads payments and refunds back from kasa, and what the bank did of them.
type checker struct {
	hc       *http.Client
	api      string
	bank     banksim.Control
	pageSize int
	wait     time.Duration
	deadline time.Time
}

// await calls done every 200 ms until it is done, fails, or the deadline has passed.
func (c checker) await(ctx context.Context, done func() (bool, error)) error {
	for {
		ok, err := done()
		if err != nil || ok || time.Now().After(c.deadline) {
			return err
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

func (c checker) refunds(ctx context.Context, key, paymentID string, seen []string) (checked, doubles int, problems []string, err error) {
	var refunds []payment.RefundResource
	err = c.await(ctx, func() (done bool, err error) {
		refunds, err = c.list(ctx, key, paymentID)
		return !slices.ContainsFunc(refunds, func(r payment.RefundResource) bool { return r.Status == payment.StatusProcessing }), err
	})
	if err != nil {
		return 0, 0, nil, err
	}
	var p payment.Resource
	if err := call(ctx, c.hc, request{method: http.MethodGet, url: c.api + "/v1/payments/" + paymentID, token: key}, &p); err != nil {
		return 0, 0, nil, err
	}
	listed := map[string]bool{}
	var succeeded int64
	for _, r := range refunds {
		listed[r.ID] = true
		bank, err := c.bank.Refunds(ctx, r.ID)
		if err != nil {
			return 0, 0, nil, fmt.Errorf("bench: %w", err)
		}
		n := bank.Count + bank.Pending // a late booking moved money too
		checked++
		w, final := map[payment.Status]int{payment.StatusSucceeded: 1, payment.StatusFailed: 0}[r.Status]
		switch {
		case n > 1 || (final && n != w):
			if n > 1 {
				doubles++
			}
			problems = append(problems, fmt.Sprintf("refund %s of payment %s: %s in kasa, refunded %d times at the bank", r.ID, paymentID, r.Status, n))
		case r.Status == payment.StatusProcessing:
			problems = append(problems, fmt.Sprintf("refund %s of payment %s: still processing %s after the run", r.ID, paymentID, c.wait))
		}
		if r.Status == payment.StatusSucceeded {
			a, err := amountMinor(r.Amount, r.Currency)
			if err != nil {
				return 0, 0, nil, fmt.Errorf("bench: refund %s: amount %q: %w", r.ID, r.Amount, err)
			}
			succeeded += a
		}
	}
	refunded, err := amountMinor(p.AmountRefunded, p.Currency)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("bench: payment %s: amount_refunded %q: %w", paymentID, p.AmountRefunded, err)
	}
	if refunded != succeeded {
		problems = append(problems, fmt.Sprintf("payment %s: amount_refunded %s, its succeeded refunds sum to %s",
			paymentID, p.AmountRefunded, payment.FormatAmount(succeeded, p.Currency)))
	}
	for _, id := range seen {
		if !listed[id] {
			problems = append(problems, fmt.Sprintf("refund %s of payment %s: answered to the bench, not among the payment's refunds", id, paymentID))
		}
	}
	return checked, doubles, problems, nil
}

// list reads all of a payment's refunds, page by page.
func (c checker) list(ctx context.Context, key, paymentID string) ([]payment.RefundResource, error) {
	var all []payment.RefundResource
	for after := ""; ; {
		u := fmt.Sprintf("%s/v1/payments/%s/refunds?limit=%d", c.api, paymentID, c.pageSize)
		if after != "" {
			u += "&starting_after=" + url.QueryEscape(after)
		}
		var page struct {
			Data    []payment.RefundResource `json:"data"`
			HasMore bool                     `json:"has_more"`
		}
		if err := call(ctx, c.hc, request{method: http.MethodGet, url: u, token: key}, &page); err != nil {
			return nil, err
		}
		all = append(all, page.Data...)
		if !page.HasMore || len(page.Data) == 0 {
			return all, nil
		}
		after = page.Data[len(page.Data)-1].ID
	}
}

// amountMinor parses an amount of a resource, zero included.
func amountMinor(s, currency string) (int64, error) {
	n, err := payment.ParseAmount(s, currency)
	if errors.Is(err, payment.ErrNonPositiveAmount) {
		return 0, nil
	}
	return n, err
}

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
	var p payment.Resource
	awaited := func() bool { // the payment's outcome, or its command's, is still to come
		switch p.Status {
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
	status, money := p.Status, func(minor int64) string { return payment.FormatAmount(minor, p.Currency) }
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
