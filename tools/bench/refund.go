package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// RefundStats are a run's refunds, present when it had a refund mix (Options.RefundShare).
type RefundStats struct {
	Share    float64 `json:"share"`         // asked: the share of operations that are refunds
	Requests int64   `json:"requests"`      // refund requests answered in the window
	New      int64   `json:"new_refunds"`   // answered with a refund (201, 202, 402)
	Rate     float64 `json:"refunds_per_s"` // New over the window
	Latency  Latency `json:"latency_ms"`    // of the refund requests alone
}

// RefundOf is what a run saw of one refund: its payment, the payment's merchant's API key (to
// read both back), and the refund's latest status.
type RefundOf struct {
	PaymentID, APIKey, Status string
}

const (
	// refundParts: each refund asks for a quarter of its payment's amount (rounded up; the last
	// part what is left), so a payment takes up to four refunds. A share above 0.8 runs out.
	refundParts   = 4
	refundPoolCap = 100_000     // refundable payments a run keeps at most
	refundSettle  = time.Minute // how long the check waits for refunds still processing
)

// refundPool is a run's succeeded payments with what is left to refund of each, and the count of
// operations and refunds that keeps the mix at its share.
type refundPool struct {
	mu           sync.Mutex
	ops, refunds int64
	open         []refundable
}

type refundable struct {
	paymentID, apiKey string
	amount, left      int64
}

// add makes a succeeded payment refundable.
func (p *refundPool) add(paymentID, apiKey string, amount int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.open) < refundPoolCap && amount > 0 {
		p.open = append(p.open, refundable{paymentID: paymentID, apiKey: apiKey, amount: amount, left: amount})
	}
}

// take decides one operation: a refund (its payment, key and amount in a refundable) when the
// refunds so far fall short of share of the operations, else (false) a payment. A part taken is
// never given back, even if its refund fails: the generator may under-refund, never over-refund.
func (p *refundPool) take(share float64) (refundable, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ops++
	if len(p.open) == 0 || float64(p.refunds+1) > share*float64(p.ops) {
		return refundable{}, false
	}
	i := rand.IntN(len(p.open))
	rf := &p.open[i]
	amount := min((rf.amount+refundParts-1)/refundParts, rf.left)
	rf.left -= amount
	part := refundable{paymentID: rf.paymentID, apiKey: rf.apiKey, amount: amount}
	if rf.left == 0 {
		p.open[i] = p.open[len(p.open)-1]
		p.open = p.open[:len(p.open)-1]
	}
	p.refunds++
	return part, true
}

// newRefund builds a partial refund of part with a fresh key.
func (r *runner) newRefund(part refundable) request {
	body, _ := json.Marshal(map[string]string{"amount": payment.FormatAmount(part.amount, currency)})
	return request{method: http.MethodPost, url: r.opts.APIURL + "/v1/payments/" + part.paymentID + "/refunds",
		token: part.apiKey, key: uuid.NewString(), body: body, isNew: true, refundOf: part.paymentID}
}

// CheckRefunds checks every payment the refunds seen were of, once none of its refunds is
// processing (waiting up to a minute): each refund kasa lists for it was refunded at the bank
// simulator once if it succeeded and never if it failed (an unknown one at most once), its
// amount_refunded is the sum of its succeeded refunds, and every refund seen is among those listed.
func CheckRefunds(ctx context.Context, apiURL, simURL string, seen map[string]RefundOf) (Verdict, error) {
	return checkRefunds(ctx, apiURL, simURL, seen, 100)
}

func checkRefunds(ctx context.Context, apiURL, simURL string, seen map[string]RefundOf, pageSize int) (v Verdict, err error) {
	byPayment := map[string][]string{} // payment id -> the refund ids seen
	keys := map[string]string{}
	for id, rf := range seen {
		byPayment[rf.PaymentID] = append(byPayment[rf.PaymentID], id)
		keys[rf.PaymentID] = rf.APIKey
	}
	ids := slices.Sorted(func(yield func(string) bool) {
		for id := range byPayment {
			if !yield(id) {
				return
			}
		}
	})
	hc := newClient(16)
	defer hc.CloseIdleConnections()
	c := refundChecker{hc: hc, api: strings.TrimRight(apiURL, "/"), bank: banksim.Control{URL: simURL, Client: hc},
		pageSize: pageSize, deadline: time.Now().Add(refundSettle)}
	var mu sync.Mutex
	err = parallel(ctx, len(ids), 16, func(ctx context.Context, i int) error {
		checked, doubles, problems, err := c.check(ctx, keys[ids[i]], ids[i], byPayment[ids[i]])
		mu.Lock()
		defer mu.Unlock()
		v.RefundsChecked += checked
		v.RefundDoubles += doubles
		v.RefundProblems = append(v.RefundProblems, problems...)
		return err
	})
	slices.Sort(v.RefundProblems)
	return v, err
}

// refundChecker reads payments and refunds back from kasa, and the bank's refunds.
type refundChecker struct {
	hc       *http.Client
	api      string
	bank     banksim.Control
	pageSize int
	deadline time.Time
}

type refundResource struct {
	ID, Status, Amount, Currency string
}

func (c refundChecker) check(ctx context.Context, key, paymentID string, seen []string) (checked, doubles int, problems []string, err error) {
	var refunds []refundResource
	for {
		if refunds, err = c.list(ctx, key, paymentID); err != nil {
			return 0, 0, nil, err
		}
		processing := slices.ContainsFunc(refunds, func(r refundResource) bool { return r.Status == string(payment.StatusProcessing) })
		if !processing || time.Now().After(c.deadline) {
			break
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return 0, 0, nil, err
		}
	}
	var p struct {
		AmountRefunded string `json:"amount_refunded"`
		Currency       string `json:"currency"`
	}
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
		w, final := map[string]int{string(payment.StatusSucceeded): 1, string(payment.StatusFailed): 0}[r.Status]
		switch {
		case n > 1 || (final && n != w):
			if n > 1 {
				doubles++
			}
			problems = append(problems, fmt.Sprintf("refund %s of payment %s: %s in kasa, refunded %d times at the bank", r.ID, paymentID, r.Status, n))
		case r.Status == string(payment.StatusProcessing):
			problems = append(problems, fmt.Sprintf("refund %s of payment %s: still processing %s after the run", r.ID, paymentID, refundSettle))
		}
		if r.Status == string(payment.StatusSucceeded) {
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
func (c refundChecker) list(ctx context.Context, key, paymentID string) ([]refundResource, error) {
	var all []refundResource
	for after := ""; ; {
		u := fmt.Sprintf("%s/v1/payments/%s/refunds?limit=%d", c.api, paymentID, c.pageSize)
		if after != "" {
			u += "&starting_after=" + url.QueryEscape(after)
		}
		var page struct {
			Data    []refundResource `json:"data"`
			HasMore bool             `json:"has_more"`
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
