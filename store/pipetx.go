package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pipeTx is a transaction whose BEGIN travels with its first batch and whose COMMIT travels
// with its last: two dependent batches cost two round trips where pgx.BeginFunc needs four.
// A connection returned to the pool inside a transaction is closed by the pool, so a mistake
// here loses a connection, never leaves a transaction open.
type pipeTx struct {
	conn      *pgxpool.Conn
	begun     bool
	committed bool
	noCommit  bool  // nothing to commit: ending with a rollback is success
	broken    error // BEGIN failed (or never ran): nothing more may be sent
}

// pipelined runs fn in a pipeTx; fn must end with commit, or say there is nothing to commit.
// Any error rolls back.
func (s *Store) pipelined(ctx context.Context, fn func(*pipeTx) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return translate(err)
	}
	defer conn.Release()
	t := &pipeTx{conn: conn}
	err = fn(t)
	if err == nil && !t.committed && !t.noCommit {
		err = errors.New("pipelined transaction ended without commit")
	}
	if t.begun && !t.committed {
		// Bounded: on a dead connection the pool then closes it rather than wait for TCP.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, _ = conn.Exec(rctx, "ROLLBACK")
		cancel()
	}
	return translate(err)
}

// send sends b, opening the transaction first if it is not open yet. The results are b's.
func (t *pipeTx) send(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.broken != nil {
		return pgx.FailedBatchResults(b, t.broken)
	}
	if t.begun {
		return t.conn.SendBatch(ctx, b)
	}
	t.begun = true
	withBegin := &pgx.Batch{}
	withBegin.Queue("BEGIN")
	withBegin.QueuedQueries = append(withBegin.QueuedQueries, b.QueuedQueries...)
	br := t.conn.SendBatch(ctx, withBegin)
	// BEGIN's own result. If it failed, or never ran (pgx prepares a batch's new statements
	// first, and a statement that does not parse stops the batch before BEGIN is sent), the
	// batch's results fail too, and nothing later may run: it would run outside a transaction.
	if _, err := br.Exec(); err != nil {
		t.broken = err
	}
	return br
}

// nothingToCommit ends the transaction with a rollback, as a success: what it found needs no change.
func (t *pipeTx) nothingToCommit() { t.noCommit = true }

// QueryRow runs one query inside the open transaction.
func (t *pipeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.broken != nil {
		return failedRow{t.broken}
	}
	if !t.begun {
		return failedRow{errors.New("no transaction is open before the first batch")}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

type failedRow struct{ err error }

func (f failedRow) Scan(...any) error { return f.err }

// commit sends b with COMMIT after it: all of it commits, or none.
func (t *pipeTx) commit(ctx context.Context, b *pgx.Batch) error {
	n := len(b.QueuedQueries)
	return t.commitWith(ctx, b, func(br pgx.BatchResults) error {
		for range n {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		return nil
	})
}

// commitWith sends b with COMMIT after it; read takes b's own results, in order, before the
// COMMIT's is checked. All of it commits, or none.
func (t *pipeTx) commitWith(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	b.Queue("COMMIT")
	br := t.send(ctx, b)
	if t.broken != nil {
		br.Close()
		return t.broken
	}
	err := read(br)
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// COMMIT in a transaction an earlier error aborted answers ROLLBACK, without an error.
	if tag.String() != "COMMIT" {
		return fmt.Errorf("transaction rolled back at commit (%s)", tag)
	}
	t.committed = true
	return nil
}
