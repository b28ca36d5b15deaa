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

// watch takes a reading every interval while the load, the faults and the settling run, not only
// at the end. A reading that cannot be taken (a server is down on purpose) is skipped.
type watch struct {
	mu    sync.Mutex
	check Check
	tries int // readings taken or skipped: a test waits for the first
	done  chan struct{}
}

// startWatch calls read now, then every interval, until ctx ends.
func startWatch(ctx context.Context, name string, every time.Duration, read func(c *Check)) *watch {
	w := &watch{check: Check{Name: name}, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			w.mu.Lock()
			read(&w.check)
			w.tries++
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// watchBalances reads every merchant's account every interval: no balance, and nothing available
// (balance less reserved), may ever read negative.
func watchBalances(ctx context.Context, a *api, merchants []*merchant, every time.Duration) *watch {
	return startWatch(ctx, "no balance or available amount read negative during the run", every, func(c *Check) {
		for _, m := range merchants {
			for _, acct := range m.Accounts {
				readBalance(c, a, m.APIKey, acct.ID)
			}
		}
	})
}

// watchVerify runs `kasa verify` every interval: each of its invariants is one query, so each
// reading is of one consistent state, whatever is in flight; the ledger sums to zero in each.
func (s *stack) watchVerify(ctx context.Context, every time.Duration) *watch {
	return startWatch(ctx, "kasa verify is clean at any time during the run", every, func(c *Check) {
		out, err := s.tool(ctx, "verify")
		_, problems, found := strings.Cut(out, "problem(s):")
		switch {
		case found:
			c.Checked++
			for _, line := range strings.Split(strings.TrimSpace(problems), "\n") {
				c.fail("at %s: %s", time.Now().UTC().Format(time.TimeOnly), strings.TrimPrefix(strings.TrimSpace(line), "- "))
			}
		case err == nil:
			c.Checked++
		}
	})
}

func readBalance(c *Check, a *api, apiKey, id string) {
	r, err := a.call("GET", a.base+"/v1/accounts/"+id, apiKey, nil)
	if err != nil || r.status != http.StatusOK {
		return
	}
	var acct struct{ Balance, Reserved, Currency string }
	if json.Unmarshal(r.body, &acct) != nil {
		return
	}
	balance, err1 := signedAmount(acct.Balance, acct.Currency)
	reserved, err2 := signedAmount(acct.Reserved, acct.Currency)
	c.Checked++
	switch {
	case err1 != nil || err2 != nil:
		c.fail("account %s: unreadable amounts %q, %q", id, acct.Balance, acct.Reserved)
	case balance < 0 || reserved < 0 || balance-reserved < 0:
		c.fail("account %s at %s: balance %s, reserved %s", id, time.Now().UTC().Format(time.TimeOnly), acct.Balance, acct.Reserved)
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
func (w *watch) result() Check {
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.check
	if c.Checked == 0 {
		c.fail("no reading succeeded")
	}
	return c.done()
}
