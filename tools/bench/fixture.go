package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/kasa-pay/kasa/payment"
)

// Fixture is what Setup created: the merchants, their API keys and funded payer accounts.
type Fixture struct{ Merchants []Merchant }

// Merchant is one benchmark merchant. All its payments credit its one settlement account, which
// makes that account a hot row: more merchants spread the load.
type Merchant struct {
	ID     string
	APIKey string   `json:"api_key"`
	Payers []string // payer account ids
}

const (
	// deposit, in every payer account, affords 100,000 maximal payments: far more than any run
	// here sends, so only Insufficient fails.
	deposit       = maxAmount * 100_000
	setupParallel = 32 // concurrent admin calls; Setup of 1000 merchants takes seconds
)

// Setup creates opts.Merchants merchants with opts.Payers funded payer accounts each (admin API).
func Setup(ctx context.Context, opts Options) (*Fixture, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	hc := newClient(setupParallel)
	defer hc.CloseIdleConnections()
	fx := &Fixture{Merchants: make([]Merchant, opts.Merchants)}
	admin := func(ctx context.Context, path, key string, in map[string]string, out any) error {
		body, _ := json.Marshal(in)
		return call(ctx, hc, request{method: http.MethodPost, url: opts.APIURL + "/admin/v1" + path, token: opts.AdminToken, key: key, body: body}, out)
	}
	err = parallel(ctx, opts.Merchants, setupParallel, func(ctx context.Context, i int) error {
		fx.Merchants[i].Payers = make([]string, opts.Payers)
		return admin(ctx, "/merchants", "", map[string]string{"name": fmt.Sprintf("bench-%d", i)}, &fx.Merchants[i])
	})
	if err != nil {
		return nil, err
	}
	amount := payment.FormatAmount(deposit, currency)
	err = parallel(ctx, opts.Merchants*opts.Payers, setupParallel, func(ctx context.Context, i int) error {
		m := &fx.Merchants[i/opts.Payers]
		var acct struct{ ID string }
		if err := admin(ctx, "/accounts", "", map[string]string{"merchant_id": m.ID, "currency": currency}, &acct); err != nil {
			return err
		}
		m.Payers[i%opts.Payers] = acct.ID
		return admin(ctx, "/accounts/"+acct.ID+"/deposits", uuid.NewString(), map[string]string{"amount": amount}, nil)
	})
	return fx, err
}

// CheckCharges asks the bank simulator how many of the payments were charged more than once.
func CheckCharges(ctx context.Context, simURL string, ids []string) (doubles int, err error) {
	_, doubles, _, err = checkEach(ctx, "", simURL, 0, 0, ids,
		func(ctx context.Context, c checker, id string) (int, int, []string, error) {
			m, err := c.bank.Charges(ctx, id)
			if err != nil {
				return 0, 0, nil, fmt.Errorf("bench: %w", err)
			} else if m.Count > 1 {
				return 1, 1, nil, nil
			}
			return 1, 0, nil, nil
		})
	return doubles, err
}

// call sends r and decodes a 2xx JSON answer into out; anything else is an error quoting the body.
func call(ctx context.Context, hc *http.Client, r request, out any) error {
	o := send(ctx, hc, r)
	switch {
	case o.err != nil:
		return o.err
	case o.code/100 != 2:
		return fmt.Errorf("%s %s: %d: %s", r.method, r.url, o.code, strings.TrimSpace(string(o.body)))
	case out == nil:
		return nil
	}
	return json.Unmarshal(o.body, out)
}

// parallel calls fn for 0..n-1 on at most workers goroutines and stops at the first error.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i := range n {
		g.Go(func() error { return fn(ctx, i) })
	}
	return g.Wait()
}
