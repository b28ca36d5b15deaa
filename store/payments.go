package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// RecordStatus is the idempotency record's state: processing -> completed | unknown (-> completed).
type RecordStatus string

const (
	RecordProcessing RecordStatus = "processing"
	RecordCompleted  RecordStatus = "completed"
	RecordUnknown    RecordStatus = "unknown"
)

// Record is an idempotency record.
type Record struct {
	MerchantID      uuid.UUID
	Key             string
	RequestHash     string
	Status          RecordStatus
	OperationID     uuid.UUID
	Outcome         payment.Status // a completed record's: succeeded or failed; empty before
	ResponseBody    []byte
	LockedUntil     time.Time
	WorkflowStarted bool
	Scope           Scope
	UpdatedAt       time.Time // when it last changed: a completed record's is when its operation finished
	// Queued: the operation waits in the start backlog for the drainer, which alone starts it.
	Queued bool
}

// Scope is the key space of an idempotency record: a merchant's payments and its refunds each
// have their own.
type Scope string

const (
	ScopePayment Scope = "payment"
	ScopeRefund  Scope = "refund"
)

// BeginInput is a validated request about to become an operation.
type BeginInput struct {
	MerchantID  uuid.UUID
	Key         string
	Request     payment.Request
	OperationID uuid.UUID
	Lease       time.Duration
	// Queue asks for the payment to wait in the start backlog rather than be started by the
	// caller; it waits there anyway while the merchant has queued payments (Record.Queued says).
	Queue bool
	// CaptureWindow is how long a manual payment may wait for its capture.
	CaptureWindow time.Duration
}

// Begin commits, in one short transaction, the idempotency record (processing, leased) and the
// payment row. When the key exists it writes nothing and returns the existing record (not
// BeganNew), whatever the request says: the caller compares it with the record. Else the
// payer account must be the merchant's and in the request's currency (else
// *payment.ValidationError); an invoice with a live payment is *payment.DuplicatePaymentError.
func (s *Store) Begin(ctx context.Context, in BeginInput) (Record, payment.Payment, Began, error) {
	rec, p, began, err := s.begin(ctx, in)
	if errors.Is(err, errRecordGone) {
		return s.begin(ctx, in)
	}
	return rec, p, began, err
}

// errRecordGone: a concurrent request committed the key, and retention deleted its record
// (a retention of seconds) before this one read it. The key is an expired one by now: the
// request begins again as any request under an expired key does, never answered "not found".
var errRecordGone = errors.New("the key's record expired before it was read")

func (s *Store) begin(ctx context.Context, in BeginInput) (rec Record, p payment.Payment, began Began, err error) {
	r := in.Request
	p = payment.Payment{
		ID: in.OperationID, MerchantID: in.MerchantID, IdempotencyKey: in.Key, AccountID: r.AccountID,
		AmountMinor: r.AmountMinor, Currency: r.Currency, InvoiceID: r.InvoiceID, PaymentType: r.PaymentType,
		Status: payment.StatusProcessing, CaptureManual: r.CaptureManual,
	}
	var queued bool
	for try := 1; ; try++ {
		err = s.beginBatch(ctx, in, &p, &rec, &queued)
		if !errors.Is(err, errLivePayment) {
			break
		}
		if err := s.livePayment(ctx, in.MerchantID, r); err != nil {
			return rec, p, 0, err
		}
		// The live payment failed between the index's check and the look-up: the invoice
		// is free again, so the request begins again.
		if try == 3 {
			return rec, p, 0, fmt.Errorf("%w: the invoice's live payment changed three times while beginning", ErrConflict)
		}
	}
	switch {
	case err == nil:
		rec = Record{MerchantID: in.MerchantID, Key: in.Key, RequestHash: r.Hash(), Status: RecordProcessing, OperationID: in.OperationID, Scope: ScopePayment, Queued: queued}
		return rec, p, BeganNew, nil
	case errors.Is(err, errExisting):
		return rec, payment.Payment{}, BeganExisting, nil
	case errors.Is(err, errReplay): // a concurrent request committed the key after the batch's read
		rec, err = s.Record(ctx, in.MerchantID, in.Key)
		if errors.Is(err, payment.ErrNotFound) {
			err = errRecordGone
		}
		return rec, payment.Payment{}, BeganRaced, err
	}
	return rec, p, 0, err
}

// Began says what Begin did with the key.
type Began int

const (
	BeganNew      Began = iota + 1 // the key is new: the caller owns the operation
	BeganExisting                  // the key had a record: nothing was written
	BeganRaced                     // a concurrent request committed the key first: nothing was written
)

// beginBatch is Begin's one round trip: its three statements are one pipelined batch, which
// PostgreSQL runs as one implicit transaction (an error in any of them rolls back all). The
// first reads the key's record: most repeated keys are retries, answered by that read (into
// existing, as errExisting), for which the writes after it change nothing. The later
// statements guard themselves in SQL on what the earlier ones found.
func (s *Store) beginBatch(ctx context.Context, in BeginInput, p *payment.Payment, existing *Record, queued *bool) error {
	r := in.Request
	b := &pgx.Batch{}
	b.Queue(dbsqlc.GetRecord, in.MerchantID, in.Key)
	b.Queue(dbsqlc.AcquireKey, in.MerchantID, in.Key, r.Hash(), in.OperationID, in.Lease.String(), r.AccountID, r.Currency, in.Queue)
	b.Queue(dbsqlc.InsertPayment, p.ID, p.MerchantID, p.IdempotencyKey, p.AccountID, p.AmountMinor, p.Currency, p.InvoiceID, p.PaymentType,
		r.CaptureManual, in.CaptureWindow.String())
	br := s.pool.SendBatch(ctx, b)
	recordErr := scanRecord(br.QueryRow(), existing)
	var op uuid.UUID
	acquireErr := br.QueryRow().Scan(&op, queued)
	var captureBefore *time.Time
	insertErr := br.QueryRow().Scan(&p.CreatedAt, &p.UpdatedAt, &captureBefore)
	if captureBefore != nil {
		p.CaptureBefore = *captureBefore
	}
	if err := br.Close(); err != nil {
		return translate(err)
	}
	// The writes decide, not the read: retention may delete the key's old record after the
	// read saw it and before the insert, which then makes this request's record and payment.
	if acquireErr == nil && insertErr == nil {
		return nil
	}
	if recordErr == nil {
		return errExisting
	}
	if !errors.Is(recordErr, pgx.ErrNoRows) {
		return translate(recordErr)
	}
	switch {
	case errors.Is(acquireErr, pgx.ErrNoRows):
		// Refused by the account guard, or a concurrent request committed the key: only the
		// refusal reads the account, which is why no new payment pays for that read. An
		// account's owner, kind and currency never change, so a read after the batch says
		// what the guard saw.
		return s.refusedAccount(ctx, in.MerchantID, r)
	case acquireErr != nil:
		return translate(acquireErr)
	}
	return translate(insertErr) // no rows here would mean the record vanished within the transaction
}

// refusedAccount says why AcquireKey inserted nothing: the payer account is not the merchant's
// customer account in the request's currency (a *payment.ValidationError), or it is, and the key
// was taken by a concurrent request (errReplay).
func (s *Store) refusedAccount(ctx context.Context, merchantID uuid.UUID, r payment.Request) error {
	var owner uuid.UUID
	var currency string
	err := s.pool.QueryRow(ctx, dbsqlc.CustomerAccount, r.AccountID).Scan(&owner, &currency)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || (err == nil && owner != merchantID):
		return &payment.ValidationError{Fields: []payment.FieldError{{Field: "account_id", Message: "no such account"}}}
	case err != nil:
		return translate(err)
	case currency != r.Currency:
		return &payment.ValidationError{Fields: []payment.FieldError{{Field: "currency", Message: payment.ErrCurrencyMismatch.Error() + " (" + currency + ")"}}}
	}
	return errReplay
}

// Refusal is what Begin would refuse a new key's request for, read without writing anything:
// the payer account (a *payment.ValidationError) or the invoice's live payment (a
// *payment.DuplicatePaymentError); nil when Begin would take it. Past the start backlog's bound
// the API answers these as it does below it, since they do not change with the load.
func (s *Store) Refusal(ctx context.Context, merchantID uuid.UUID, r payment.Request) error {
	if err := s.refusedAccount(ctx, merchantID, r); !errors.Is(err, errReplay) {
		return err
	}
	return s.livePayment(ctx, merchantID, r)
}

// livePayment is the invoice's live payment as a *payment.DuplicatePaymentError, nil for none.
func (s *Store) livePayment(ctx context.Context, merchantID uuid.UUID, r payment.Request) error {
	var live uuid.UUID
	err := s.pool.QueryRow(ctx, dbsqlc.LivePayment, merchantID, r.InvoiceID, r.PaymentType).Scan(&live)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return translate(err)
	}
	return &payment.DuplicatePaymentError{PaymentID: live.String()}
}

// errExisting: Begin found the key's record; it wrote nothing.
var errExisting = errors.New("idempotency key exists")

// Record reads an idempotency record.
func (s *Store) Record(ctx context.Context, merchantID uuid.UUID, key string) (Record, error) {
	var r Record
	err := scanRecord(s.pool.QueryRow(ctx, dbsqlc.GetRecord, merchantID, key), &r)
	return r, translate(err)
}

func scanRecord(row pgx.Row, r *Record) error {
	return row.Scan(&r.MerchantID, &r.Key, &r.RequestHash, &r.Status,
		&r.OperationID, &r.Outcome, &r.ResponseBody, &r.LockedUntil, &r.WorkflowStarted, &r.Scope, &r.UpdatedAt, &r.Queued)
}

// TakeOver claims the expired lease of a record whose workflow was never started (its owner
// died or failed between commit and start). At most one caller gets true.
func (s *Store) TakeOver(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error) {
	var op uuid.UUID
	err := s.pool.QueryRow(ctx, dbsqlc.TakeOver, merchantID, key, lease.String()).Scan(&op)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, translate(err)
}

// WorkflowStarted records that the workflow owns the operation now; the lease no longer matters.
func (s *Store) WorkflowStarted(ctx context.Context, operationID uuid.UUID) error {
	return translate(s.q.MarkWorkflowStarted(ctx, operationID))
}

// ExpireLease lets the next retry take over at once after a failed workflow start.
func (s *Store) ExpireLease(ctx context.Context, operationID uuid.UUID) error {
	return translate(s.q.ExpireLease(ctx, operationID))
}

// SaveResponse stores the first rendering of a completed operation's answer with its outcome;
// every later answer for the key replays exactly the stored bytes, which it returns.
func (s *Store) SaveResponse(ctx context.Context, merchantID uuid.UUID, key string, outcome payment.Status, body []byte) (payment.Status, []byte, error) {
	if _, err := s.pool.Exec(ctx, dbsqlc.SaveResponse, merchantID, key, outcome, body); err != nil {
		return "", nil, translate(err)
	}
	rec, err := s.Record(ctx, merchantID, key)
	if err != nil {
		return "", nil, err
	}
	if rec.ResponseBody == nil {
		return "", nil, ErrInconsistent
	}
	return rec.Outcome, rec.ResponseBody, nil
}

// Payment reads a payment by operation id.
func (s *Store) Payment(ctx context.Context, id uuid.UUID) (payment.Payment, error) {
	return scanPayment(s.pool.QueryRow(ctx, dbsqlc.GetPayment, id))
}

// PaymentByKey reads the payment a merchant's idempotency key created.
func (s *Store) PaymentByKey(ctx context.Context, merchantID uuid.UUID, key string) (payment.Payment, error) {
	return scanPayment(s.pool.QueryRow(ctx, dbsqlc.GetPaymentByKey, merchantID, key))
}

// Stranded lists records, of payments and of refunds (Scope says which), whose owner never
// started the workflow and whose lease has run out, of one merchant when merchant is not nil.
func (s *Store) Stranded(ctx context.Context, limit int, merchant *uuid.UUID) ([]Record, error) {
	rows, err := s.q.Stranded(ctx, dbsqlc.StrandedParams{MerchantID: merchant, MaxRows: int32(limit)})
	if err != nil {
		return nil, translate(err)
	}
	out := make([]Record, len(rows))
	for i, r := range rows {
		out[i] = Record{MerchantID: r.MerchantID, Key: r.IdempotencyKey, Scope: Scope(r.Scope), OperationID: r.OperationID}
	}
	return out, nil
}
