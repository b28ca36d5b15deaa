package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
)

// DefaultPreloadChunk is how many payments one COPY transaction loads when PreloadOptions.Chunk is 0.
const DefaultPreloadChunk = 100_000

// PreloadOptions say what Preload loads.
type PreloadOptions struct {
	// Merchants get the rows round-robin: row i belongs to Merchants[i%len(Merchants)] and is
	// paid from that merchant's oldest customer account, which must exist.
	Merchants []uuid.UUID
	N         int                   // rows (payment + idempotency record pairs) to load
	Chunk     int                   // rows per COPY transaction; DefaultPreloadChunk when 0
	Progress  func(done, total int) // called after every committed chunk; may be nil
}

// PreloadResult says what Preload loaded. Row i has idempotency key KeyPrefix+strconv.Itoa(i)
// (and invoice id "inv-"+KeyPrefix+strconv.Itoa(i)) under its merchant.
type PreloadResult struct {
	Rows      int
	Elapsed   time.Duration
	KeyPrefix string // unique per call, so repeated preloads never collide
}

// Preload bulk-loads N finished payments with their idempotency records (stored responses) for
// the merchants' customer accounts, using COPY in chunks, so the idempotency path can be measured
// on a large table.
//
// Every payment is failed with failure_code declined: a failed payment has no ledger posting, no
// reservation and no balance change, so every invariant Verify checks still holds. Its record is
// completed (workflow started, no lease) with the request hash of the equivalent request and the
// response the API would have stored: 402 and the payment resource. Rows are generated lazily,
// so memory stays bounded by the chunk whatever N is. Each chunk's records and payments commit
// in one transaction (records first: payments reference them), so an interrupted preload leaves
// only whole pairs. Both tables are analyzed at the end.
func (s *Store) Preload(ctx context.Context, o PreloadOptions) (PreloadResult, error) {
	started := time.Now()
	res := PreloadResult{KeyPrefix: newPreloadPrefix()}
	if o.N <= 0 {
		return res, nil
	}
	if len(o.Merchants) == 0 {
		return res, errors.New("preload: no merchants")
	}
	chunk := o.Chunk
	if chunk <= 0 {
		chunk = DefaultPreloadChunk
	}
	payers := make([]preloadPayer, len(o.Merchants))
	for i, m := range o.Merchants {
		p := preloadPayer{merchant: m}
		err := s.pool.QueryRow(ctx, sqlPreloadPayer, m).Scan(&p.account, &p.currency)
		if errors.Is(err, pgx.ErrNoRows) {
			return res, fmt.Errorf("preload: merchant %s has no customer account: %w", m, payment.ErrNotFound)
		}
		if err != nil {
			return res, translate(err)
		}
		payers[i] = p
	}
	gen := &preloadGen{payers: payers, prefix: res.KeyPrefix}
	ids := make([]uuid.UUID, 0, min(chunk, o.N))
	for start := 0; start < o.N; start += chunk {
		end := min(start+chunk, o.N)
		ids = ids[:0]
		for range end - start {
			ids = append(ids, payment.NewID())
		}
		at := time.Now().UTC().Truncate(time.Microsecond) // the database's precision: rows and bodies agree
		err := s.tx(ctx, func(tx pgx.Tx) error {
			recs := gen.source(start, ids, at, false)
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"idempotency_records"}, preloadRecordColumns, recs); err != nil {
				return fmt.Errorf("copy idempotency_records: %w", err)
			}
			pays := gen.source(start, ids, at, true)
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"payments"}, preloadPaymentColumns, pays); err != nil {
				return fmt.Errorf("copy payments: %w", err)
			}
			return nil
		})
		if err != nil {
			res.Elapsed = time.Since(started)
			return res, fmt.Errorf("preload rows %d-%d: %w", start, end-1, err)
		}
		res.Rows = end
		if o.Progress != nil {
			o.Progress(end, o.N)
		}
	}
	err := s.Settle(ctx)
	res.Elapsed = time.Since(started)
	if err != nil {
		return res, fmt.Errorf("preload: %w", err)
	}
	return res, nil
}

// Settle does now what a bulk of writes leaves for later, so that it does not happen during
// whatever is measured next: autovacuum's pass over the new and dead rows (with the planner
// statistics), and the checkpoint of their WAL (which needs superuser or pg_checkpoint; without
// it the server checkpoints in its own time).
func (s *Store) Settle(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, `VACUUM (ANALYZE)`); err != nil {
		return fmt.Errorf("vacuum: %w", translate(err))
	}
	_, _ = s.pool.Exec(ctx, `CHECKPOINT`)
	return nil
}

const sqlPreloadPayer = `SELECT id, currency FROM accounts WHERE merchant_id = $1 AND kind = 'customer'
ORDER BY created_at, id LIMIT 1`

var (
	preloadRecordColumns = []string{"merchant_id", "idempotency_key", "request_hash", "status", "operation_id",
		"outcome", "response_body", "locked_until", "workflow_started", "created_at", "updated_at"}
	preloadPaymentColumns = []string{"id", "merchant_id", "idempotency_key", "account_id", "amount_minor", "currency",
		"invoice_id", "payment_type", "status", "failure_code", "provider_reference", "created_at", "updated_at"}
)

func newPreloadPrefix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return "preload-" + hex.EncodeToString(b) + "-"
}

type preloadPayer struct {
	merchant, account uuid.UUID
	currency          string
}

// preloadGen derives row i's payment from i alone (plus the chunk's ids), so the records and
// the payments of a chunk are generated twice, lazily, and agree.
type preloadGen struct {
	payers []preloadPayer
	prefix string
}

func (g *preloadGen) payment(i int, id uuid.UUID, at time.Time) payment.Payment {
	p := g.payers[i%len(g.payers)]
	n := strconv.Itoa(i)
	return payment.Payment{
		ID: id, MerchantID: p.merchant, IdempotencyKey: g.prefix + n, AccountID: p.account,
		AmountMinor: 100 + int64(i)*7919%1_000_000, Currency: p.currency,
		InvoiceID: "inv-" + g.prefix + n, PaymentType: payment.DefaultPaymentType,
		Status: payment.StatusFailed, FailureCode: payment.FailureDeclined,
		CreatedAt: at, UpdatedAt: at,
	}
}

func (g *preloadGen) source(start int, ids []uuid.UUID, at time.Time, payments bool) *preloadSource {
	src := &preloadSource{gen: g, start: start, ids: ids, at: at, payments: payments, pos: -1}
	src.enc = json.NewEncoder(&src.body)
	src.enc.SetEscapeHTML(false) // as the API renders it
	return src
}

// preloadSource is a pgx.CopyFromSource over one chunk. pgx encodes each row before asking for
// the next, so the row slice and the body buffer are reused.
type preloadSource struct {
	gen      *preloadGen
	start    int
	ids      []uuid.UUID
	at       time.Time
	payments bool
	pos      int
	row      []any
	body     bytes.Buffer
	enc      *json.Encoder
	err      error
}

func (s *preloadSource) Next() bool {
	s.pos++
	return s.err == nil && s.pos < len(s.ids)
}

func (s *preloadSource) Values() ([]any, error) {
	id := s.ids[s.pos]
	p := s.gen.payment(s.start+s.pos, id, s.at)
	if s.payments {
		s.row = append(s.row[:0], [16]byte(p.ID), [16]byte(p.MerchantID), p.IdempotencyKey, [16]byte(p.AccountID),
			p.AmountMinor, p.Currency, p.InvoiceID, p.PaymentType, string(p.Status), p.FailureCode, nil, p.CreatedAt, p.UpdatedAt)
		return s.row, nil
	}
	req := payment.Request{InvoiceID: p.InvoiceID, AmountMinor: p.AmountMinor, Currency: p.Currency,
		AccountID: p.AccountID, PaymentType: p.PaymentType}
	s.body.Reset()
	if err := s.enc.Encode(p.Resource()); err != nil {
		s.err = err
		return nil, err
	}
	s.row = append(s.row[:0], [16]byte(p.MerchantID), p.IdempotencyKey, req.Hash(), string(RecordCompleted), [16]byte(p.ID),
		string(payment.StatusFailed), s.body.Bytes(), nil, true, p.CreatedAt, p.UpdatedAt)
	return s.row, nil
}

func (s *preloadSource) Err() error { return s.err }

// TableSize is one table's footprint.
type TableSize struct {
	Table      string
	Rows       int64 // the planner's estimate (ANALYZE), else the statistics collector's live rows
	TableBytes int64 // pg_table_size: heap, TOAST, free space and visibility maps
	IndexBytes int64 // pg_indexes_size: every index of the table
}

const sqlSizes = `SELECT c.relname,
  CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint ELSE coalesce(st.n_live_tup, 0) END,
  pg_table_size(c.oid), pg_indexes_size(c.oid)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname <> 'goose_db_version'
ORDER BY pg_total_relation_size(c.oid) DESC, c.relname`

// Sizes reports table and index bytes of kasa's tables (largest first) with row estimates;
// it reads catalog statistics only, so it is cheap on any table size.
func (s *Store) Sizes(ctx context.Context) ([]TableSize, error) {
	rows, err := s.pool.Query(ctx, sqlSizes)
	if err != nil {
		return nil, translate(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TableSize, error) {
		var t TableSize
		err := r.Scan(&t.Table, &t.Rows, &t.TableBytes, &t.IndexBytes)
		return t, err
	})
	return out, translate(err)
}
