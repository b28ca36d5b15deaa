package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
)

// The workflow's steps. Each is one short transaction, safe to repeat: a retried activity finds
// the step done (by the reservation's or the payment's status) and changes nothing. No row lock
// is ever held across a call to the provider.
const (
	// Reserve in one statement, so one round trip and no explicit transaction. The workflow's
	// first step also records that the workflow runs: from now on the lease of the idempotency
	// record no longer matters (no takeover, no sweep). The balance check and the hold are one
	// UPDATE: concurrent reservations re-evaluate the condition on the latest row version, so the
	// account can never be overdrawn. A reservation is inserted only with its hold. Of two
	// attempts racing for one payment, the second either holds too and then fails on the
	// reservation's unique operation_id (its whole statement, hold included, is undone), or finds
	// the balance taken by the first hold: Reserve then looks again before calling it a decline.
	sqlReserveFunds = `WITH started AS (
  UPDATE idempotency_records SET workflow_started = true, locked_until = NULL, updated_at = now()
  WHERE operation_id = $1 AND NOT workflow_started
), p AS (
  SELECT id, account_id, amount_minor FROM payments WHERE id = $1
), existing AS (
  SELECT 1 FROM balance_reservations WHERE operation_id = $1
), held AS (
  UPDATE accounts a SET reserved = a.reserved + p.amount_minor, updated_at = now()
  FROM p WHERE a.id = p.account_id AND a.balance - a.reserved >= p.amount_minor AND NOT EXISTS (SELECT 1 FROM existing)
  RETURNING a.id
), inserted AS (
  INSERT INTO balance_reservations (id, operation_id, account_id, amount_minor, status)
  SELECT $2, p.id, p.account_id, p.amount_minor, 'active' FROM p, held
  RETURNING id
)
SELECT EXISTS (SELECT 1 FROM p), EXISTS (SELECT 1 FROM existing), EXISTS (SELECT 1 FROM inserted)`
	sqlReservationExists = `SELECT EXISTS (SELECT 1 FROM balance_reservations WHERE operation_id = $1)`
	sqlCloseReservation  = `UPDATE balance_reservations SET status = $2, updated_at = now()
WHERE operation_id = $1 AND status = 'active' RETURNING account_id, amount_minor`
	sqlUnreserve = `UPDATE accounts SET reserved = reserved - $2, updated_at = now() WHERE id = $1`
	// Capture releases the hold and debits the payer in one row version.
	sqlCapture   = `UPDATE accounts SET reserved = reserved - $2, balance = balance - $2, updated_at = now() WHERE id = $1`
	sqlSetStatus = `UPDATE payments SET status = $2, failure_code = NULLIF($3, ''),
provider_reference = coalesce(NULLIF($4, ''), provider_reference), updated_at = now()
WHERE id = $1 AND status = ANY($5) RETURNING ` + paymentColumns
	// sqlSetStatus that also returns the merchant's settlement account in the payment's currency
	// (NULL if it has none), which the capture credits.
	sqlSetStatusSettlement = sqlSetStatus + `, (SELECT a.id FROM accounts a
WHERE a.merchant_id = payments.merchant_id AND a.currency = payments.currency AND a.kind = 'settlement') AS settlement_id`
	// A completed record gets its stored answer in the same statement; an earlier one is kept.
	sqlRecordStatus = `UPDATE idempotency_records SET status = $2, outcome = coalesce(outcome, $3),
response_body = coalesce(response_body, $4), updated_at = now() WHERE operation_id = $1`
	sqlInsertOutbox = `INSERT INTO outbox (id, aggregate_id, type, payload) VALUES ($1, $2, $3, $4)`
)

const sqlBeginChargeAttempt = `UPDATE payments SET charge_attempts = charge_attempts + 1 WHERE id = $1 RETURNING charge_attempts`

// BeginChargeAttempt records, durably, that a charge of the operation is about to be sent, and
// returns which attempt this is (1 for the first).
func (s *Store) BeginChargeAttempt(ctx context.Context, operationID uuid.UUID) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, sqlBeginChargeAttempt, operationID).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, payment.ErrNotFound
	}
	return n, translate(err)
}

// Reserve holds the payment's amount on the payer's account. A repeated call finds the
// reservation made and changes nothing. payment.ErrInsufficientFunds when the available balance
// is too small (nothing is held then).
func (s *Store) Reserve(ctx context.Context, operationID uuid.UUID) error {
	var found, already, reserved bool
	if err := s.pool.QueryRow(ctx, sqlReserveFunds, operationID, payment.NewID()).Scan(&found, &already, &reserved); err != nil {
		return translate(err)
	}
	switch {
	case !found:
		return payment.ErrNotFound
	case already || reserved:
		return nil
	}
	// Not held, but perhaps because a concurrent attempt for this payment held it first: the
	// statement's snapshot did not see that reservation, while its balance check saw the hold.
	if err := s.pool.QueryRow(ctx, sqlReservationExists, operationID).Scan(&already); err != nil {
		return translate(err)
	}
	if already {
		return nil
	}
	return payment.ErrInsufficientFunds
}

// Finalize captures a reserved payment: one balanced posting moves the amount from the payer to
// the merchant's settlement account, the payment becomes succeeded, the idempotency record
// completed, and the event is queued in the outbox, all in one transaction.
func (s *Store) Finalize(ctx context.Context, operationID uuid.UUID, providerRef string) (payment.Payment, error) {
	var p payment.Payment
	var answer *Answer
	err := s.pipelined(ctx, func(tx *pipeTx) error {
		answer = nil
		// Two round trips: what the rest depends on (with BEGIN), then the rest (with COMMIT).
		// A surprise in the first returns before the second is sent and rolls everything back.
		var account uuid.UUID
		var settlement *uuid.UUID
		var amount int64
		b := &pgx.Batch{}
		b.Queue(sqlCloseReservation, operationID, "finalized")
		b.Queue(sqlSetStatusSettlement, operationID, payment.StatusSucceeded, "", providerRef, fromStatuses(payment.StatusSucceeded))
		br := tx.send(ctx, b)
		closeErr := br.QueryRow().Scan(&account, &amount)
		p2, setErr := scanPayment(br.QueryRow(), &settlement)
		if err := br.Close(); err != nil {
			return err
		}
		if errors.Is(closeErr, pgx.ErrNoRows) {
			if setErr == nil {
				return fmt.Errorf("%w: payment %s was %s without an active reservation", ErrInconsistent, operationID, payment.StatusProcessing)
			}
			tx.nothingToCommit()
			return s.alreadyDone(ctx, tx, operationID, payment.StatusSucceeded, &p)
		}
		if closeErr != nil {
			return closeErr
		}
		if setErr != nil {
			return setErr
		}
		p = p2
		if settlement == nil { // retried: an operator may still open it
			return fmt.Errorf("merchant %s has no settlement account in %s", p.MerchantID, p.Currency)
		}
		b = &pgx.Batch{}
		b.Queue(sqlCapture, account, amount)
		postingID := payment.NewID()
		b.Queue(sqlInsertPosting, postingID, "payment", operationID.String())
		a, err := queueComplete(b, p, RecordCompleted)
		if err != nil {
			return err
		}
		answer = a
		b.Queue(sqlInsertEntryPair, payment.NewID(), postingID, account, p.Currency, -amount, payment.NewID(), *settlement, amount)
		// Last: crediting the merchant's settlement account locks its row, which every payment
		// to this merchant needs; holding it only until the commit keeps a hot account moving.
		b.Queue(sqlCredit, *settlement, amount)
		return tx.commit(ctx, b)
	})
	if err == nil {
		s.announce(operationID, answer)
	}
	return p, err
}

// Release fails a payment with a code and gives its reservation (if any) back to the payer.
func (s *Store) Release(ctx context.Context, operationID uuid.UUID, failureCode string) (payment.Payment, error) {
	var p payment.Payment
	var answer *Answer
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var account uuid.UUID
		var amount int64
		err := tx.QueryRow(ctx, sqlCloseReservation, operationID, "released").Scan(&account, &amount)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		default:
			if _, err := tx.Exec(ctx, sqlUnreserve, account, amount); err != nil {
				return err
			}
		}
		p, answer, err = s.transition(ctx, tx, operationID, payment.StatusFailed, failureCode, RecordCompleted)
		return err
	})
	if err == nil {
		s.announce(operationID, answer)
	}
	return p, err
}

// MarkUnknown parks a processing payment whose outcome at the provider cannot be known. Its
// reservation stays: the bank may have moved the money.
func (s *Store) MarkUnknown(ctx context.Context, operationID uuid.UUID) (payment.Payment, error) {
	var p payment.Payment
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var err error
		p, _, err = s.transition(ctx, tx, operationID, payment.StatusUnknown, "", RecordUnknown)
		return err
	})
	if err == nil {
		s.announce(operationID, nil)
	}
	return p, err
}

// transition moves a payment (and its record) to status `to`, or finds it there already from an
// earlier run of the same step. A move that completes the record returns the answer it stored.
func (s *Store) transition(ctx context.Context, tx pgx.Tx, id uuid.UUID, to payment.Status, failureCode string, rs RecordStatus) (payment.Payment, *Answer, error) {
	p, err := setStatus(ctx, tx, id, to, failureCode, "")
	if errors.Is(err, payment.ErrNotFound) {
		err = s.alreadyDone(ctx, tx, id, to, &p)
		return p, nil, err
	}
	if err != nil {
		return p, nil, err
	}
	a, err := completeRecord(ctx, tx, p, rs)
	return p, a, err
}

// rowQuerier runs a query of one row: a pgx.Tx or a pipeTx.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// alreadyDone makes a repeated step a no-op when the payment already has the wanted status, and
// an ErrInconsistent when it has a contradicting one.
func (s *Store) alreadyDone(ctx context.Context, tx rowQuerier, operationID uuid.UUID, want payment.Status, p *payment.Payment) error {
	cur, err := scanPayment(tx.QueryRow(ctx, sqlPayment, operationID))
	if err != nil {
		return err
	}
	*p = cur
	if cur.Status != want {
		return fmt.Errorf("%w: payment %s is %s, cannot become %s", ErrInconsistent, operationID, cur.Status, want)
	}
	return nil
}

func setStatus(ctx context.Context, tx pgx.Tx, id uuid.UUID, to payment.Status, failureCode, providerRef string) (payment.Payment, error) {
	return scanPayment(tx.QueryRow(ctx, sqlSetStatus, id, to, failureCode, providerRef, fromStatuses(to)))
}

// fromStatuses are the non-final statuses a payment may become `to` from.
func fromStatuses(to payment.Status) []string {
	var from []string
	for _, st := range []payment.Status{payment.StatusProcessing, payment.StatusUnknown} {
		if st.CanBecome(to) {
			from = append(from, string(st))
		}
	}
	return from
}

// completeRecord moves the idempotency record along with the payment (with its stored answer
// when it is completed) and queues the event.
func completeRecord(ctx context.Context, tx pgx.Tx, p payment.Payment, rs RecordStatus) (*Answer, error) {
	b := &pgx.Batch{}
	a, err := queueComplete(b, p, rs)
	if err != nil {
		return nil, err
	}
	return a, tx.SendBatch(ctx, b).Close()
}

// queueComplete queues the record's move to rs and the payment's event. Moving to completed, it
// returns the answer it stores: the record had none, as only a completed record has one and
// the payment was not final until this transaction.
func queueComplete(b *pgx.Batch, p payment.Payment, rs RecordStatus) (*Answer, error) {
	var a *Answer
	var outcome *payment.Status
	var body []byte
	if rs == RecordCompleted {
		bd, err := p.AnswerBody()
		if err != nil {
			return nil, err
		}
		outcome, body, a = &p.Status, bd, &Answer{Outcome: p.Status, Body: bd}
	}
	payload, err := json.Marshal(p.Resource())
	if err != nil {
		return nil, err
	}
	b.Queue(sqlRecordStatus, p.ID, rs, outcome, body)
	b.Queue(sqlInsertOutbox, payment.NewID(), p.ID, "payment."+string(p.Status), payload)
	return a, nil
}
