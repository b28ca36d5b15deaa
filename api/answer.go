package api

import (
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// answerStatus is the one mapping from a payment's outcome to the HTTP status of the request
// that created it (and of every replay of its key): 201 succeeded, 402 failed. A payment without
// a final outcome yet (processing, unknown) is answered 202 Accepted.
func answerStatus(s payment.Status) int {
	switch s {
	case payment.StatusSucceeded:
		return http.StatusCreated
	case payment.StatusFailed:
		return http.StatusPaymentRequired
	}
	return http.StatusAccepted
}

// announcedRecord is the completed record an outcome announced in this process stands for.
func announcedRecord(operationID uuid.UUID, a store.Answer) store.Record {
	return store.Record{OperationID: operationID, Status: store.RecordCompleted, Outcome: a.Outcome, ResponseBody: a.Body}
}

// replayFirst answers the first request of a completed operation with exactly what every later
// replay will get.
func (s *Server) replayFirst(c *gin.Context, rec store.Record) {
	status, body, err := s.storedResponse(c, rec)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.Header("Location", "/v1/payments/"+rec.OperationID.String())
	c.Data(status, "application/json", body)
}

// replay answers a retry of a completed operation: the stored answer, marked as a replay.
func (s *Server) replay(c *gin.Context, rec store.Record) {
	status, body, err := s.storedResponse(c, rec)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.Header("Idempotent-Replayed", "true")
	c.Header("Location", "/v1/payments/"+rec.OperationID.String())
	c.Data(status, "application/json", body)
}

// storedResponse is a completed operation's stored answer. The transaction that finishes a
// payment stores it; a record completed before that was so gets it rendered and stored here once.
func (s *Server) storedResponse(c *gin.Context, rec store.Record) (int, []byte, error) {
	if rec.ResponseBody != nil {
		return answerStatus(rec.Outcome), rec.ResponseBody, nil
	}
	ctx := c.Request.Context()
	p, err := s.Store.Payment(ctx, rec.OperationID)
	if err != nil {
		return 0, nil, err
	}
	body, err := p.AnswerBody() // fails unless the payment is final
	if err != nil {
		return 0, nil, err
	}
	outcome, body, err := s.Store.SaveResponse(ctx, rec.MerchantID, rec.Key, p.Status, body)
	return answerStatus(outcome), body, err
}

// writePending answers a request whose operation has no stored answer yet with the payment as
// it is now; non-final states carry Retry-After. It is 202 even when the payment became final
// since its record was read: the stored answer, not this one, is what replays return.
func (s *Server) writePending(c *gin.Context, p payment.Payment) {
	c.Header("Location", "/v1/payments/"+p.ID.String())
	if !p.Status.Final() {
		setRetryAfter(c)
	}
	writeJSON(c, http.StatusAccepted, p.Resource())
}
