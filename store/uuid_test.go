package store_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// uuid.UUID travels as 16 bytes both ways, and NULLs, text casts and arrays still work.
func TestUUIDValuesRoundTrip(t *testing.T) {
	ctx := context.Background()
	id, other := payment.NewID(), payment.NewID()

	var got uuid.UUID
	var text string
	require.NoError(t, db.QueryRow(ctx, `SELECT $1::uuid, $1::uuid::text`, []any{id}, &got, &text))
	require.Equal(t, id, got)
	require.Equal(t, id.String(), text)

	var isNull bool
	require.NoError(t, db.QueryRow(ctx, `SELECT $1::uuid IS NULL`, []any{(*uuid.UUID)(nil)}, &isNull))
	require.True(t, isNull)
	ptr := &id
	require.NoError(t, db.QueryRow(ctx, `SELECT NULL::uuid`, nil, &ptr))
	require.Nil(t, ptr)
	require.Error(t, db.QueryRow(ctx, `SELECT NULL::uuid`, nil, &got), "NULL into a uuid.UUID")

	var n int
	var ids []uuid.UUID
	require.NoError(t, db.QueryRow(ctx, `SELECT cardinality($1::uuid[]), $1::uuid[]`, []any{[]uuid.UUID{id, other}}, &n, &ids))
	require.Equal(t, 2, n)
	require.Equal(t, []uuid.UUID{id, other}, ids)

	require.NoError(t, db.QueryRow(ctx, `SELECT $1::text::uuid`, []any{other.String()}, &got))
	require.Equal(t, other, got)
}
