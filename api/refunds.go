package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// refundListParams are the query parameters GET /v1/payments/{id}/refunds takes.
var refundListParams = []string{"limit", "starting_after"}

// createRefund implements POST /v1/payments/{id}/refunds with the answers of POST /v1/payments:
// the same key rules in the refund key space, and the refundability answers of the store.
func (s *Server) createRefund(c *gin.Context) {
	s.create(c, s.refunds, store.ScopeRefund, func(merchantID uuid.UUID, key string, body []byte) (creation, error) {
		req, err := payment.ParseRefundRequest(body)
		if err != nil {
			return creation{}, err
		}
		paymentID, err := uuid.Parse(c.Param("id"))
		if err != nil {
			return creation{}, payment.ErrNotFound
		}
		in := store.BeginRefundInput{MerchantID: merchantID, PaymentID: paymentID, Key: key, Request: req, Lease: s.Lease}
		return creation{hash: req.Hash(paymentID), begin: func(ctx context.Context, _ bool) (store.Record, op, store.Began, error) {
			in.OperationID = payment.NewID()
			rec, r, began, err := s.Store.BeginRefund(ctx, in)
			return rec, s.refunds.op(r), began, err
		}, seen: func(ctx context.Context, rec store.Record) error {
			// The payment (404) and the amount's digits (400) come before the key's answer.
			return s.Store.CheckRefundAgain(ctx, in, rec)
		}}, nil
	})
}

// getRefund is GET /v1/refunds/{id}; another merchant's refund does not exist for this one.
func (s *Server) getRefund(c *gin.Context) {
	if !s.queryOK(c) {
		return
	}
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		s.writeError(c, payment.ErrNotFound)
		return
	}
	r, err := s.Store.Refund(c.Request.Context(), id)
	if err == nil && r.MerchantID != merchantOf(c).ID {
		err = payment.ErrNotFound
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	writeJSON(c, http.StatusOK, r.Resource())
}

// listRefunds is GET /v1/payments/{id}/refunds: a page of the payment's refunds, newest first.
func (s *Server) listRefunds(c *gin.Context) {
	if !s.queryOK(c, refundListParams...) {
		return
	}
	ctx := c.Request.Context()
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		s.writeError(c, payment.ErrNotFound)
		return
	}
	p, err := s.Store.Payment(ctx, id)
	if err == nil && p.MerchantID != merchantOf(c).ID {
		err = payment.ErrNotFound
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	q := newListQuery(c)
	limit, after := q.limit(), q.startingAfter("refund of this payment")
	if err := q.err(); err != nil {
		s.writeError(c, err)
		return
	}
	rs, more, err := s.Store.PaymentRefunds(ctx, p.ID, limit, after)
	if err != nil {
		s.writeError(c, cursorError(err, "refund of this payment"))
		return
	}
	out := listPage[payment.RefundResource]{Data: make([]payment.RefundResource, 0, len(rs)), HasMore: more}
	for _, r := range rs {
		out.Data = append(out.Data, r.Resource())
	}
	writeJSON(c, http.StatusOK, out)
}

// refundOps is the refund kind of operation.
type refundOps struct{ s *Server }

func (refundOps) path() string { return "/v1/refunds/" }

func (k refundOps) record(ctx context.Context, merchantID uuid.UUID, key string) (store.Record, error) {
	return k.s.Store.RefundRecord(ctx, merchantID, key)
}

func (k refundOps) takeOver(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error) {
	return k.s.Store.TakeOverRefund(ctx, merchantID, key, lease)
}

func (k refundOps) current(ctx context.Context, id uuid.UUID) (any, payment.Status, error) {
	r, err := k.s.Store.Refund(ctx, id)
	return r.Resource(), r.Status, err
}

func (k refundOps) load(ctx context.Context, id uuid.UUID) (op, error) {
	r, err := k.s.Store.Refund(ctx, id)
	return k.op(r), err
}

// op is the refund's operation: its workflow, started with the server's charge policy.
func (k refundOps) op(r payment.Refund) op {
	return op{id: r.ID, merchantID: r.MerchantID, key: r.IdempotencyKey, start: func(ctx context.Context) (string, error) {
		return k.s.Workflows.StartRefund(ctx, r.IdempotencyKey, workflows.RefundInputFor(r))
	}}
}

func (k refundOps) await(ctx context.Context, o op, runID string) error {
	_, err := k.s.Workflows.AwaitRefund(ctx, o.merchantID, o.key, runID)
	return err
}

// unsaved renders a final refund's answer. The commit that completes a refund's record always
// stores its answer, so this is a record the store left without one: a final refund never
// changes, so rendering it gives the bytes the commit would have stored.
func (k refundOps) unsaved(ctx context.Context, rec store.Record) (payment.Status, []byte, error) {
	r, err := k.s.Store.Refund(ctx, rec.OperationID)
	if err != nil {
		return "", nil, err
	}
	body, err := r.AnswerBody()
	if err != nil {
		return "", nil, errors.Join(store.ErrInconsistent, err)
	}
	return r.Status, body, nil
}

func (refundOps) finished(time.Time) {}
