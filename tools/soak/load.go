package soak

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/kasa-pay/kasa/payment"
)

// merchant is a merchant the soak made, with its accounts.
type merchant struct {
	ID, APIKey string
	Accounts   []account
}

type account struct {
	ID      string
	Deposit int64 // minor units
}

// keyRecord is everything the client learned sending one idempotency key: a payment's, a
// refund's (Of: its payment's key), or a manual payment's capture or cancel (Target: its payment's).
type keyRecord struct {
	Key      string
	Merchant *merchant
	Account  string // the payer's: a payment debits it, a refund credits it
	Amount   int64  // a capture's: what it asks for
	body     []byte
	Of       *keyRecord // a refund's payment
	refunds  []int64    // a payment's: the refunds to ask for once it succeeded (was captured)
	expires  bool       // the key's record may expire during the run (a short retention)
	other    []byte     // another request sent under the key once it was answered, or none
	// A manual payment's: the command sent once authorized ("": left to expire), and a capture's
	// amount (0: all of it).
	manual  bool
	next    payment.Command
	capture int64
	command payment.Command // a capture's or cancel's key: the command, and its payment's key
	Target  *keyRecord

	mu         sync.Mutex
	ids        map[string]bool // payment ids answered for the key: one, unless an expired key paid again
	ID         string          // the latest one
	Statuses   map[int]int     // of the client's POSTs; 0: no answer
	unexpected []string
	sawUnknown bool
	refused    bool           // a command answered 409: its payment no longer waited for one
	decided    payment.Status // the final status an answer showed (requires_capture for a manual payment)
	history    []op           // every request sent under the key, for the linearizability check
}

// path is where the key's request goes.
func (k *keyRecord) path() string {
	switch {
	case k.command != "":
		return "/v1/payments/" + k.Target.id() + "/" + string(k.command)
	case k.Of != nil:
		return "/v1/payments/" + k.Of.id() + "/refunds"
	}
	return "/v1/payments"
}

func (k *keyRecord) id() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ID
}

// record notes the answer to a request sent at call: whether kasa took the key, whether to retry.
func (k *keyRecord) record(call time.Time, r answer, err error) (accepted, retry bool) {
	o := k.note(opOf(call, r, err))
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		k.Statuses[0]++ // no answer: a timeout or a lost connection
		return false, true
	}
	k.Statuses[r.status]++
	switch r.status {
	case http.StatusCreated, http.StatusAccepted, http.StatusPaymentRequired, http.StatusOK: // 200: a cancel's
		if o.Payment == "" {
			k.unexpected = append(k.unexpected, fmt.Sprintf("%d with a body that is not a payment: %.200s", r.status, r.body))
			return false, false
		}
		k.ID = o.Payment
		k.ids[o.Payment] = true
		k.sawUnknown = k.sawUnknown || o.Resource == payment.StatusUnknown
		if o.Resource.Final() || o.Resource == payment.StatusRequiresCapture && k.command == "" {
			k.decided = o.Resource
		}
		return true, false
	case http.StatusServiceUnavailable, http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout,
		http.StatusTooManyRequests:
		return false, true // a careful client retries any 5xx, and a 429 after its Retry-After, with the same key
	case http.StatusConflict, http.StatusUnprocessableEntity:
		switch {
		case o.Code == "idempotency_key_in_use":
			return false, true
		case k.command != "" && o.Code == refusalCode(k.command):
			k.refused = true
			return false, false // the payment no longer waits for a command: the key keeps nothing
		case k.expires && (o.Code == "duplicate_payment" || o.Code == "idempotency_key_reused"):
			if o.Payment != "" { // the invoice's payment: the key's, or a later attempt's after a failure
				k.ids[o.Payment] = true
			}
			return false, false // the key's record expired: the history's check says whether it may have
		}
	}
	k.unexpected = append(k.unexpected, fmt.Sprintf("%d %.200s", r.status, r.body))
	return false, false
}

// note adds a POST of the key's request to its history.
func (k *keyRecord) note(o op) op {
	o.Request = sha256Hex(k.body)
	return k.add(o)
}

func (k *keyRecord) add(o op) op {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.history = append(k.history, o)
	return o
}

func sha256Hex(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

func (k *keyRecord) kind() keyKind {
	return keyKind{refund: k.Of != nil, expires: k.expires, manual: k.manual, command: k.command, request: sha256Hex(k.body)}
}

func (k *keyRecord) accepted() bool { return k.id() != "" }

// load sends new payments at a steady rate; each key's client retries it (same key, same body)
// until kasa takes it, and some keys are sent twice at once or again after their answer. Some
// succeeded payments are refunded in one or two parts; one in five is manual, and then captured
// in part or whole, canceled, or left to expire. Each refund or command is a key of its own.
type load struct {
	api       *api
	rate      float64
	merchants []*merchant
	rng       *rand.Rand
	inflight  chan struct{} // caps the clients running at once
	expires   bool          // records may expire during the run

	mu   sync.Mutex
	keys []*keyRecord
	fig  *Report // whose counts of keys the load keeps
	wg   sync.WaitGroup
}

const maxInflight = 500

func newLoad(a *api, rate float64, seed int64, merchants []*merchant, expires bool, rep *Report) *load {
	return &load{api: a, rate: rate, merchants: merchants, expires: expires, fig: rep,
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
			l.count(true, &l.fig.Skipped)
			continue
		}
		l.add(k)
		l.count(k.manual, &l.fig.Manual.Keys)
		l.count(twice, &l.fig.DupNow)
		l.count(again, &l.fig.DupLate)
		l.wg.Go(func() {
			defer func() { <-l.inflight }()
			l.drive(retryCtx, k, twice, again)
		})
	}
}

// newKey draws a payment: some to an account that runs dry (insufficient_funds); one in five manual.
func (l *load) newKey(key string) *keyRecord {
	m := l.merchants[l.rng.IntN(len(l.merchants))]
	acct := m.Accounts[0]
	if len(m.Accounts) > 1 && l.rng.Float64() < 0.2 {
		acct = m.Accounts[1]
	}
	amount := int64(100 + l.rng.IntN(4901))
	manual := l.rng.Float64() < manualShare
	body := func(amount int64) []byte {
		fields := map[string]string{"invoice_id": "inv-" + key, "amount": payment.FormatAmount(amount, "TRY"), "currency": "TRY", "account_id": acct.ID}
		if manual {
			fields["capture"] = payment.CaptureManual
		}
		b, _ := json.Marshal(fields)
		return b
	}
	k := &keyRecord{Key: key, Merchant: m, Account: acct.ID, Amount: amount, body: body(amount), expires: l.expires, manual: manual}
	// Another request under the key, which must answer 422 (a new payment if the key expired).
	if reuse := l.rng.Float64() < 0.05; reuse && !l.expires {
		k.other = body(amount + 1)
	}
	paid := amount
	switch r := l.rng.Float64(); {
	case manual && r < 0.6: // a part, or (one in four) all of it
		k.next = payment.CommandCapture
		if l.rng.IntN(4) > 0 {
			k.capture = 1 + l.rng.Int64N(amount)
			paid = k.capture
		}
	case manual && r < 0.8:
		k.next = payment.CommandCancel
		return k
	case manual: // left to expire
		return k
	}
	switch r := l.rng.Float64(); { // what was paid: a manual payment's capture
	case r < refundShare/2: // the whole amount
		k.refunds = []int64{paid}
	case r < refundShare && paid > 1: // two parts at once: together never more than was paid
		k.refunds = []int64{paid / 2, paid - paid/2}
	}
	return k
}

// The shares of payments that are manual (authorize now, capture later), and that are refunded.
const manualShare, refundShare = 0.2, 0.3

// refundKey is the key of a refund of part of k's payment.
func (l *load) refundKey(k *keyRecord, i int, amount int64) *keyRecord {
	body, _ := json.Marshal(map[string]string{"amount": payment.FormatAmount(amount, "TRY")})
	l.count(true, &l.fig.RefundKeys)
	return l.add(&keyRecord{Key: fmt.Sprintf("%s-r%d", k.Key, i), Merchant: k.Merchant, Account: k.Account, Amount: amount, body: body,
		Of: k, expires: k.expires})
}

// add makes k one of the load's keys.
func (l *load) add(k *keyRecord) *keyRecord {
	k.ids, k.Statuses = map[string]bool{}, map[int]int{}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keys = append(l.keys, k)
	return k
}

// count adds one to a figure of the report if yes.
func (l *load) count(yes bool, figure *int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if yes {
		*figure++
	}
}

// drive sends k until kasa takes it, again if asked, then its capture or cancel, or its refunds
// once its payment succeeded. Those inherit k's duplication.
func (l *load) drive(ctx context.Context, k *keyRecord, twice, again bool) {
	var twin sync.WaitGroup
	if twice {
		twin.Go(func() { l.untilAccepted(ctx, k) })
	}
	l.untilAccepted(ctx, k)
	if again && k.accepted() && sleep(ctx, rand.N(2*time.Second)) == nil {
		call := time.Now()
		r, err := l.api.post(k)
		k.record(call, r, err)
	}
	if k.other != nil && k.accepted() {
		call := time.Now()
		r, err := l.api.call("POST", l.api.base+k.path(), k.Merchant.APIKey, k.other, "Idempotency-Key", k.Key)
		o := opOf(call, r, err)
		o.Request = sha256Hex(k.other)
		k.add(o)
		l.count(true, &l.fig.Reused)
	}
	twin.Wait()
	l.command(ctx, k, twice, again)
	if !k.manual && len(k.refunds) > 0 && k.accepted() && l.outcome(ctx, k) == payment.StatusSucceeded {
		l.sendRefunds(ctx, k, twice, again)
	}
}

// sendRefunds sends k's planned refunds, all at once.
func (l *load) sendRefunds(ctx context.Context, k *keyRecord, twice, again bool) {
	var wg sync.WaitGroup
	for i, amount := range k.refunds {
		r := l.refundKey(k, i+1, amount)
		wg.Go(func() { l.drive(ctx, r, twice, again) })
	}
	wg.Wait()
}

// command sends k's planned capture or cancel once its payment is authorized, after a pause of
// up to commandDelay (some then meet the expiry).
func (l *load) command(ctx context.Context, k *keyRecord, twice, again bool) {
	if k.next == "" || !k.accepted() || l.outcome(ctx, k) != payment.StatusRequiresCapture {
		return
	}
	if sleep(ctx, rand.N(commandDelay)) != nil {
		return
	}
	body, amount := []byte("{}"), k.Amount
	if k.capture > 0 {
		amount = k.capture
		body, _ = json.Marshal(map[string]string{"amount": payment.FormatAmount(amount, "TRY")})
	}
	c := l.add(&keyRecord{Key: k.Key + "-" + string(k.next), Merchant: k.Merchant, Account: k.Account, Amount: amount, body: body,
		command: k.next, Target: k})
	l.count(k.next == payment.CommandCapture, &l.fig.Manual.Captures)
	l.count(k.next == payment.CommandCancel, &l.fig.Manual.Cancels)
	l.drive(ctx, c, twice, again)
	// Only on the capture's own answer: a read would mark the key answered for the replay check.
	c.mu.Lock()
	captured := c.decided == payment.StatusSucceeded
	c.mu.Unlock()
	if captured {
		l.sendRefunds(ctx, k, twice, again)
	}
}

// commandDelay bounds the pause before a manual payment's command: about half the soak's
// capture window.
const commandDelay = 12 * time.Second

// refusalCode is the 409 that refuses a command whose payment no longer waits for one.
func refusalCode(c payment.Command) string {
	return map[payment.Command]string{payment.CommandCapture: "payment_not_capturable", payment.CommandCancel: "payment_not_cancelable"}[c]
}

// outcome is the status k's payment was answered with (final, or requires_capture), reading it
// for up to half a minute while no answer showed one.
func (l *load) outcome(ctx context.Context, k *keyRecord) payment.Status {
	for end := time.Now().Add(30 * time.Second); ; {
		k.mu.Lock()
		decided := k.decided
		k.mu.Unlock()
		if decided != "" || time.Now().After(end) {
			return decided
		}
		if sleep(ctx, time.Second) != nil {
			return ""
		}
		if p, ok, err := l.api.resource(k.Merchant.APIKey, "/v1/payments/"+k.id()); err == nil && ok && p.Status.Answered() {
			k.mu.Lock()
			k.decided = p.Status
			k.mu.Unlock()
		}
	}
}

// untilAccepted sends the key until kasa answers it with a payment, a non-retryable answer, or ctx ends.
func (l *load) untilAccepted(ctx context.Context, k *keyRecord) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		call := time.Now()
		r, err := l.api.post(k)
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
	return slices.Clone(l.keys)
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
