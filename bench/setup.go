package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
)

// Fixture is what Setup created: the merchants, their API keys and funded payer accounts.
type Fixture struct {
	Currency  string
	Deposit   int64 // minor units deposited into every payer account
	Merchants []Merchant
}

// Merchant is one benchmark merchant. All its payments credit its one settlement account, which
// makes that account a hot row: more merchants spread the load.
type Merchant struct {
	ID     string
	APIKey string
	Payers []string // payer account ids
}

// MerchantIDs lists the fixture's merchant ids.
func (fx *Fixture) MerchantIDs() []string {
	ids := make([]string, len(fx.Merchants))
	for i, m := range fx.Merchants {
		ids[i] = m.ID
	}
	return ids
}

const (
	// depositPayments is how many maximal payments every payer can afford: far more than any run
	// here sends (a few hundred payments/s over all payers), so only InsufficientShare fails.
	depositPayments = 100_000
	setupParallel   = 32 // concurrent admin calls; Setup of 1000 merchants takes seconds
	checkParallel   = 16
)

// Setup creates opts.Merchants merchants with opts.Payers funded payer accounts each through the
// admin API.
func Setup(ctx context.Context, opts Options) (*Fixture, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	hc := newClient(setupParallel)
	defer hc.CloseIdleConnections()
	fx := &Fixture{
		Currency:  opts.Currency,
		Deposit:   opts.MaxAmount * depositPayments,
		Merchants: make([]Merchant, opts.Merchants),
	}
	admin := opts.APIURL + "/admin/v1"
	err = parallel(ctx, opts.Merchants, setupParallel, func(ctx context.Context, i int) error {
		var out struct {
			ID     string `json:"id"`
			APIKey string `json:"api_key"`
		}
		in := map[string]string{"name": fmt.Sprintf("bench-%d", i)}
		if err := postJSON(ctx, hc, admin+"/merchants", opts.AdminToken, "", in, &out); err != nil {
			return fmt.Errorf("bench: create merchant: %w", err)
		}
		fx.Merchants[i] = Merchant{ID: out.ID, APIKey: out.APIKey, Payers: make([]string, opts.Payers)}
		return nil
	})
	if err != nil {
		return nil, err
	}
	amount := payment.FormatAmount(fx.Deposit, fx.Currency)
	err = parallel(ctx, opts.Merchants*opts.Payers, setupParallel, func(ctx context.Context, i int) error {
		m := &fx.Merchants[i/opts.Payers]
		var acct struct {
			ID string `json:"id"`
		}
		in := map[string]string{"merchant_id": m.ID, "currency": fx.Currency}
		if err := postJSON(ctx, hc, admin+"/accounts", opts.AdminToken, "", in, &acct); err != nil {
			return fmt.Errorf("bench: create account: %w", err)
		}
		dep := map[string]string{"amount": amount}
		if err := postJSON(ctx, hc, admin+"/accounts/"+acct.ID+"/deposits", opts.AdminToken, uuid.NewString(), dep, nil); err != nil {
			return fmt.Errorf("bench: deposit: %w", err)
		}
		m.Payers[i%opts.Payers] = acct.ID
		return nil
	})
	if err != nil {
		return nil, err
	}
	return fx, nil
}

// CheckCharges asks the bank simulator how often money moved for each payment id and returns how
// many were charged more than once.
func CheckCharges(ctx context.Context, simURL string, ids []string) (doubles int, err error) {
	hc := newClient(checkParallel)
	defer hc.CloseIdleConnections()
	base := strings.TrimRight(simURL, "/") + "/_sim/charges?reference="
	var n atomic.Int64
	err = parallel(ctx, len(ids), checkParallel, func(ctx context.Context, i int) error {
		var out struct {
			Count *int `json:"count"`
		}
		if err := getJSON(ctx, hc, base+url.QueryEscape(ids[i]), &out); err != nil {
			return fmt.Errorf("bench: charges of %s: %w", ids[i], err)
		}
		if out.Count == nil {
			return fmt.Errorf("bench: charges of %s: answer without count", ids[i])
		}
		if *out.Count > 1 {
			n.Add(1)
		}
		return nil
	})
	return int(n.Load()), err
}

// parallel calls fn for 0..n-1 on at most workers goroutines and stops at the first error.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

func postJSON(ctx context.Context, hc *http.Client, url, token, key string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return do(hc, req, out)
}

func getJSON(ctx context.Context, hc *http.Client, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	return do(hc, req, out)
}

// do sends req and decodes a 2xx JSON answer into out; anything else is an error quoting the body.
func do(hc *http.Client, req *http.Request, out any) error {
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", req.Method, req.URL.Path, resp.Status, bytes.TrimSpace(b))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}
