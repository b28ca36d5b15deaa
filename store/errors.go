package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kasa-pay/kasa/payment"
)

// Errors the store returns besides the payment package's domain errors.
var (
	// ErrUnavailable: the database cannot be reached; the caller may retry later.
	ErrUnavailable = payment.ErrUnavailable
	// ErrConflict: serialization failure or deadlock; retrying the whole transaction is safe.
	ErrConflict = errors.New("transaction conflict, retry")
	// ErrInconsistent: the data contradicts an invariant; a person must look.
	ErrInconsistent = payment.ErrInconsistent
)

// translate maps PostgreSQL errors to domain errors once, here.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return payment.ErrNotFound
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01":
			return fmt.Errorf("%w: %s", ErrConflict, pgErr.Message)
		case "23514":
			if pgErr.ConstraintName == "accounts_funds" {
				return payment.ErrInsufficientFunds
			}
		case "23505":
			if pgErr.ConstraintName == "payments_business_key" {
				return fmt.Errorf("%w: %s", errLivePayment, pgErr.Message)
			}
			if pgErr.ConstraintName == "refunds_key" { // BeginRefund checks first; the index is the last word
				return payment.ErrIdempotencyReused // its text reaches the merchant: nothing of the schema
			}
		case "23503":
			if pgErr.ConstraintName == "accounts_merchant_id_fkey" {
				return payment.ErrNotFound // an account for a merchant that does not exist
			}
		case "57P01", "57P02", "57P03", "53300",
			"57014", "55P03": // a statement or lock timeout, or a canceled statement: try again later
			return fmt.Errorf("%w: %s", ErrUnavailable, pgErr.Message)
		}
		return err
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: connection lost: %v", ErrUnavailable, err)
	}
	var netErr net.Error
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	return err
}

// errLivePayment: the invoice has a live payment already (Begin looks it up).
var errLivePayment = errors.New("invoice has a live payment")
