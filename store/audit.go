package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// AuditEntry is one admin call: which admin token (by its id), what, when, and its answer.
type AuditEntry struct {
	ID        uuid.UUID `json:"id"`
	At        time.Time `json:"at"`
	TokenID   string    `json:"token_id"`
	Method    string    `json:"method"`
	Route     string    `json:"route"`
	Target    string    `json:"target"`
	Status    int       `json:"status"`
	RequestID string    `json:"request_id"`
}

// Audit appends e to the admin audit (its ID is minted here).
func (s *Store) Audit(ctx context.Context, e AuditEntry) error {
	_, err := s.pool.Exec(ctx, dbsqlc.InsertAudit, payment.NewID(), e.TokenID, e.Method, e.Route, e.Target, int32(e.Status), e.RequestID)
	return translate(err)
}

// AuditLog is a page of the admin audit, newest first: up to limit entries older than after
// (uuid.Nil: from the newest), and whether more follow.
func (s *Store) AuditLog(ctx context.Context, limit int, after uuid.UUID) ([]AuditEntry, bool, error) {
	if after == uuid.Nil {
		after = uuid.Max
	}
	rows, err := s.pool.Query(ctx, dbsqlc.ListAudit, after, limit+1)
	if err != nil {
		return nil, false, translate(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var a dbsqlc.AdminAudit
		err := r.Scan(columns(&a)...)
		return AuditEntry{ID: a.ID, At: a.At, TokenID: a.TokenID, Method: a.Method, Route: a.Route, Target: a.Target,
			Status: int(a.Status), RequestID: a.RequestID}, err
	})
	if err != nil {
		return nil, false, translate(err)
	}
	page, more := trimPage(out, limit)
	return page, more, nil
}
