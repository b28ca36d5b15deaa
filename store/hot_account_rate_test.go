package store_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// TestHotAccountRate measures how fast the store finalizes payments, at 32 concurrent clients,
// when they all pay one merchant and when they are spread over 1,000 merchants: the settlement
// account of a single merchant must not be the ceiling. It is a measurement, not a check, so it
// runs only when KASA_HOT_ACCOUNT_BENCH is set (its value, when a number, is the payments per
// run; KASA_HOT_ACCOUNT_ROUNDS the runs of each case, alternated).
//
//	KASA_HOT_ACCOUNT_BENCH=8000 go test ./store/ -run TestHotAccountRate -count=1 -v
func TestHotAccountRate(t *testing.T) {
	v := os.Getenv("KASA_HOT_ACCOUNT_BENCH")
	if v == "" {
		t.Skip("a measurement: set KASA_HOT_ACCOUNT_BENCH to run it")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		n = 8000
	}
	rounds := 3
	if r, err := strconv.Atoi(os.Getenv("KASA_HOT_ACCOUNT_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	const clients, payers = 32, 1000
	ctx := context.Background()
	rates := map[int][]float64{}
	for round := range rounds {
		for _, merchants := range []int{1, 1000} {
			own, err := store.Open(ctx, store.Options{URL: env.OwnDatabase(t), SecretKey: testkit.SecretKey, Migrate: true, MaxConns: clients + 4})
			require.NoError(t, err)
			// payers customer accounts, spread over the merchants, each funded far beyond the run.
			ms := make([]uuid.UUID, merchants)
			accts := make([]testkit.Merchant, payers)
			parallel(t, clients, merchants, func(i int) error {
				ms[i] = payment.NewID()
				return own.CreateMerchant(ctx, payment.Merchant{ID: ms[i], Name: "m"}, payment.NewSecret("sk_"), "whsec")
			})
			parallel(t, clients, payers, func(i int) error {
				a, err := own.CreateAccount(ctx, ms[i%merchants], "TRY")
				if err != nil {
					return err
				}
				accts[i] = testkit.Merchant{ID: ms[i%merchants], Account: a.ID}
				_, _, err = own.Deposit(ctx, a.ID, "seed", 1_000_000_000)
				return err
			})
			// Every payment begun and reserved first: the run times Finalize alone.
			ids := make([]uuid.UUID, n)
			parallel(t, clients, n, func(i int) error {
				m := accts[i%payers]
				key := uuid.NewString()
				req := payment.Request{InvoiceID: key, AmountMinor: 100 + int64(i%900), Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
				_, p, _, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
				if err != nil {
					return err
				}
				ids[i] = p.ID
				return own.Reserve(ctx, p.ID)
			})
			start := time.Now()
			parallel(t, clients, n, func(i int) error {
				_, err := own.Finalize(ctx, ids[i], "ch")
				return err
			})
			rate := float64(n) / time.Since(start).Seconds()
			rates[merchants] = append(rates[merchants], rate)
			t.Logf("round %d: %4d merchant(s): %d finalizes at %d clients: %.0f/s", round+1, merchants, n, clients, rate)
			problems, err := own.Verify(ctx)
			require.NoError(t, err)
			require.Empty(t, problems)
			own.Close()
		}
	}
	one, many := median(rates[1]), median(rates[1000])
	t.Logf("median of %d rounds: 1 merchant %.0f/s, 1,000 merchants %.0f/s, ratio %.2f", rounds, one, many, one/many)
}

// parallel runs fn(0..n-1) on workers goroutines and fails the test on the first error.
func parallel(t *testing.T, workers, n int, fn func(i int) error) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					errs <- fmt.Errorf("item %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs)
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
