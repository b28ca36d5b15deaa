package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// Fixed ids and times, so that every answer is the same on every run.
var (
	merchantA = uuid.MustParse("0192f1f0-0000-7000-8000-00000000000a")
	merchantB = uuid.MustParse("0192f1f0-0000-7000-8000-00000000000b")
	accountA  = uuid.MustParse("0192f1f0-0000-7000-8000-0000000000a1") // merchant A's, TRY
	accountB  = uuid.MustParse("0192f1f0-0000-7000-8000-0000000000b1") // merchant B's, TRY
	eventID   = uuid.MustParse("0192f1f0-0000-7000-8000-0000000000e1")
	t0        = time.Date(2025, 3, 1, 12, 0, 0, 123456000, time.UTC)
)

// fakeID is the n-th id the fake store mints.
func fakeID(n int) uuid.UUID {
	return uuid.MustParse(fmt.Sprintf("0192f1f0-0000-7000-9000-%012d", n))
}

// completed is the completed record, and the answer its commit stores, of a payment or a
// refund that reached the final status. Every stored answer of the fakes is built here.
func completed(rec store.Record, status payment.Status, op interface{ AnswerBody() ([]byte, error) }) (store.Record, store.Answer) {
	body, err := op.AnswerBody()
	if err != nil {
		panic(err)
	}
	a := store.Answer{Outcome: status, Body: body}
	rec.Status, rec.Outcome, rec.ResponseBody = store.RecordCompleted, a.Outcome, a.Body
	return rec, a
}

// errPanicNow, set as a fake's failure, makes the call panic instead of returning.
var errPanicNow = errors.New("fake panics")

type recordKey struct {
	merchant uuid.UUID
	key      string
}

// fakeStore keeps the API's data in maps and behaves like store.Store where the API can tell.
type fakeStore struct {
	mu         sync.Mutex
	merchants  map[string]payment.Merchant // by API key
	accounts   map[uuid.UUID]payment.Account
	records    map[recordKey]store.Record
	payments   map[uuid.UUID]payment.Payment
	deposits   map[recordKey]store.Deposit // by account id and key
	deliveries []store.Delivery
	keys       map[uuid.UUID]*fakeKey
	watchers   map[uuid.UUID][]chan store.Answer
	fail       map[string]error  // method name -> the error it returns
	before     map[string]func() // method name -> what happens once, just before its next call
	calls      map[string]int
	audit      []store.AuditEntry // every admin call recorded
	minted     map[string]string  // random values the server made -> placeholder in golden files
	lastList   store.ListPaymentsInput
	ids        int

	refunds       map[uuid.UUID]payment.Refund
	refundRecords map[recordKey]store.Record
	held          map[uuid.UUID]int64 // by payment: the amount of its refunds in flight or unknown
	skew          time.Duration       // how far the database's clock is ahead of this host's

	createdAccounts  map[string]uuid.UUID // by creation key
	createdMerchants map[string]fakeCreation
}

// fakeCreation is a merchant's creation under a key: its request's hash and its answer.
type fakeCreation struct {
	hash    string
	created store.MerchantCreated
}

func (f *fakeStore) Now(context.Context) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Now"); err != nil {
		return time.Time{}, err
	}
	return time.Now().Add(f.skew), nil
}

func newFakeStore() *fakeStore {
	f := &fakeStore{
		merchants: map[string]payment.Merchant{
			"sk_a": {ID: merchantA, Name: "Acme", WebhookURL: "https://acme.example/hooks"},
			"sk_b": {ID: merchantB, Name: "Bodega"},
		},
		accounts: map[uuid.UUID]payment.Account{
			accountA: {ID: accountA, MerchantID: merchantA, Kind: "customer", Currency: "TRY", Balance: 100000, Reserved: 2500},
			accountB: {ID: accountB, MerchantID: merchantB, Kind: "customer", Currency: "TRY", Balance: 5000},
		},
		keys:     fakeKeys(),
		records:  map[recordKey]store.Record{},
		payments: map[uuid.UUID]payment.Payment{},
		deposits: map[recordKey]store.Deposit{},
		watchers: map[uuid.UUID][]chan store.Answer{},
		fail:     map[string]error{},
		before:   map[string]func(){},
		calls:    map[string]int{},
		minted:   map[string]string{},

		createdAccounts:  map[string]uuid.UUID{},
		createdMerchants: map[string]fakeCreation{},

		refunds:       map[uuid.UUID]payment.Refund{},
		refundRecords: map[recordKey]store.Record{},
		held:          map[uuid.UUID]int64{},
	}
	f.deliveries = []store.Delivery{{
		ID: eventID, MerchantID: merchantA, AggregateID: fakeID(900), EventType: "payment.succeeded",
		EventCreatedAt: t0, URL: "https://acme.example/hooks", Status: store.DeliveryFailed, AttemptCount: 1,
		LastStatusCode: 500, LastError: "HTTP 500", CreatedAt: t0, UpdatedAt: t0.Add(time.Second),
		Attempts: []store.DeliveryAttempt{{Attempt: 1, StartedAt: t0, Duration: 42 * time.Millisecond, StatusCode: 500, Error: "HTTP 500"}},
	}}
	return f
}

// call counts a call and returns the failure set for it.
func (f *fakeStore) call(name string) error {
	f.calls[name]++
	err := f.fail[name]
	if errors.Is(err, errPanicNow) {
		panic("fake " + name)
	}
	return err
}

// get serves the read name: m[k], or payment.ErrNotFound.
func get[K comparable, V any](f *fakeStore, name string, m map[K]V, k K) (V, error) {
	f.mu.Lock()
	hook := f.before[name]
	delete(f.before, name)
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var none V
	if err := f.call(name); err != nil {
		return none, err
	}
	v, ok := m[k]
	if !ok {
		return none, payment.ErrNotFound
	}
	return v, nil
}

func (f *fakeStore) Ping(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.call("Ping")
}

func (f *fakeStore) CreateMerchant(_ context.Context, m payment.Merchant, apiKey, webhookSecret string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("CreateMerchant"); err != nil {
		return err
	}
	f.merchants[apiKey] = m
	f.minted[m.ID.String()], f.minted[apiKey], f.minted[webhookSecret] = "<merchant-id>", "<api-key>", "<webhook-secret>"
	return nil
}

func (f *fakeStore) MerchantByAPIKey(_ context.Context, apiKey string) (payment.Merchant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("MerchantByAPIKey"); err != nil {
		return payment.Merchant{}, err
	}
	m, ok := f.merchants[apiKey]
	if !ok {
		return m, payment.ErrUnauthorized
	}
	return m, nil
}

func (f *fakeStore) CreateAccountOnce(ctx context.Context, key string, merchantID uuid.UUID, currency string) (payment.Account, bool, error) {
	f.mu.Lock()
	id, ok := f.createdAccounts[key]
	first := f.accounts[id]
	f.mu.Unlock()
	if ok {
		if first.MerchantID != merchantID || first.Currency != currency {
			return payment.Account{}, false, payment.ErrIdempotencyReused
		}
		return first, true, nil
	}
	a, err := f.CreateAccount(ctx, merchantID, currency)
	if err != nil {
		return a, false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.createdAccounts[key] = a.ID
	return a, false, nil
}

func (f *fakeStore) CreateAccount(_ context.Context, merchantID uuid.UUID, currency string) (payment.Account, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("CreateAccount"); err != nil {
		return payment.Account{}, err
	}
	if merchantID != merchantA && merchantID != merchantB {
		return payment.Account{}, payment.ErrNotFound
	}
	f.ids++
	a := payment.Account{ID: fakeID(f.ids), MerchantID: merchantID, Kind: "customer", Currency: currency}
	f.accounts[a.ID] = a
	return a, nil
}

func (f *fakeStore) Account(_ context.Context, id uuid.UUID) (payment.Account, error) {
	return get(f, "Account", f.accounts, id)
}

func (f *fakeStore) Deposit(_ context.Context, accountID uuid.UUID, key string, amount int64) (store.Deposit, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Deposit"); err != nil {
		return store.Deposit{}, false, err
	}
	k := recordKey{accountID, key}
	if d, ok := f.deposits[k]; ok {
		if d.AmountMinor != amount {
			return store.Deposit{}, false, payment.ErrIdempotencyReused
		}
		return d, true, nil
	}
	f.ids++
	d := store.Deposit{ID: fakeID(f.ids), AccountID: accountID, AmountMinor: amount, Currency: f.accounts[accountID].Currency, CreatedAt: t0}
	f.deposits[k] = d
	return d, false, nil
}

// Begin decides the key's owner like store.Store.Begin: an existing record is returned as it
// is, else the payer account and the business key are checked before anything is written.
func (f *fakeStore) Begin(_ context.Context, in store.BeginInput) (store.Record, payment.Payment, store.Began, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Begin"); err != nil {
		return store.Record{}, payment.Payment{}, 0, err
	}
	rec, p, began, err := f.begin(in, time.Now().Add(in.Lease))
	return rec, p, began, err
}

// queuedOf reports whether merchant has a queued payment, as AcquireKey's guard asks.
func (f *fakeStore) queuedOf(merchant uuid.UUID) bool {
	for _, r := range f.records {
		if r.MerchantID == merchant && r.Queued {
			return true
		}
	}
	return false
}

func (f *fakeStore) begin(in store.BeginInput, lockedUntil time.Time) (store.Record, payment.Payment, store.Began, error) {
	if rec, ok := f.records[recordKey{in.MerchantID, in.Key}]; ok {
		return rec, payment.Payment{}, store.BeganExisting, nil
	}
	r := in.Request
	if err := f.refusal(in.MerchantID, r); err != nil {
		return store.Record{}, payment.Payment{}, 0, err
	}
	f.ids++
	p := payment.Payment{
		ID: fakeID(f.ids), MerchantID: in.MerchantID, IdempotencyKey: in.Key, AccountID: r.AccountID,
		AmountMinor: r.AmountMinor, Currency: r.Currency, InvoiceID: r.InvoiceID, PaymentType: r.PaymentType,
		Status: payment.StatusProcessing, CreatedAt: t0, UpdatedAt: t0,
	}
	rec := store.Record{
		MerchantID: in.MerchantID, Key: in.Key, RequestHash: r.Hash(), Status: store.RecordProcessing,
		OperationID: p.ID, LockedUntil: lockedUntil, Scope: store.ScopePayment,
	}
	if in.Queue || f.queuedOf(in.MerchantID) { // queued: no lease, the drainer starts it
		rec.Queued, rec.LockedUntil = true, time.Time{}
	}
	f.payments[p.ID], f.records[recordKey{in.MerchantID, in.Key}] = p, rec
	return rec, p, store.BeganNew, nil
}

// Refusal is store.Store.Refusal: what begin would refuse the request for.
func (f *fakeStore) Refusal(_ context.Context, merchantID uuid.UUID, r payment.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Refusal"); err != nil {
		return err
	}
	return f.refusal(merchantID, r)
}

func (f *fakeStore) refusal(merchantID uuid.UUID, r payment.Request) error {
	acct, ok := f.accounts[r.AccountID]
	if !ok || acct.MerchantID != merchantID {
		return &payment.ValidationError{Fields: []payment.FieldError{{Field: "account_id", Message: "no such account"}}}
	}
	if acct.Currency != r.Currency {
		return &payment.ValidationError{Fields: []payment.FieldError{{Field: "currency", Message: payment.ErrCurrencyMismatch.Error() + " (" + acct.Currency + ")"}}}
	}
	for _, p := range f.payments {
		if p.MerchantID == merchantID && p.InvoiceID == r.InvoiceID && p.PaymentType == r.PaymentType && p.Status != payment.StatusFailed {
			return &payment.DuplicatePaymentError{PaymentID: p.ID.String()}
		}
	}
	return nil
}

// finish moves a processing payment to status, as the worker's commit would: a final status
// completes its record with the stored answer and announces it to watchers.
func (f *fakeStore) finish(id uuid.UUID, status payment.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.payments[id]
	p.Status, p.UpdatedAt = status, t0.Add(time.Second)
	switch status {
	case payment.StatusSucceeded:
		p.ProviderReference = "ch_" + id.String()[24:]
	case payment.StatusFailed:
		p.FailureCode = payment.FailureInsufficientFunds
	}
	f.payments[id] = p
	f.commit(f.records, recordKey{p.MerchantID, p.IdempotencyKey}, id, status, p)
}

// commit moves the record at k of the operation id, now at status, as the worker's commit
// does: a final status completes it with op's answer and announces that to the watchers.
func (f *fakeStore) commit(records map[recordKey]store.Record, k recordKey, id uuid.UUID, status payment.Status, op interface{ AnswerBody() ([]byte, error) }) {
	rec := records[k]
	rec.WorkflowStarted, rec.LockedUntil = true, time.Time{}
	var a *store.Answer
	switch {
	case status.Final():
		var answer store.Answer
		rec, answer = completed(rec, status, op)
		a = &answer
	case status == payment.StatusUnknown:
		rec.Status = store.RecordUnknown
	}
	records[k] = rec
	for _, w := range f.watchers[id] {
		if a != nil {
			w <- *a
		}
		close(w)
	}
	delete(f.watchers, id)
}

func (f *fakeStore) Record(_ context.Context, merchantID uuid.UUID, key string) (store.Record, error) {
	return get(f, "Record", f.records, recordKey{merchantID, key})
}

func (f *fakeStore) TakeOver(_ context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error) {
	return f.takeOver("TakeOver", f.records, recordKey{merchantID, key}, lease)
}

// takeOver leases the record at k to the caller, like store.Store.TakeOver, unless its
// workflow started or another lease holds it.
func (f *fakeStore) takeOver(name string, records map[recordKey]store.Record, k recordKey, lease time.Duration) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call(name); err != nil {
		return false, err
	}
	rec := records[k]
	now := time.Now().Add(f.skew) // the database's clock judges the lease
	if rec.WorkflowStarted || now.Before(rec.LockedUntil) {
		return false, nil
	}
	rec.LockedUntil = now.Add(lease)
	records[k] = rec
	return true, nil
}

func (f *fakeStore) ExpireLease(_ context.Context, operationID uuid.UUID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.call("ExpireLease")
}

func (f *fakeStore) SaveResponse(_ context.Context, merchantID uuid.UUID, key string, outcome payment.Status, body []byte) (payment.Status, []byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SaveResponse"); err != nil {
		return "", nil, err
	}
	k := recordKey{merchantID, key}
	rec := f.records[k]
	if rec.Status == store.RecordCompleted && rec.ResponseBody == nil {
		rec.Outcome, rec.ResponseBody = outcome, body
		f.records[k] = rec
	}
	return rec.Outcome, rec.ResponseBody, nil
}

func (f *fakeStore) Payment(_ context.Context, id uuid.UUID) (payment.Payment, error) {
	return get(f, "Payment", f.payments, id)
}

func (f *fakeStore) PaymentByKey(_ context.Context, merchantID uuid.UUID, key string) (payment.Payment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("PaymentByKey"); err != nil {
		return payment.Payment{}, err
	}
	rec, ok := f.records[recordKey{merchantID, key}]
	if !ok {
		return payment.Payment{}, payment.ErrNotFound
	}
	return f.payments[rec.OperationID], nil
}

// ListPayments lists like store.Store: the merchant's payments in (created_at, id) order,
// newest first, after a cursor that must be one of them. It keeps the last input it was given.
func (f *fakeStore) ListPayments(_ context.Context, in store.ListPaymentsInput) ([]payment.Payment, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ListPayments"); err != nil {
		return nil, false, err
	}
	f.lastList = in
	var all []payment.Payment
	for _, p := range f.payments {
		if p.MerchantID == in.MerchantID {
			all = append(all, p)
		}
	}
	newer := func(a, b payment.Payment) bool {
		return a.CreatedAt.After(b.CreatedAt) || a.CreatedAt.Equal(b.CreatedAt) && a.ID.String() > b.ID.String()
	}
	sort.Slice(all, func(i, j int) bool { return newer(all[i], all[j]) })
	var cursor *payment.Payment
	if in.StartingAfter != nil {
		i := slices.IndexFunc(all, func(p payment.Payment) bool { return p.ID == *in.StartingAfter })
		if i < 0 {
			return nil, false, store.ErrUnknownCursor
		}
		cursor = &all[i]
	}
	page := []payment.Payment{}
	for _, p := range all {
		switch {
		case cursor != nil && !newer(*cursor, p),
			in.Status != "" && p.Status != in.Status,
			in.CreatedGTE != nil && p.CreatedAt.Before(*in.CreatedGTE),
			in.CreatedLT != nil && !p.CreatedAt.Before(*in.CreatedLT):
			continue
		}
		if len(page) == in.Limit {
			return page, true, nil
		}
		page = append(page, p)
	}
	return page, false, nil
}

func (f *fakeStore) MerchantDeliveries(_ context.Context, merchantID uuid.UUID, limit int) ([]store.Delivery, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("MerchantDeliveries"); err != nil {
		return nil, err
	}
	var out []store.Delivery
	for _, d := range f.deliveries {
		if d.MerchantID == merchantID && len(out) < limit {
			out = append(out, d)
		}
	}
	return out, nil
}

func (f *fakeStore) Redeliver(_ context.Context, id uuid.UUID) (store.Delivery, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Redeliver"); err != nil {
		return store.Delivery{}, err
	}
	for i, d := range f.deliveries {
		if d.ID != id {
			continue
		}
		d.Status, d.NextAttemptAt, d.UpdatedAt, d.DeliveredAt = store.DeliveryPending, t0.Add(time.Minute), t0.Add(time.Minute), nil
		f.deliveries[i] = d
		return d, nil
	}
	return store.Delivery{}, payment.ErrNotFound
}

// WatchOutcome announces what finish commits, like store.Store.WatchOutcome.
func (f *fakeStore) WatchOutcome(operationID uuid.UUID) (<-chan store.Answer, func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan store.Answer, 1)
	f.watchers[operationID] = append(f.watchers[operationID], ch)
	return ch, func() {}
}

// BeginRefund decides a refund key's owner like store.Store.BeginRefund: an existing record is
// returned whatever the payment is now; else the payment must be the merchant's, succeeded, and
// have the amount still refundable, or nothing is kept.
func (f *fakeStore) BeginRefund(_ context.Context, in store.BeginRefundInput) (store.Record, payment.Refund, store.Began, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("BeginRefund"); err != nil {
		return store.Record{}, payment.Refund{}, 0, err
	}
	return f.beginRefund(in, time.Now().Add(in.Lease))
}

// CheckRefundAgain checks a request under a key seen before as store.Store.CheckRefundAgain
// does: the payment must be the merchant's, and the amount's digits fit its currency.
func (f *fakeStore) CheckRefundAgain(_ context.Context, in store.BeginRefundInput, rec store.Record) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rec.RequestHash == in.Request.Hash(in.PaymentID) && in.Request.Amount == "" {
		return nil
	}
	p, ok := f.payments[in.PaymentID]
	if !ok || p.MerchantID != in.MerchantID {
		return payment.ErrNotFound
	}
	_, err := in.Request.AmountMinor(p.Currency)
	return err
}

func (f *fakeStore) beginRefund(in store.BeginRefundInput, lockedUntil time.Time) (store.Record, payment.Refund, store.Began, error) {
	k := recordKey{in.MerchantID, in.Key}
	if rec, ok := f.refundRecords[k]; ok {
		return rec, payment.Refund{}, store.BeganExisting, nil
	}
	p, ok := f.payments[in.PaymentID]
	if !ok || p.MerchantID != in.MerchantID {
		return store.Record{}, payment.Refund{}, 0, payment.ErrNotFound
	}
	if p.Status != payment.StatusSucceeded {
		return store.Record{}, payment.Refund{}, 0, payment.ErrPaymentNotRefundable
	}
	amount, err := in.Request.AmountMinor(p.Currency)
	if err != nil {
		return store.Record{}, payment.Refund{}, 0, err
	}
	refundable := p.AmountMinor - p.AmountRefunded - f.held[p.ID]
	if amount == 0 {
		amount = refundable
	}
	if amount <= 0 || amount > refundable {
		return store.Record{}, payment.Refund{}, 0, &payment.RefundExceedsError{Refundable: refundable, Currency: p.Currency}
	}
	f.ids++
	r := payment.Refund{
		ID: fakeID(f.ids), PaymentID: p.ID, MerchantID: in.MerchantID, AccountID: p.AccountID, IdempotencyKey: in.Key,
		AmountMinor: amount, Currency: p.Currency, Reason: in.Request.Reason, Status: payment.StatusProcessing,
		CreatedAt: t0.Add(time.Duration(f.ids) * time.Minute), UpdatedAt: t0.Add(time.Duration(f.ids) * time.Minute),
	}
	rec := store.Record{
		MerchantID: in.MerchantID, Key: in.Key, RequestHash: in.Request.Hash(p.ID), Status: store.RecordProcessing,
		OperationID: r.ID, LockedUntil: lockedUntil, Scope: store.ScopeRefund,
	}
	f.held[p.ID] += amount
	f.refunds[r.ID], f.refundRecords[k] = r, rec
	return rec, r, store.BeganNew, nil
}

// finishRefund moves a processing refund to status as the worker's commit would: succeeded
// refunds the payment, failed releases its hold, unknown keeps it.
func (f *fakeStore) finishRefund(id uuid.UUID, status payment.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.refunds[id]
	r.Status, r.UpdatedAt = status, r.UpdatedAt.Add(time.Second)
	p := f.payments[r.PaymentID]
	switch status {
	case payment.StatusSucceeded:
		r.ProviderReference = "re_" + id.String()[24:]
		p.AmountRefunded += r.AmountMinor
		f.held[p.ID] -= r.AmountMinor
	case payment.StatusFailed:
		r.FailureCode = payment.FailureDeclined
		f.held[p.ID] -= r.AmountMinor
	}
	f.refunds[id], f.payments[p.ID] = r, p
	f.commit(f.refundRecords, recordKey{r.MerchantID, r.IdempotencyKey}, id, status, r)
}

func (f *fakeStore) RefundRecord(_ context.Context, merchantID uuid.UUID, key string) (store.Record, error) {
	return get(f, "RefundRecord", f.refundRecords, recordKey{merchantID, key})
}

func (f *fakeStore) TakeOverRefund(_ context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error) {
	return f.takeOver("TakeOverRefund", f.refundRecords, recordKey{merchantID, key}, lease)
}

func (f *fakeStore) Refund(_ context.Context, id uuid.UUID) (payment.Refund, error) {
	return get(f, "Refund", f.refunds, id)
}

// PaymentRefunds lists like store.Store: the payment's refunds newest first, after a cursor
// that must be one of them.
func (f *fakeStore) PaymentRefunds(_ context.Context, paymentID uuid.UUID, limit int, startingAfter *uuid.UUID) ([]payment.Refund, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("PaymentRefunds"); err != nil {
		return nil, false, err
	}
	var all []payment.Refund
	for _, r := range f.refunds {
		if r.PaymentID == paymentID {
			all = append(all, r)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].CreatedAt.After(all[j].CreatedAt) })
	if startingAfter != nil {
		i := slices.IndexFunc(all, func(r payment.Refund) bool { return r.ID == *startingAfter })
		if i < 0 {
			return nil, false, &payment.ValidationError{Fields: []payment.FieldError{{Field: "starting_after", Message: "is not a refund of this payment"}}}
		}
		all = all[i+1:]
	}
	if len(all) > limit {
		return all[:limit], true, nil
	}
	return append([]payment.Refund{}, all...), false, nil
}

// storeOnly hides the fake's delivery methods: a store that cannot list deliveries.
type storeOnly struct{ Store }

// fakeWorkflows plays Temporal and the payment worker: a started workflow takes its payment to
// outcome at once ("" leaves it processing, as a workflow still running at the deadline).
type fakeWorkflows struct {
	st       *fakeStore
	outcome  payment.Status
	startErr error
	ready    error
	mu       sync.Mutex
	starts   int
}

func (w *fakeWorkflows) StartPayment(_ context.Context, key string, in workflows.PaymentInput) (string, error) {
	return w.start(key, func() { w.st.finish(in.OperationID, w.outcome) })
}

// start counts a start and, unless starting fails or the outcome is "", finishes the operation.
func (w *fakeWorkflows) start(key string, finish func()) (string, error) {
	w.mu.Lock()
	w.starts++
	w.mu.Unlock()
	if w.startErr != nil {
		return "", w.startErr
	}
	if w.outcome != "" {
		finish()
	}
	return "run-" + key, nil
}

// AwaitPayment returns once the payment left processing; an unknown payment's workflow waits for
// reconciliation, and a running one for its outcome, beyond the caller's wait.
func (w *fakeWorkflows) AwaitPayment(ctx context.Context, merchantID uuid.UUID, key, _ string) (workflows.PaymentResult, error) {
	return workflows.PaymentResult{}, w.await(ctx, w.st.records, recordKey{merchantID, key})
}

// await returns once the record at k is completed; else the workflow is still running when
// the caller stops waiting.
func (w *fakeWorkflows) await(ctx context.Context, records map[recordKey]store.Record, k recordKey) error {
	w.st.mu.Lock()
	rec := records[k]
	w.st.mu.Unlock()
	if rec.Status == store.RecordCompleted {
		return nil
	}
	<-ctx.Done()
	return workflows.ErrStillRunning
}

func (w *fakeWorkflows) StartRefund(_ context.Context, key string, in workflows.RefundInput) (string, error) {
	return w.start(key, func() { w.st.finishRefund(in.OperationID, w.outcome) })
}

// AwaitRefund returns once the refund left processing, as AwaitPayment does.
func (w *fakeWorkflows) AwaitRefund(ctx context.Context, merchantID uuid.UUID, key, _ string) (workflows.RefundWorkflowResult, error) {
	return workflows.RefundWorkflowResult{}, w.await(ctx, w.st.refundRecords, recordKey{merchantID, key})
}

func (w *fakeWorkflows) Ready(context.Context) error { return w.ready }

// API keys: sk_a is merchant A's key keyA, sk_b merchant B's keyB.
var (
	keyA = uuid.MustParse("0192f1f0-0000-7000-8000-0000000000c1")
	keyB = uuid.MustParse("0192f1f0-0000-7000-8000-0000000000c2")
)

// fakeKey is an API key as the fake stores it.
type fakeKey struct {
	merchant uuid.UUID
	apiKey   string
	created  time.Time
	revoked  *time.Time
}

// fakeKeys are the keys of the fake's two merchants; the store's merchants map holds the valid ones.
func fakeKeys() map[uuid.UUID]*fakeKey {
	return map[uuid.UUID]*fakeKey{
		keyA: {merchant: merchantA, apiKey: "sk_a", created: t0},
		keyB: {merchant: merchantB, apiKey: "sk_b", created: t0},
	}
}

func (f *fakeStore) CreateMerchantWithKey(ctx context.Context, m payment.Merchant, keyID uuid.UUID, apiKey, webhookSecret string) error {
	if err := f.CreateMerchant(ctx, m, apiKey, webhookSecret); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys[keyID] = &fakeKey{merchant: m.ID, apiKey: apiKey, created: t0}
	f.minted[keyID.String()] = "<api-key-id>"
	return nil
}

func (f *fakeStore) CreateMerchantOnce(ctx context.Context, key string, requestHash []byte, m payment.Merchant, c store.MerchantCreated) (store.MerchantCreated, bool, error) {
	f.mu.Lock()
	first, ok := f.createdMerchants[key]
	err := f.call("CreateMerchantOnce")
	f.mu.Unlock()
	if err != nil {
		return c, false, err
	}
	if ok {
		if first.hash != string(requestHash) {
			return c, false, payment.ErrIdempotencyReused
		}
		return first.created, true, nil
	}
	if err := f.CreateMerchantWithKey(ctx, m, c.APIKeyID, c.APIKey, c.WebhookSecret); err != nil {
		return c, false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c.MerchantID = m.ID
	f.createdMerchants[key] = fakeCreation{hash: string(requestHash), created: c}
	return c, false, nil
}

func (f *fakeStore) AddAPIKey(_ context.Context, merchantID, keyID uuid.UUID, apiKey string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("AddAPIKey"); err != nil {
		return err
	}
	if merchantID != merchantA && merchantID != merchantB {
		return payment.ErrNotFound
	}
	f.keys[keyID] = &fakeKey{merchant: merchantID, apiKey: apiKey, created: t0.Add(time.Hour)}
	for _, m := range newFakeStore().merchants {
		if m.ID == merchantID {
			f.merchants[apiKey] = m
		}
	}
	f.minted[keyID.String()], f.minted[apiKey] = "<api-key-id>", "<api-key>"
	return nil
}

func (f *fakeStore) RevokeAPIKey(_ context.Context, merchantID, keyID uuid.UUID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("RevokeAPIKey"); err != nil {
		return err
	}
	k, ok := f.keys[keyID]
	if !ok || k.merchant != merchantID {
		return payment.ErrNotFound
	}
	if k.revoked == nil {
		at := t0.Add(2 * time.Hour)
		k.revoked = &at
		delete(f.merchants, k.apiKey)
	}
	return nil
}

func (f *fakeStore) APIKeys(_ context.Context, merchantID uuid.UUID) ([]store.APIKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("APIKeys"); err != nil {
		return nil, err
	}
	if merchantID != merchantA && merchantID != merchantB {
		return nil, payment.ErrNotFound
	}
	out := []store.APIKey{}
	for id, k := range f.keys {
		if k.merchant == merchantID {
			out = append(out, store.APIKey{ID: id, CreatedAt: k.created, RevokedAt: k.revoked})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID.String() < out[j].ID.String() })
	return out, nil
}

func (f *fakeStore) RotateWebhookSecret(_ context.Context, merchantID uuid.UUID, secret string, overlap time.Duration) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("RotateWebhookSecret"); err != nil {
		return time.Time{}, err
	}
	if merchantID != merchantA && merchantID != merchantB {
		return time.Time{}, payment.ErrNotFound
	}
	f.minted[secret] = "<webhook-secret>"
	return t0.Add(overlap), nil
}

// fakeBacklog is the drainer's record of the start backlog.
type fakeBacklog struct {
	state  store.BacklogState
	queued map[uuid.UUID]bool // merchants with queued payments
}

func (b fakeBacklog) BacklogState(context.Context) (store.BacklogState, error) { return b.state, nil }

func (b fakeBacklog) MerchantQueued(_ context.Context, m uuid.UUID) (bool, error) {
	return b.queued[m], nil
}

// Captures and cancels run on the real store and Temporal (tests/capture_test.go): the fakes
// have no manual payments, so every command finds none.
var errNoCommands = errors.New("fake store: no manual payments")

func (f *fakeStore) BeginCommand(context.Context, store.Command, time.Duration) (store.Command, bool, error) {
	return store.Command{}, false, errNoCommands
}

func (f *fakeStore) Command(context.Context, uuid.UUID, string) (store.Command, error) {
	return store.Command{}, payment.ErrNotFound
}

func (f *fakeStore) LeaseCommand(context.Context, uuid.UUID, string, time.Duration) (bool, error) {
	return false, errNoCommands
}

func (f *fakeStore) AnswerCommand(context.Context, uuid.UUID, string, int, []byte) error {
	return errNoCommands
}
func (f *fakeStore) UnleaseCommand(context.Context, uuid.UUID, string) error { return errNoCommands }
func (f *fakeStore) DeleteCommand(context.Context, uuid.UUID, string) error  { return errNoCommands }
func (f *fakeStore) TakenCommand(context.Context, uuid.UUID) (uuid.UUID, error) {
	return uuid.Nil, errNoCommands
}

// CaptureClosed: the fake holds no commands, and its payments' capture windows are open.
func (f *fakeStore) CaptureClosed(context.Context, []uuid.UUID) ([]uuid.UUID, error) {
	return nil, nil
}

func (w *fakeWorkflows) Command(context.Context, uuid.UUID, string, string, workflows.Command) (string, error) {
	return "", errNoCommands
}

func (f *fakeStore) Audit(_ context.Context, e store.AuditEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Audit"); err != nil {
		return err
	}
	e.ID = payment.NewID()
	f.audit = append(f.audit, e)
	return nil
}

func (f *fakeStore) AuditLog(_ context.Context, limit int, after uuid.UUID) ([]store.AuditEntry, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.AuditEntry
	for i := len(f.audit) - 1; i >= 0; i-- {
		if after == uuid.Nil || f.audit[i].ID.String() < after.String() {
			out = append(out, f.audit[i])
		}
	}
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}
