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
	case payment.StatusSucceeded, payment.StatusRequiresCapture:
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
func (s *Server) replayFirst(c *gin.Context, k opKind, rec store.Record) {
	status, body, err := s.storedResponse(c, k, rec)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.Header("Location", k.path()+rec.OperationID.String())
	c.Data(status, "application/json", body)
}

// replay answers a retry of a completed operation: the stored answer, marked as a replay.
func (s *Server) replay(c *gin.Context, k opKind, rec store.Record) {
	status, body, err := s.storedResponse(c, k, rec)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.Header("Idempotent-Replayed", "true")
	c.Header("Location", k.path()+rec.OperationID.String())
	c.Data(status, "application/json", body)
}

// storedResponse is a completed operation's stored answer. The transaction that finishes an
// operation stores it; a record completed before that was so gets it rendered and stored once.
func (s *Server) storedResponse(c *gin.Context, k opKind, rec store.Record) (int, []byte, error) {
	if rec.ResponseBody != nil {
		return answerStatus(rec.Outcome), rec.ResponseBody, nil
	}
	outcome, body, err := k.unsaved(c.Request.Context(), rec)
	return answerStatus(outcome), body, err
}
