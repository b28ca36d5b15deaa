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

// The workflow's steps. Each is one short transaction, safe to repeat: a retried activity finds
// the step done (by the reservation's or the payment's status) and changes nothing. No row lock
// is ever held across a call to the provider.

// BeginChargeAttempt records, durably, that a charge of the operation is about to be sent, and
// returns which attempt this is (1 for the first).
func (s *Store) BeginChargeAttempt(ctx context.Context, operationID uuid.UUID) (int, error) {
	var n int32
	err := s.recordSend(ctx, func(q *dbsqlc.Queries) (err error) {
		n, err = q.BeginChargeAttempt(ctx, operationID)
		return err // no rows: payment.ErrNotFound
	})
	return int(n), err
}

// BeginChargeSend records, durably, that the workflow's send number send (1 for the first) of
// the operation's charge is about to go out. It reports false when that send was begun before:
// this is a repeat of it by a new worker, and the earlier one may have reached the provider.
func (s *Store) BeginChargeSend(ctx context.Context, operationID uuid.UUID, send int) (bool, error) {
	var n int64
	err := s.recordSend(ctx, func(q *dbsqlc.Queries) (err error) {
		n, err = q.BeginChargeSend(ctx, dbsqlc.BeginChargeSendParams{ID: operationID, Send: int32(send)})
		return err
	})
	return n == 1, err
}

// recordSend runs record, which records that a send is about to go out, in a transaction of its
// own. A recorded send is one a repeated attempt never makes again, so the answer of the commit
// is not guessed at when it is lost on the way back (the connection dropped after COMMIT went
// out): the transaction's id, read before the commit, says whether it committed. An aborted one
// wrote nothing, and records again.
func (s *Store) recordSend(ctx context.Context, record func(q *dbsqlc.Queries) error) error {
	for try := 1; ; try++ {
		var xact string
		committing := false
		err := s.tx(ctx, func(tx pgx.Tx) error {
			q := s.q.WithTx(tx)
			if err := record(q); err != nil {
				return err
			}
			var err error
			xact, err = q.CurrentXact(ctx)
			committing = err == nil
			return err
		})
		if err == nil || !committing {
			return err
		}
		status, serr := s.xactStatus(ctx, xact)
		switch {
		case serr == nil && status == "committed":
			return nil
		case serr == nil && status == "aborted" && try < 3:
			continue
		}
		return err
	}
}

// xactStatus is the fate of the transaction xact: committed or aborted, or, after a few seconds
// in progress, in progress.
func (s *Store) xactStatus(ctx context.Context, xact string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		status, err := s.q.XactStatus(ctx, xact)
		if err != nil || status != "in progress" {
			return status, translate(err)
		}
		select {
		case <-ctx.Done():
			return status, nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// FlagStuck marks the payment as needing an operator, with the reason; an empty reason clears
// the mark. payment.ErrNotFound when there is no such payment.
func (s *Store) FlagStuck(ctx context.Context, operationID uuid.UUID, reason string) error {
	n, err := s.q.FlagStuck(ctx, dbsqlc.FlagStuckParams{ID: operationID, Reason: reason})
	if err == nil && n == 0 {
		return payment.ErrNotFound
	}
	return translate(err)
}

// Reserve holds the payment's amount on the payer's account. A repeated call finds the
// reservation made and changes nothing. payment.ErrInsufficientFunds when the available balance
// is too small (nothing is held then).
func (s *Store) Reserve(ctx context.Context, operationID uuid.UUID) error {
	return s.ReserveRun(ctx, operationID, "")
}

// ReserveRun is Reserve for the workflow run runID, which it records as the run that took the
// operation on. A payment no longer processing is refused (ErrInconsistent: a second run of a
// decided payment holds nothing), unless runID is that run, executing its first step again
// after its worker died. An empty runID (runs from before the rule) refuses nothing.
func (s *Store) ReserveRun(ctx context.Context, operationID uuid.UUID, runID string) error {
	r, err := s.q.ReserveFunds(ctx, dbsqlc.ReserveFundsParams{OperationID: operationID, ID: payment.NewID(), RunID: orNull(runID)})
	if err != nil {
		return translate(err)
	}
	switch {
	case !r.Found:
		return payment.ErrNotFound
	case runID != "" && payment.Status(r.Status) != payment.StatusProcessing && r.RunOfRecord != runID:
		return &payment.DecidedError{ID: operationID.String(), Status: payment.Status(r.Status), RunOfRecord: r.RunOfRecord}
	case r.Already || r.Reserved:
		return nil
	}
	// Not held, but perhaps because a concurrent attempt for this payment held it first: the
	// statement's snapshot did not see that reservation, while its balance check saw the hold.
	already, err := s.q.ReservationExists(ctx, operationID)
	if err != nil {
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
		b.Queue(dbsqlc.CloseReservation, operationID, "finalized")
		b.Queue(dbsqlc.SetPaymentStatusSettlement, operationID, payment.StatusSucceeded, "", providerRef, fromStatuses(payment.StatusSucceeded))
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
		a, err := queueComplete(b, p, RecordCompleted)
		if err != nil {
			return err
		}
		answer = a
		// Last: the ledger, which ends by crediting one of the merchant's settlement shards, a
		// lock other payments to this merchant may need, held only until the commit after it.
		b.Queue(dbsqlc.PostPayment, account, amount, payment.NewID(), operationID.String(),
			payment.NewID(), p.Currency, payment.NewID(), *settlement, shardOf(operationID))
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
		// A Reserve attempt still running (another attempt found insufficient funds) holds
		// the payment's row: its hold, if any, is seen below and released.
		if _, err := tx.Exec(ctx, dbsqlc.LockPaymentRow, operationID); err != nil {
			return err
		}
		var account uuid.UUID
		var amount int64
		err := tx.QueryRow(ctx, dbsqlc.CloseReservation, operationID, "released").Scan(&account, &amount)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		default:
			if _, err := tx.Exec(ctx, dbsqlc.Unreserve, account, amount); err != nil {
				return err
			}
		}
		p, answer, err = s.transition(ctx, tx, operationID, payment.StatusFailed, failureCode, RecordCompleted)
		if err != nil || !p.CaptureManual {
			return err
		}
		// The bank holds an open authorization until a void lets it go (canceled): never failed.
		var open bool
		if err := tx.QueryRow(ctx, dbsqlc.AuthorizationOpen, operationID).Scan(&open); err != nil {
			return err
		}
		if open {
			return fmt.Errorf("%w: payment %s holds an open authorization at the bank: only its void lets it go", ErrInconsistent, operationID)
		}
		return nil
	})
	if err == nil {
		s.announce(operationID, answer)
	}
	return p, err
}

// MarkUnknown parks a processing payment whose outcome at the provider cannot be known. Its
// reservation stays: the bank may have moved the money.
func (s *Store) MarkUnknown(ctx context.Context, operationID uuid.UUID) (payment.Payment, error) {
	return s.markUnknown(ctx, operationID, fromStatuses(payment.StatusUnknown))
}

// MarkAuthorizationUnknown is MarkUnknown for a manual payment whose authorization got no
// answer: only a processing payment becomes unknown. One that reads requires_capture (another
// run recorded the authorization as this one marked it) is ErrInconsistent, never reopened: its
// authorization, open at the bank, would have nothing to capture or void it.
func (s *Store) MarkAuthorizationUnknown(ctx context.Context, operationID uuid.UUID) (payment.Payment, error) {
	return s.markUnknown(ctx, operationID, []string{string(payment.StatusProcessing)})
}

func (s *Store) markUnknown(ctx context.Context, operationID uuid.UUID, from []string) (payment.Payment, error) {
	var p payment.Payment
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var err error
		p, _, err = s.transitionFrom(ctx, tx, operationID, payment.StatusUnknown, "", RecordUnknown, from)
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
	return s.transitionFrom(ctx, tx, id, to, failureCode, rs, fromStatuses(to))
}

// transitionFrom is transition from the statuses from only.
func (s *Store) transitionFrom(ctx context.Context, tx pgx.Tx, id uuid.UUID, to payment.Status, failureCode string, rs RecordStatus, from []string) (payment.Payment, *Answer, error) {
	p, err := scanPayment(tx.QueryRow(ctx, dbsqlc.SetPaymentStatus, id, to, failureCode, "", from))
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
	cur, err := scanPayment(tx.QueryRow(ctx, dbsqlc.GetPayment, operationID))
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
	return scanPayment(tx.QueryRow(ctx, dbsqlc.SetPaymentStatus, id, to, failureCode, providerRef, fromStatuses(to)))
}

// fromStatuses are the non-final statuses a payment may become `to` from.
func fromStatuses(to payment.Status) []string {
	var from []string
	for _, st := range []payment.Status{payment.StatusProcessing, payment.StatusRequiresCapture, payment.StatusUnknown} {
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
	return queueCompleteEvent(b, p, rs, "payment."+string(p.Status))
}

// queueCompleteEvent is queueComplete with the event's type.
func queueCompleteEvent(b *pgx.Batch, p payment.Payment, rs RecordStatus, eventType string) (*Answer, error) {
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
	b.Queue(dbsqlc.CompleteWithEvent, p.ID, rs, outcome, body, payment.NewID(), eventType, payload)
	return a, nil
}

// orNull is s, or SQL NULL when it is empty.
func orNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
