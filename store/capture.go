package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// A manual payment's steps (docs/api.md, "Authorize now, capture later"). Its hold is taken by
// Reserve as an automatic payment's, and kept whole while it waits for its capture.

// Authorized records the bank's authorization (ref) of a manual payment: it waits in
// requires_capture, and the request that created it is answered.
func (s *Store) Authorized(ctx context.Context, operationID uuid.UUID, providerRef string) (payment.Payment, error) {
	var p payment.Payment
	var answer *Answer
	err := s.tx(ctx, func(tx pgx.Tx) error {
		// Recorded before, the authorization is never reopened: an unknown payment with one is
		// unknown in its capture or void, and reopened it could be captured twice.
		var open bool
		if err := tx.QueryRow(ctx, dbsqlc.AuthorizationOpen, operationID).Scan(&open); err != nil {
			return err
		}
		if open {
			return s.alreadyDone(ctx, tx, operationID, payment.StatusRequiresCapture, &p)
		}
		var err error
		p, err = setStatus(ctx, tx, operationID, payment.StatusRequiresCapture, "", providerRef)
		if errors.Is(err, payment.ErrNotFound) {
			return s.alreadyDone(ctx, tx, operationID, payment.StatusRequiresCapture, &p)
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, dbsqlc.OpenAuthorization, operationID); err != nil {
			return err
		}
		answer, err = completeRecord(ctx, tx, p, RecordCompleted)
		return err
	})
	if err == nil {
		s.announce(operationID, answer)
	}
	return p, err
}

// Captured posts a manual payment's capture of amount: the payer's hold goes, amount moves to the
// merchant in one balanced posting, and the rest of the hold is released, in one transaction,
// which marks command (when not uuid.Nil) as the one taken.
func (s *Store) Captured(ctx context.Context, operationID uuid.UUID, amount int64, providerRef string, command uuid.UUID) (payment.Payment, error) {
	var p payment.Payment
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var account uuid.UUID
		var held int64
		err := tx.QueryRow(ctx, dbsqlc.CloseReservation, operationID, "finalized").Scan(&account, &held)
		if errors.Is(err, pgx.ErrNoRows) {
			return s.alreadyDone(ctx, tx, operationID, payment.StatusSucceeded, &p)
		}
		if err != nil {
			return err
		}
		if amount <= 0 || amount > held {
			return fmt.Errorf("%w: capture of %d from a hold of %d", ErrInconsistent, amount, held)
		}
		var settlement *uuid.UUID
		p, err = scanPayment(tx.QueryRow(ctx, dbsqlc.CapturePayment, amount, providerRef, operationID), &settlement)
		if errors.Is(err, payment.ErrNotFound) {
			return fmt.Errorf("%w: payment %s has an active hold but is not waiting for a capture", ErrInconsistent, operationID)
		}
		if err != nil {
			return err
		}
		if settlement == nil { // retried: an operator may still open it
			return fmt.Errorf("merchant %s has no settlement account in %s", p.MerchantID, p.Currency)
		}
		b := &pgx.Batch{}
		b.Queue(dbsqlc.CloseAuthorization, operationID)
		b.Queue(dbsqlc.TakeCommand, command)
		if rest := held - amount; rest > 0 {
			b.Queue(dbsqlc.Unreserve, account, rest)
		}
		if _, err := queueCompleteEvent(b, p, RecordCompleted, "payment.captured"); err != nil {
			return err
		}
		b.Queue(dbsqlc.PostPayment, account, amount, payment.NewID(), operationID.String(),
			payment.NewID(), p.Currency, payment.NewID(), *settlement, shardOf(operationID))
		return tx.SendBatch(ctx, b).Close()
	})
	return p, err
}

// Canceled lets a manual payment's authorization go: the hold is released and the payment is
// canceled with the code (payment.FailureCanceled, or FailureAuthorizationExpired), and command
// (when not uuid.Nil: the cancel, or the capture the bank declined) is marked as the one taken.
func (s *Store) Canceled(ctx context.Context, operationID uuid.UUID, code string, command uuid.UUID) (payment.Payment, error) {
	var p payment.Payment
	err := s.tx(ctx, func(tx pgx.Tx) error {
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
		if _, err := tx.Exec(ctx, dbsqlc.CloseAuthorization, operationID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, dbsqlc.TakeCommand, command); err != nil {
			return err
		}
		p, _, err = s.transition(ctx, tx, operationID, payment.StatusCanceled, code, RecordCompleted)
		return err
	})
	return p, err
}
