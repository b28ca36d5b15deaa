package store

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

func TestUUIDCodecPlansBytes(t *testing.T) {
	m := pgtype.NewMap()
	m.RegisterType(uuidType)
	require.IsType(t, uuidBinary{}, m.PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, uuid.UUID{}))
	require.IsType(t, uuidBinary{}, m.PlanScan(pgtype.UUIDOID, pgtype.BinaryFormatCode, &uuid.UUID{}))
}
