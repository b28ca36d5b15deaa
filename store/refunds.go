package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// BeginRefundInput is a parsed refund request about to become an operation.
type BeginRefundInput struct {
	MerchantID  uuid.UUID
	PaymentID   uuid.UUID
	Key         string
	Request     payment.RefundRequest
	OperationID uuid.UUID // the refund's id
	Lease       time.Duration
}

// BeginRefund commits, in one transaction, the refund's idempotency record (scope refund,
// processing, leased), the hold of its amount on the payment and the refund row (processing).
// When the key exists it writes nothing and returns the existing record (BeganExisting; BeganRaced
// when a concurrent request committed it first), whatever the request and however much of the
// payment is refundable now: the caller compares the record's hash. Else nothing is kept when
// the payment is not the merchant's (payment.ErrNotFound), is not succeeded
// (payment.ErrPaymentNotRefundable), or has less refundable than asked for
// (*payment.RefundExceedsError); an amount with more digits than the payment's currency has is a
// *payment.ValidationError. No amount in the request is all that is refundable.
func (s *Store) BeginRefund(ctx context.Context, in BeginRefundInput) (Record, payment.Refund, Began, error) {
	rec, r, began, err := s.beginRefund(ctx, in)
	if errors.Is(err, errRecordGone) {
		return s.beginRefund(ctx, in)
	}
	return rec, r, began, err
}

func (s *Store) beginRefund(ctx context.Context, in BeginRefundInput) (Record, payment.Refund, Began, error) {
	// Most repeated keys are retries: one read answers them without a transaction.
	hash := in.Request.Hash(in.PaymentID)
	rec, err := s.RefundRecord(ctx, in.MerchantID, in.Key)
	if err == nil {
		if err := s.paymentFirst(ctx, in, rec, hash); err != nil {
			return Record{}, payment.Refund{}, 0, err
		}
		return rec, payment.Refund{}, BeganExisting, nil
	}
	if !errors.Is(err, payment.ErrNotFound) {
		return rec, payment.Refund{}, 0, err
	}
	var r payment.Refund
	err = s.tx(ctx, func(tx pgx.Tx) error {
		q := s.q.WithTx(tx)
		// The record first: a concurrent request with the same key waits here for this
		// transaction, and finds the key taken if it commits, or free if it rolls back.
		var op uuid.UUID
		err := tx.QueryRow(ctx, dbsqlc.AcquireRefundKey, in.MerchantID, in.Key, hash, in.OperationID, in.Lease.String()).Scan(&op)
		if errors.Is(err, pgx.ErrNoRows) {
			return errReplay
		}
		if err != nil {
			return err
		}
		p, err := q.LockRefundedPayment(ctx, dbsqlc.LockRefundedPaymentParams{ID: in.PaymentID, MerchantID: in.MerchantID})
		if err != nil {
			return err // no rows: payment.ErrNotFound
		}
		// A key names its refund for good: after its record expired it still answers for that
		// refund, never for a second one. Holding the new record makes this read race-free.
		prev, err := q.RefundIDByKey(ctx, dbsqlc.RefundIDByKeyParams{MerchantID: in.MerchantID, IdempotencyKey: in.Key})
		if err == nil {
			return fmt.Errorf("%w: the key named refund %s, whose idempotency record has expired", payment.ErrIdempotencyReused, prev)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if payment.Status(p.Status) != payment.StatusSucceeded {
			return payment.ErrPaymentNotRefundable
		}
		amount, err := in.Request.AmountMinor(p.Currency)
		if err != nil {
			return err
		}
		refundable := p.AmountMinor - p.RefundedMinor - p.RefundHeldMinor
		if amount == 0 {
			amount = refundable
		}
		if amount <= 0 || amount > refundable {
			return &payment.RefundExceedsError{Refundable: refundable, Currency: p.Currency}
		}
		if _, err := q.HoldPaymentRefund(ctx, dbsqlc.HoldPaymentRefundParams{Amount: amount, ID: p.ID}); err != nil {
			if errors.Is(err, pgx.ErrNoRows) { // the row is locked by this transaction: never
				return fmt.Errorf("%w: payment %s refused a hold of %d it had room for", ErrInconsistent, p.ID, amount)
			}
			return err
		}
		r = payment.Refund{
			ID: in.OperationID, PaymentID: p.ID, MerchantID: in.MerchantID, AccountID: p.AccountID, IdempotencyKey: in.Key,
			AmountMinor: amount, Currency: p.Currency, Reason: in.Request.Reason, Status: payment.StatusProcessing,
		}
		return tx.QueryRow(ctx, dbsqlc.InsertRefund, r.ID, r.PaymentID, r.MerchantID, r.IdempotencyKey, r.AccountID,
			r.AmountMinor, r.Currency, r.Reason).Scan(&r.CreatedAt, &r.UpdatedAt)
	})
	switch {
	case err == nil:
		rec = Record{MerchantID: in.MerchantID, Key: in.Key, RequestHash: hash, Status: RecordProcessing,
			OperationID: in.OperationID, Scope: ScopeRefund}
		return rec, r, BeganNew, nil
	case errors.Is(err, errReplay):
		rec, err = s.RefundRecord(ctx, in.MerchantID, in.Key)
		if err == nil {
			err = s.paymentFirst(ctx, in, rec, hash)
		} else if errors.Is(err, payment.ErrNotFound) {
			err = errRecordGone
		}
		if err != nil {
			return Record{}, payment.Refund{}, 0, err
		}
		return rec, payment.Refund{}, BeganRaced, nil
	}
	return Record{}, payment.Refund{}, 0, err
}

// CheckRefundAgain is what BeginRefund checks of a request under a key that has its record (rec)
// before the key's answer, for a caller that found rec elsewhere (the API's memory of replays).
func (s *Store) CheckRefundAgain(ctx context.Context, in BeginRefundInput, rec Record) error {
	return s.paymentFirst(ctx, in, rec, in.Request.Hash(in.PaymentID))
}

// paymentFirst checks the payment of another request under the key (rec, of another hash)
// before the key is found reused (docs/api.md): another merchant's payment, or none, is not found;
// and an amount's digits against its currency, as a new key's are, before any answer.
func (s *Store) paymentFirst(ctx context.Context, in BeginRefundInput, rec Record, hash string) error {
	if rec.RequestHash == hash && in.Request.Amount == "" {
		return nil
	}
	p, err := s.Payment(ctx, in.PaymentID)
	if err == nil && p.MerchantID != in.MerchantID {
		err = payment.ErrNotFound
	}
	if err == nil { // an amount's digits are checked against the currency before any replay
		_, err = in.Request.AmountMinor(p.Currency)
	}
	return err
}

// RefundRecord reads the idempotency record of a merchant's refund key.
func (s *Store) RefundRecord(ctx context.Context, merchantID uuid.UUID, key string) (Record, error) {
	var r Record
	err := scanRecord(s.pool.QueryRow(ctx, dbsqlc.GetRefundRecord, merchantID, key), &r)
	return r, translate(err)
}

// TakeOverRefund is TakeOver for a refund's record.
func (s *Store) TakeOverRefund(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error) {
	var op uuid.UUID
	err := s.pool.QueryRow(ctx, dbsqlc.TakeOverRefund, merchantID, key, lease.String()).Scan(&op)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, translate(err)
}

// Refund reads a refund by its id.
func (s *Store) Refund(ctx context.Context, id uuid.UUID) (payment.Refund, error) {
	return scanRefund(s.pool.QueryRow(ctx, dbsqlc.GetRefund, id))
}

// RefundByKey reads the refund a merchant's idempotency key created.
func (s *Store) RefundByKey(ctx context.Context, merchantID uuid.UUID, key string) (payment.Refund, error) {
	return scanRefund(s.pool.QueryRow(ctx, dbsqlc.GetRefundByKey, merchantID, key))
}

// PaymentRefunds lists a payment's refunds newest first (by creation time, then id), at most
// limit of them, after the refund startingAfter when it is not nil, and says whether there are
// more. A startingAfter that is not one of the payment's refunds is a *payment.ValidationError.
func (s *Store) PaymentRefunds(ctx context.Context, paymentID uuid.UUID, limit int, startingAfter *uuid.UUID) ([]payment.Refund, bool, error) {
	if limit < 1 {
		return nil, false, fmt.Errorf("refund list limit %d: must be at least 1", limit)
	}
	if startingAfter != nil {
		ok, err := s.q.RefundOfPayment(ctx, dbsqlc.RefundOfPaymentParams{ID: *startingAfter, PaymentID: paymentID})
		if err != nil {
			return nil, false, translate(err)
		}
		if !ok {
			return nil, false, &payment.ValidationError{Fields: []payment.FieldError{{Field: "starting_after", Message: "is not a refund of this payment"}}}
		}
	}
	rows, err := s.pool.Query(ctx, dbsqlc.PaymentRefunds, paymentID, startingAfter, limit+1)
	if err != nil {
		return nil, false, translate(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (payment.Refund, error) { return scanRefund(r) })
	if err != nil {
		return nil, false, translate(err)
	}
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

// The refund workflow's steps. Each is one short transaction, safe to repeat as the payment's
// steps are (steps.go): a retried step finds its work done and changes nothing.

// HoldRefund records that the refund's workflow runs and holds the refund's amount on the
// merchant's settlement account in its currency, under a reservation keyed by the refund's id.
// A repeated call finds the reservation and changes nothing. payment.ErrInsufficientFunds when
// the settlement account's available balance is too small (nothing is held then).
func (s *Store) HoldRefund(ctx context.Context, refundID uuid.UUID) error {
	return s.HoldRefundRun(ctx, refundID, "")
}

// HoldRefundRun is HoldRefund for the workflow run runID, with ReserveRun's rule: a refund no
// longer processing is refused (ErrInconsistent) unless runID is the run that took it on.
func (s *Store) HoldRefundRun(ctx context.Context, refundID uuid.UUID, runID string) error {
	insufficient := false
	err := s.tx(ctx, func(tx pgx.Tx) error {
		insufficient = false
		q := s.q.WithTx(tx)
		r, err := q.StartRefundHold(ctx, dbsqlc.StartRefundHoldParams{ID: refundID, RunID: orNull(runID)})
		switch {
		case err != nil:
			return err // no rows: payment.ErrNotFound
		case runID != "" && payment.Status(r.Status) != payment.StatusProcessing && r.RunOfRecord != runID:
			return &payment.DecidedError{ID: refundID.String(), Status: payment.Status(r.Status), RunOfRecord: r.RunOfRecord}
		case r.Held:
			return nil
		case runID != "" && payment.Status(r.Status) == payment.StatusFailed && r.FailureCode == payment.FailureInsufficientFunds:
			insufficient = true // its own answer again, as a payment's Reserve gives: the run failed it so
			return nil
		case r.SettlementID == nil:
			return fmt.Errorf("%w: merchant of refund %s has no settlement account in its currency", ErrInconsistent, refundID)
		case payment.Status(r.Status) != payment.StatusProcessing:
			return fmt.Errorf("%w: refund %s is %s without a hold", ErrInconsistent, refundID, r.Status)
		}
		shards, err := q.LockShards(ctx, *r.SettlementID)
		if err != nil {
			return err
		}
		// A concurrent hold of this refund that had the shards before this one is seen now:
		// this statement's snapshot is taken after their locks were granted.
		if held, err := q.ReservationExists(ctx, refundID); err != nil || held {
			return err
		}
		ok, err := holdSettlement(ctx, q, *r.SettlementID, shards, r.AmountMinor)
		if err != nil {
			return err
		}
		if !ok {
			insufficient = true
			return nil // the workflow's start is kept
		}
		return q.InsertReservation(ctx, dbsqlc.InsertReservationParams{
			ID: payment.NewID(), OperationID: refundID, AccountID: *r.SettlementID, AmountMinor: r.AmountMinor,
		})
	})
	if err == nil && insufficient {
		return payment.ErrInsufficientFunds
	}
	return err
}

// PostRefund books a held refund that the provider made: in one transaction the hold becomes
// a balanced posting (kind refund, reference the refund's id) from the merchant's settlement
// account to the payer's, the payment's held amount becomes refunded, the refund succeeded,
// its record completed with the stored answer, and the event is queued.
func (s *Store) PostRefund(ctx context.Context, refundID uuid.UUID, providerRef string) (payment.Refund, error) {
	var r payment.Refund
	var answer *Answer
	err := s.tx(ctx, func(tx pgx.Tx) error {
		answer = nil
		var err error
		r, err = scanRefund(tx.QueryRow(ctx, dbsqlc.SetRefundStatus, refundID, payment.StatusSucceeded, "", providerRef, fromStatuses(payment.StatusSucceeded)))
		if errors.Is(err, payment.ErrNotFound) {
			return refundAlreadyDone(ctx, tx, refundID, payment.StatusSucceeded, &r)
		}
		if err != nil {
			return err
		}
		var settlement uuid.UUID
		var amount int64
		err = tx.QueryRow(ctx, dbsqlc.CloseReservation, refundID, "finalized").Scan(&settlement, &amount)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: refund %s was not held", ErrInconsistent, refundID)
		}
		if err != nil {
			return err
		}
		if amount != r.AmountMinor {
			return fmt.Errorf("%w: refund %s of %d held %d", ErrInconsistent, refundID, r.AmountMinor, amount)
		}
		if err := movePaymentRefund(ctx, tx, dbsqlc.PostPaymentRefund, r); err != nil {
			return err
		}
		b := &pgx.Batch{}
		postingID := payment.NewID()
		b.Queue(dbsqlc.InsertPosting, postingID, "refund", refundID.String())
		b.Queue(dbsqlc.InsertEntryPair, payment.NewID(), postingID, settlement, r.Currency, -amount, payment.NewID(), r.AccountID, amount)
		b.Queue(dbsqlc.Credit, r.AccountID, amount)
		a, err := queueRefundComplete(b, r, RecordCompleted)
		if err != nil {
			return err
		}
		answer = a
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		// Last, as in Finalize: the settlement account's shards are the merchant's hot rows.
		return unholdSettlement(ctx, s.q.WithTx(tx), settlement, amount, true)
	})
	if err == nil {
		s.announce(refundID, answer)
	}
	return r, err
}

// ReleaseRefund fails a refund with a code: its hold on the settlement account (if it got one)
// and on the payment are given back, its record completed, and the event queued.
func (s *Store) ReleaseRefund(ctx context.Context, refundID uuid.UUID, failureCode string) (payment.Refund, error) {
	var r payment.Refund
	var answer *Answer
	err := s.tx(ctx, func(tx pgx.Tx) error {
		answer = nil
		var err error
		r, err = scanRefund(tx.QueryRow(ctx, dbsqlc.SetRefundStatus, refundID, payment.StatusFailed, failureCode, "", fromStatuses(payment.StatusFailed)))
		if errors.Is(err, payment.ErrNotFound) {
			return refundAlreadyDone(ctx, tx, refundID, payment.StatusFailed, &r)
		}
		if err != nil {
			return err
		}
		var settlement uuid.UUID
		var amount int64
		err = tx.QueryRow(ctx, dbsqlc.CloseReservation, refundID, "released").Scan(&settlement, &amount)
		held := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		// The payment's row before the settlement account's, in PostRefund's order: two
		// refunds of one payment finishing at once never wait for each other in a cycle.
		if err := movePaymentRefund(ctx, tx, dbsqlc.ReleasePaymentRefund, r); err != nil {
			return err
		}
		b := &pgx.Batch{}
		a, err := queueRefundComplete(b, r, RecordCompleted)
		if err != nil {
			return err
		}
		answer = a
		if err := tx.SendBatch(ctx, b).Close(); err != nil || !held {
			return err
		}
		return unholdSettlement(ctx, s.q.WithTx(tx), settlement, amount, false)
	})
	if err == nil {
		s.announce(refundID, answer)
	}
	return r, err
}

// MarkRefundUnknown parks a processing refund whose outcome at the provider cannot be known. Its
// holds stay, on the payment and on the settlement account: the bank may have moved the money.
func (s *Store) MarkRefundUnknown(ctx context.Context, refundID uuid.UUID) (payment.Refund, error) {
	var r payment.Refund
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var err error
		r, err = scanRefund(tx.QueryRow(ctx, dbsqlc.SetRefundStatus, refundID, payment.StatusUnknown, "", "", fromStatuses(payment.StatusUnknown)))
		if errors.Is(err, payment.ErrNotFound) {
			return refundAlreadyDone(ctx, tx, refundID, payment.StatusUnknown, &r)
		}
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		if _, err := queueRefundComplete(b, r, RecordUnknown); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err == nil {
		s.announce(refundID, nil)
	}
	return r, err
}

// BeginRefundAttempt is BeginChargeAttempt for a refund's send.
func (s *Store) BeginRefundAttempt(ctx context.Context, refundID uuid.UUID) (int, error) {
	var n int32
	err := s.recordSend(ctx, func(q *dbsqlc.Queries) (err error) {
		n, err = q.BeginRefundAttempt(ctx, refundID)
		return err // no rows: payment.ErrNotFound
	})
	return int(n), err
}

// BeginRefundSend is BeginChargeSend for a refund's send.
func (s *Store) BeginRefundSend(ctx context.Context, refundID uuid.UUID, send int) (bool, error) {
	var n int64
	err := s.recordSend(ctx, func(q *dbsqlc.Queries) (err error) {
		n, err = q.BeginRefundSend(ctx, dbsqlc.BeginRefundSendParams{ID: refundID, Send: int32(send)})
		return err
	})
	return n == 1, err
}

// FlagRefundStuck is FlagStuck for a refund.
func (s *Store) FlagRefundStuck(ctx context.Context, refundID uuid.UUID, reason string) error {
	n, err := s.q.FlagRefundStuck(ctx, dbsqlc.FlagRefundStuckParams{ID: refundID, Reason: reason})
	if err == nil && n == 0 {
		return payment.ErrNotFound
	}
	return translate(err)
}

// movePaymentRefund takes a finishing refund's amount off the payment's held amount (sql: posted
// to refunded, or released).
func movePaymentRefund(ctx context.Context, tx pgx.Tx, sql string, r payment.Refund) error {
	tag, err := tx.Exec(ctx, sql, r.AmountMinor, r.PaymentID)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("%w: payment %s does not hold refund %s's %d", ErrInconsistent, r.PaymentID, r.ID, r.AmountMinor)
	}
	return nil
}

// refundAlreadyDone makes a repeated step a no-op when the refund already has the wanted status,
// and an ErrInconsistent when it has a contradicting one.
func refundAlreadyDone(ctx context.Context, tx pgx.Tx, refundID uuid.UUID, want payment.Status, r *payment.Refund) error {
	cur, err := scanRefund(tx.QueryRow(ctx, dbsqlc.GetRefund, refundID))
	if err != nil {
		return err
	}
	*r = cur
	if cur.Status != want {
		return fmt.Errorf("%w: refund %s is %s, cannot become %s", ErrInconsistent, refundID, cur.Status, want)
	}
	return nil
}

// queueRefundComplete is queueComplete for a refund: the record's move to rs, with the stored
// answer when it completes, and the refund's event.
func queueRefundComplete(b *pgx.Batch, r payment.Refund, rs RecordStatus) (*Answer, error) {
	var a *Answer
	var outcome *payment.Status
	var body []byte
	if rs == RecordCompleted {
		bd, err := r.AnswerBody()
		if err != nil {
			return nil, err
		}
		outcome, body, a = &r.Status, bd, &Answer{Outcome: r.Status, Body: bd}
	}
	payload, err := json.Marshal(r.Resource())
	if err != nil {
		return nil, err
	}
	b.Queue(dbsqlc.CompleteWithEvent, r.ID, rs, outcome, body, payment.NewID(), "refund."+string(r.Status), payload)
	return a, nil
}
