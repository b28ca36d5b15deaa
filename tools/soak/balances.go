package soak

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kasa-pay/kasa/payment"
)

// balanceWatch reads every account while the load and the faults run, not only at the end: no
// balance, and nothing available (balance less reserved), may ever read negative. A reading that
// fails (the API is down on purpose) is skipped.
type balanceWatch struct {
	mu    sync.Mutex
	check Check
	done  chan struct{}
}

// watchBalances reads every merchant's accounts every interval until ctx ends.
func watchBalances(ctx context.Context, a *api, merchants []*merchant, every time.Duration) *balanceWatch {
	w := &balanceWatch{check: Check{Name: "no balance or available amount read negative during the run"}, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			for _, m := range merchants {
				for _, acct := range m.Accounts {
					w.read(a, m.APIKey, acct.ID)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *balanceWatch) read(a *api, apiKey, id string) {
	r, err := a.call("GET", a.base+"/v1/accounts/"+id, apiKey, nil)
	if err != nil || r.status != http.StatusOK {
		return
	}
	var acct struct{ Balance, Reserved, Currency string }
	if json.Unmarshal(r.body, &acct) != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.check.Checked++
	balance, err1 := signedAmount(acct.Balance, acct.Currency)
	reserved, err2 := signedAmount(acct.Reserved, acct.Currency)
	switch {
	case err1 != nil || err2 != nil:
		w.check.fail("account %s: unreadable amounts %q, %q", id, acct.Balance, acct.Reserved)
	case balance < 0 || reserved < 0 || balance-reserved < 0:
		w.check.fail("account %s at %s: balance %s, reserved %s", id, time.Now().UTC().Format(time.TimeOnly), acct.Balance, acct.Reserved)
	}
}

// signedAmount reads an amount as the API writes it, zero and negative ones too, in minor units.
func signedAmount(s, currency string) (int64, error) {
	abs, neg := strings.CutPrefix(s, "-")
	n, err := payment.ParseAmount(abs, currency)
	if errors.Is(err, payment.ErrNonPositiveAmount) {
		n, err = 0, nil
	}
	if neg {
		n = -n
	}
	return n, err
}

// result waits for the watch to end (its ctx ended) and returns its check.
func (w *balanceWatch) result() Check {
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.check
	c.OK = c.Violations == 0 && c.Checked > 0
	if c.Checked == 0 {
		c.fail("no reading succeeded")
	}
	return c
}
