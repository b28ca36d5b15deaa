package store_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for goose
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// The keys migration runs on a database that already has merchants: each merchant's key moves to
// api_keys (a time-ordered id from the merchant's creation) and keeps authenticating.
func TestKeysMigrationKeepsExistingMerchantsKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	sqlDB, err := sql.Open("pgx", url)
	require.NoError(t, err)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, os.DirFS("../schema/migrations"))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 6) // the schema before API keys had a table of their own
	require.NoError(t, err)
	old := payment.NewID()
	_, err = sqlDB.ExecContext(ctx, `INSERT INTO merchants (id, name, api_key_hash, webhook_secret_enc, created_at)
		VALUES ($1, 'old', $2, '\x00', '2024-05-01T10:00:00Z')`, old, payment.HashAPIKey("sk_old"))
	require.NoError(t, err)

	own, err := store.Open(ctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true})
	require.NoError(t, err)
	defer own.Close()
	m, err := own.MerchantByAPIKey(ctx, "sk_old")
	require.NoError(t, err)
	require.Equal(t, old, m.ID)
	keys, err := own.APIKeys(ctx, old)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, uuid.Version(7), keys[0].ID.Version())
	require.Equal(t, time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), keys[0].CreatedAt.UTC())
	sec, _ := keys[0].ID.Time().UnixTime()
	require.Equal(t, keys[0].CreatedAt.Unix(), sec, "the id is ordered by the key's creation")
	require.Nil(t, keys[0].RevokedAt)

	// And down again: the merchant's first live key goes back into merchants.
	_, err = p.DownTo(ctx, 6)
	require.NoError(t, err)
	var hash []byte
	require.NoError(t, sqlDB.QueryRowContext(ctx, `SELECT api_key_hash FROM merchants WHERE id = $1`, old).Scan(&hash))
	require.Equal(t, payment.HashAPIKey("sk_old"), hash)
}

// A merchant has several keys; a revoked one is refused at once by the database, the others
// keep working; revoking again changes nothing; another merchant's key id is not found.
func TestAPIKeysAddRevoke(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := payment.Merchant{ID: payment.NewID(), Name: "keys"}
	first := payment.NewID()
	require.NoError(t, db.CreateMerchantWithKey(ctx, m, first, "sk_first_"+m.ID.String(), "whsec"))
	second := payment.NewID()
	require.NoError(t, db.AddAPIKey(ctx, m.ID, second, "sk_second_"+m.ID.String()))
	require.ErrorIs(t, db.AddAPIKey(ctx, payment.NewID(), payment.NewID(), "sk_nobody_"+m.ID.String()), payment.ErrNotFound)

	for _, k := range []string{"sk_first_", "sk_second_"} {
		got, err := db.MerchantByAPIKey(ctx, k+m.ID.String())
		require.NoError(t, err)
		require.Equal(t, m.ID, got.ID)
	}
	require.NoError(t, db.RevokeAPIKey(ctx, m.ID, first))
	_, err := db.MerchantByAPIKey(ctx, "sk_first_"+m.ID.String())
	require.ErrorIs(t, err, payment.ErrUnauthorized)
	_, err = db.MerchantByAPIKey(ctx, "sk_second_"+m.ID.String())
	require.NoError(t, err)

	keys, err := db.APIKeys(ctx, m.ID)
	require.NoError(t, err)
	require.Len(t, keys, 2)
	require.Equal(t, first, keys[0].ID)
	require.NotNil(t, keys[0].RevokedAt)
	revokedAt := *keys[0].RevokedAt
	require.Nil(t, keys[1].RevokedAt)

	require.NoError(t, db.RevokeAPIKey(ctx, m.ID, first), "a second revocation is not an error")
	keys, err = db.APIKeys(ctx, m.ID)
	require.NoError(t, err)
	require.Equal(t, revokedAt, *keys[0].RevokedAt, "and keeps the first revocation's time")

	other := testkit.NewMerchant(t, db, testkit.MerchantOptions{})
	require.ErrorIs(t, db.RevokeAPIKey(ctx, other.ID, second), payment.ErrNotFound, "another merchant's key")
	require.ErrorIs(t, db.RevokeAPIKey(ctx, m.ID, payment.NewID()), payment.ErrNotFound)
	_, err = db.APIKeys(ctx, payment.NewID())
	require.ErrorIs(t, err, payment.ErrNotFound)
}

// A rotated webhook secret signs alone after the overlap; during it the previous one is handed
// to the sender too.
func TestRotateWebhookSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{WebhookURL: "https://m.example/hooks", WebhookSecret: "whsec_one"})
	_, err := own.RotateWebhookSecret(ctx, payment.NewID(), "whsec_x", time.Hour)
	require.ErrorIs(t, err, payment.ErrNotFound)

	until, err := own.RotateWebhookSecret(ctx, m.ID, "whsec_two", time.Hour)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(time.Hour), until, 5*time.Second)
	require.NoError(t, own.Exec(ctx, `INSERT INTO webhook_deliveries (id, merchant_id, aggregate_id, event_type, event_created_at, url, body, status)
		VALUES ($1, $2, $3, 'payment.succeeded', now(), 'https://m.example/hooks', '{}', 'pending')`, payment.NewID(), m.ID, payment.NewID()))
	ds, err := own.ClaimDeliveries(ctx, 10, 10, time.Millisecond)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, "whsec_two", ds[0].Secret)
	require.Equal(t, "whsec_one", ds[0].PreviousSecret)

	// Rotated again: the newest previous secret is kept; once expired it is not handed out.
	_, err = own.RotateWebhookSecret(ctx, m.ID, "whsec_three", -time.Second)
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond) // the lease of the first claim
	ds, err = own.ClaimDeliveries(ctx, 10, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, "whsec_three", ds[0].Secret)
	require.Empty(t, ds[0].PreviousSecret)

	// A leaked secret revoked at once (no overlap) is not kept at all.
	_, err = own.RotateWebhookSecret(ctx, m.ID, "whsec_four", time.Hour)
	require.NoError(t, err)
	_, err = own.RotateWebhookSecret(ctx, m.ID, "whsec_five", 0)
	require.NoError(t, err)
	require.NoError(t, own.Exec(ctx, `SELECT 1 / (CASE WHEN webhook_secret_prev_enc IS NULL THEN 1 ELSE 0 END) FROM merchants WHERE id = $1`, m.ID),
		"the revoked secret is wiped")
}
