package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// Command is a capture or a cancel of a manual payment under a merchant's Idempotency-Key: one
// key space for both, kept for good once answered.
type Command struct {
	MerchantID  uuid.UUID
	Key         string
	ID          uuid.UUID // the command's own id: the workflow update's and the bank call's key
	PaymentID   uuid.UUID
	Kind        payment.Command
	RequestHash string
	AmountMinor int64 // a capture's amount (0 for all that is capturable)
	LockedUntil time.Time
	// ResponseStatus and ResponseBody are the answer every request with the key repeats; zero
	// and nil until it is stored.
	ResponseStatus int
	ResponseBody   []byte
}

// Answered reports whether the command has its stored answer.
func (c Command) Answered() bool { return c.ResponseStatus != 0 }

func commandOf(r dbsqlc.PaymentCommand) Command {
	c := Command{
		MerchantID: r.MerchantID, Key: r.IdempotencyKey, ID: r.ID, PaymentID: r.PaymentID, Kind: payment.Command(r.Kind),
		RequestHash: r.RequestHash, AmountMinor: r.AmountMinor, LockedUntil: orZero(r.LockedUntil), ResponseBody: r.ResponseBody,
	}
	if r.ResponseStatus != nil {
		c.ResponseStatus = int(*r.ResponseStatus)
	}
	return c
}

// BeginCommand records c under its key, leased to the caller for lease, and reports true; or,
// when the key has a command already, writes nothing and returns that one.
func (s *Store) BeginCommand(ctx context.Context, c Command, lease time.Duration) (Command, bool, error) {
	var r dbsqlc.PaymentCommand
	err := s.pool.QueryRow(ctx, dbsqlc.InsertCommand, c.MerchantID, c.Key, c.ID, c.PaymentID, string(c.Kind), c.RequestHash,
		c.AmountMinor, lease.String()).Scan(columns(&r)...)
	if err == nil {
		return commandOf(r), true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Command{}, false, translate(err)
	}
	existing, err := s.Command(ctx, c.MerchantID, c.Key)
	return existing, false, err
}

// Command is the merchant's command under key; payment.ErrNotFound if there is none.
func (s *Store) Command(ctx context.Context, merchantID uuid.UUID, key string) (Command, error) {
	var r dbsqlc.PaymentCommand
	if err := s.pool.QueryRow(ctx, dbsqlc.GetCommand, merchantID, key).Scan(columns(&r)...); err != nil {
		return Command{}, translate(err)
	}
	return commandOf(r), nil
}

// LeaseCommand takes over an unanswered command whose lease ran out; false if another request
// holds it (or it was answered meanwhile).
func (s *Store) LeaseCommand(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error) {
	n, err := s.pool.Exec(ctx, dbsqlc.LeaseCommand, lease.String(), merchantID, key)
	return err == nil && n.RowsAffected() == 1, translate(err)
}

// AnswerCommand stores the command's answer (the first stored stays) and ends its lease.
func (s *Store) AnswerCommand(ctx context.Context, merchantID uuid.UUID, key string, status int, body []byte) error {
	_, err := s.pool.Exec(ctx, dbsqlc.AnswerCommand, int32(status), body, merchantID, key)
	return translate(err)
}

// UnleaseCommand ends the lease of an unanswered command, so the next request with its key
// looks again at once.
func (s *Store) UnleaseCommand(ctx context.Context, merchantID uuid.UUID, key string) error {
	_, err := s.pool.Exec(ctx, dbsqlc.UnleaseCommand, merchantID, key)
	return translate(err)
}

// DeleteCommand forgets an unanswered command that was refused: it changed nothing.
func (s *Store) DeleteCommand(ctx context.Context, merchantID uuid.UUID, key string) error {
	_, err := s.pool.Exec(ctx, dbsqlc.DeleteCommand, merchantID, key)
	return translate(err)
}

// CaptureInFlight says whether a capture of the payment was sent to its workflow and has not
// finished: a payment still waiting for its capture may already be captured at the bank.
func (s *Store) CaptureInFlight(ctx context.Context, paymentID uuid.UUID) (bool, error) {
	var inFlight bool
	err := s.pool.QueryRow(ctx, dbsqlc.CaptureInFlight, paymentID).Scan(&inFlight)
	return inFlight, translate(err)
}

// CaptureAmountsInFlight are the amounts the payment's captures in flight ask for, a capture of
// all that is capturable as the payment's amount.
func (s *Store) CaptureAmountsInFlight(ctx context.Context, paymentID uuid.UUID) ([]int64, error) {
	amounts, err := s.q.CaptureAmountsInFlight(ctx, paymentID)
	return amounts, translate(err)
}

// CaptureClosed are the manual payments among ids that take no capture now, though they may
// still read requires_capture: a capture or cancel is under way, or the capture window is over
// by the database's clock. Their capturable is nothing.
func (s *Store) CaptureClosed(ctx context.Context, ids []uuid.UUID) ([]uuid.UUID, error) {
	closed, err := s.q.CaptureClosed(ctx, ids)
	return closed, translate(err)
}

// TakenCommand is the id of the capture or cancel that decided the payment, or uuid.Nil when no
// command did (the expiry; or a payment decided before commands were marked).
func (s *Store) TakenCommand(ctx context.Context, paymentID uuid.UUID) (uuid.UUID, error) {
	var id uuid.UUID
	err := s.pool.QueryRow(ctx, dbsqlc.TakenCommand, paymentID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, nil
	}
	return id, translate(err)
}
