package store

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// A refund key lost in a race to its unique index answers as a reused key, and the answer names
// none of the database's insides (the merchant reads its detail).
func TestRefundKeyRaceNamesNoConstraint(t *testing.T) {
	err := translate(&pgconn.PgError{Code: "23505", ConstraintName: "refunds_key",
		Message: `duplicate key value violates unique constraint "refunds_key"`})
	require.ErrorIs(t, err, payment.ErrIdempotencyReused)
	require.NotContains(t, err.Error(), "refunds_key")
}
