package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/kasa-pay/kasa/payment"
)

// merchant is a merchant the soak made, with its accounts.
type merchant struct {
	ID, APIKey, WebhookSecret string
	Accounts                  []account
}

type account struct {
	ID      string
	Deposit int64 // minor units
}

// keyRecord is everything the client learned paying one idempotency key.
type keyRecord struct {
	Key      string
	Merchant *merchant
	Account  string
	Amount   int64
	body     []byte

	mu         sync.Mutex
	ids        map[string]bool // payment ids answered for the key: exactly one is right
	ID         string          // the first one
	Sends      int
	Statuses   map[int]int
	unexpected []string
	sawUnknown bool
	history    []op // every request sent under the key, for the linearizability check
}

// record notes the answer to a request sent at call, and says whether kasa took the key and
// whether a client retries it.
func (k *keyRecord) record(call time.Time, r answer, err error) (accepted, retry bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	o := opOf(call, r, err)
	k.history = append(k.history, o)
	k.Sends++
	if err != nil {
		k.Statuses[0]++ // no answer: a timeout or a lost connection
		return false, true
	}
	k.Statuses[r.status]++
	switch r.status {
	case http.StatusCreated, http.StatusAccepted, http.StatusPaymentRequired:
		if o.Payment == "" {
			k.unexpected = append(k.unexpected, fmt.Sprintf("%d with a body that is not a payment: %.200s", r.status, r.body))
			return false, false
		}
		if k.ID == "" {
			k.ID = o.Payment
		}
		k.ids[o.Payment] = true
		k.sawUnknown = k.sawUnknown || o.Resource == payment.StatusUnknown
		return true, false
	case http.StatusServiceUnavailable, http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout,
		http.StatusTooManyRequests:
		return false, true // a careful client retries any 5xx, and a 429 after its Retry-After, with the same key
	case http.StatusConflict:
		if o.Code == "idempotency_key_in_use" {
			return false, true
		}
	}
	k.unexpected = append(k.unexpected, fmt.Sprintf("%d %.200s", r.status, r.body))
	return false, false
}

func (k *keyRecord) accepted() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ID != ""
}

// load sends new payments at a steady rate; each key's client retries it (same key, same body)
// until kasa takes it, and some keys are sent twice at once or sent again after their answer.
type load struct {
	api       *api
	rate      float64
	merchants []*merchant
	rng       *rand.Rand
	inflight  chan struct{} // caps the clients running at once

	mu      sync.Mutex
	keys    []*keyRecord
	skipped int // keys not sent because too many clients were still retrying
	dupNow  int // keys sent twice at once
	dupLate int // keys sent again after their answer
	wg      sync.WaitGroup
}

const maxInflight = 500

func newLoad(a *api, rate float64, seed int64, merchants []*merchant) *load {
	return &load{api: a, rate: rate, merchants: merchants,
		rng: rand.New(rand.NewPCG(uint64(seed), 0x6c6f6164)), inflight: make(chan struct{}, maxInflight)}
}

// run starts new keys at the rate until ctx ends; their clients retry until retryCtx ends.
func (l *load) run(ctx, retryCtx context.Context, runID string) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / l.rate))
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		k := l.newKey(fmt.Sprintf("%s-%06d", runID, n))
		twice, again := l.rng.Float64() < 0.1, l.rng.Float64() < 0.25
		select {
		case l.inflight <- struct{}{}:
		default:
			l.mu.Lock()
			l.skipped++
			l.mu.Unlock()
			continue
		}
		l.mu.Lock()
		l.keys = append(l.keys, k)
		if twice {
			l.dupNow++
		}
		if again {
			l.dupLate++
		}
		l.mu.Unlock()
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-l.inflight }()
			l.drive(retryCtx, k, twice, again)
		}()
	}
}

// newKey draws a payment: most go to well-funded accounts, one in ten to an account that runs
// dry (insufficient_funds).
func (l *load) newKey(key string) *keyRecord {
	m := l.merchants[l.rng.IntN(len(l.merchants))]
	acct := m.Accounts[0]
	if len(m.Accounts) > 1 && l.rng.Float64() < 0.2 {
		acct = m.Accounts[1]
	}
	amount := int64(100 + l.rng.IntN(4901))
	body, _ := json.Marshal(map[string]string{
		"invoice_id": "inv-" + key, "amount": payment.FormatAmount(amount, "TRY"), "currency": "TRY", "account_id": acct.ID,
	})
	return &keyRecord{Key: key, Merchant: m, Account: acct.ID, Amount: amount, body: body,
		ids: map[string]bool{}, Statuses: map[int]int{}}
}

func (l *load) drive(ctx context.Context, k *keyRecord, twice, again bool) {
	if twice {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); l.untilAccepted(ctx, k) }()
		defer wg.Wait()
	}
	l.untilAccepted(ctx, k)
	if again && k.accepted() {
		if sleep(ctx, time.Duration(rand.Int64N(int64(2*time.Second)))) == nil {
			call := time.Now()
			r, err := l.api.pay(k.Merchant.APIKey, k.Key, k.body)
			k.record(call, r, err)
		}
	}
}

// untilAccepted sends the key until kasa answers it with a payment, a non-retryable answer, or ctx ends.
func (l *load) untilAccepted(ctx context.Context, k *keyRecord) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		call := time.Now()
		r, err := l.api.pay(k.Merchant.APIKey, k.Key, k.body)
		accepted, retry := k.record(call, r, err)
		if accepted || !retry {
			return
		}
		backoff := min(2*time.Second, 250*time.Millisecond<<min(attempt, 4))
		wait := backoff/2 + time.Duration(rand.Int64N(int64(backoff/2)))
		if after, ok := retryAfter(r); ok && err == nil {
			wait = min(after, 10*time.Second) // as the answer asks
		}
		if sleep(ctx, wait) != nil {
			return
		}
	}
}

func (l *load) snapshot() []*keyRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*keyRecord(nil), l.keys...)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
