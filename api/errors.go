package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// Transport-level errors; everything else comes from the domain.
var (
	errBodyTooLarge     = errors.New("request body exceeds 64 KiB")
	errUnsupportedMedia = errors.New("content type must be application/json")
	errRouteNotFound    = errors.New("no such route")
	errMethodNotAllowed = errors.New("method not allowed")
)

// retryAfter is what clients are told to wait before retrying, in seconds.
const retryAfter = 1

// problem is an RFC 9457 problem details body.
type problem struct {
	Type      string               `json:"type"`
	Title     string               `json:"title"`
	Status    int                  `json:"status"`
	Detail    string               `json:"detail"`
	Code      string               `json:"code"`
	Errors    []payment.FieldError `json:"errors,omitempty"`
	PaymentID string               `json:"payment_id,omitempty"`
	// Refundable is what a payment still has to refund, when a refund asked for more.
	Refundable string `json:"refundable,omitempty"`
	// Capturable is what an authorization holds, when a capture asked for more.
	Capturable string `json:"capturable,omitempty"`
	RequestID  string `json:"request_id,omitempty"`
}

// statusClientClosedRequest is what a request its client closed before the answer is recorded
// as (access metrics, admin audit), as nginx logs it: not an error of the server's.
const statusClientClosedRequest = 499

// writeError is the one place that maps an error to an HTTP answer. A 500 says nothing
// internal; its cause is logged once with the request id.
func (s *Server) writeError(c *gin.Context, err error) {
	if errors.Is(err, context.Canceled) && c.Request.Context().Err() != nil {
		// The client left (its context ended what the request was waiting on): no error of
		// kasa's, and no one to answer. What the request began goes on (Server.whole).
		s.log.Info("request stopped: the client left", "request_id", requestID(c), "route", c.FullPath(), "error", err)
		c.AbortWithStatus(statusClientClosedRequest)
		return
	}
	p := problem{Detail: err.Error()}
	var ve *payment.ValidationError
	var dup *payment.DuplicatePaymentError
	var fileErr *reconcile.FileError
	var limited *rateLimitedError
	var full *backlogFullError
	var exceeds *payment.RefundExceedsError
	var overCapture *payment.CaptureExceedsError
	var expired *payment.AnswerExpiredError
	switch {
	case errors.As(err, &fileErr):
		p.Status, p.Code, p.Title, p.Errors = 400, "invalid_settlement_file", "Invalid settlement file", fileErr.FieldErrors()
	case errors.As(err, &ve):
		p.Status, p.Code, p.Title, p.Errors = 400, "invalid_request", "Invalid request", ve.Fields
	case errors.As(err, &dup):
		p.Status, p.Code, p.Title, p.PaymentID = 409, "duplicate_payment", "Duplicate payment", dup.PaymentID
	case errors.Is(err, payment.ErrPaymentNotRefundable):
		p.Status, p.Code, p.Title = 409, "payment_not_refundable", "Payment not refundable"
	case errors.As(err, &exceeds):
		p.Status, p.Code, p.Title, p.Refundable = 409, "refund_exceeds_refundable", "Refund exceeds the refundable amount", exceeds.RefundableAmount()
	case errors.Is(err, payment.ErrNotCapturable):
		p.Status, p.Code, p.Title = 409, "payment_not_capturable", "Payment not capturable"
	case errors.Is(err, payment.ErrNotCancelable):
		p.Status, p.Code, p.Title = 409, "payment_not_cancelable", "Payment not cancelable"
	case errors.As(err, &overCapture):
		p.Status, p.Code, p.Title, p.Capturable = 409, "capture_exceeds_capturable", "Capture exceeds the capturable amount", overCapture.CapturableAmount()
	case errors.Is(err, payment.ErrKeyMissing):
		p.Status, p.Code, p.Title = 400, "idempotency_key_missing", "Idempotency-Key missing"
	case errors.Is(err, payment.ErrKeyInvalid):
		p.Status, p.Code, p.Title = 400, "idempotency_key_invalid", "Idempotency-Key invalid"
	case errors.Is(err, payment.ErrIdempotencyKeyInUse):
		p.Status, p.Code, p.Title = 409, "idempotency_key_in_use", "Request in progress"
		wait := retryAfter
		var queued *queuedInUseError
		if errors.As(err, &queued) {
			wait = queued.seconds
		}
		c.Header("Retry-After", strconv.Itoa(wait))
	case errors.As(err, &expired):
		p.Status, p.Code, p.Title = 409, "idempotency_answer_expired", "Idempotent answer expired"
	case errors.Is(err, payment.ErrIdempotencyReused):
		p.Status, p.Code, p.Title = 422, "idempotency_key_reused", "Idempotency-Key reused"
	case errors.Is(err, payment.ErrUnauthorized):
		p.Status, p.Code, p.Title = 401, "unauthorized", "Unauthorized"
		c.Header("WWW-Authenticate", `Bearer realm="kasa"`)
	case errors.Is(err, payment.ErrNotFound), errors.Is(err, errRouteNotFound):
		p.Status, p.Code, p.Title = 404, "not_found", "Not found"
	case errors.Is(err, errMethodNotAllowed):
		p.Status, p.Code, p.Title = 405, "method_not_allowed", "Method not allowed"
	case errors.Is(err, errBodyTooLarge):
		p.Status, p.Code, p.Title = 413, "body_too_large", "Request body too large"
	case errors.Is(err, errUnsupportedMedia):
		p.Status, p.Code, p.Title = 415, "unsupported_media_type", "Unsupported media type"
	case errors.As(err, &limited):
		p.Status, p.Code, p.Title = 429, "rate_limited", "Too many requests"
		c.Header("Retry-After", strconv.Itoa(limited.retryAfter()))
	case errors.As(err, &full):
		p.Status, p.Code, p.Title = 503, "unavailable", "Service unavailable"
		c.Header("Retry-After", strconv.Itoa(full.retryAfter()))
	case errors.Is(err, errOverloaded), errors.Is(err, errImportStopped):
		p.Status, p.Code, p.Title = 503, "unavailable", "Service unavailable"
		c.Header("Retry-After", strconv.Itoa(retryAfter))
	case errors.Is(err, payment.ErrUnavailable), errors.Is(err, store.ErrConflict), workflows.IsUnavailable(err),
		errors.Is(err, context.DeadlineExceeded): // the request's deadline: a dependency did not answer in time
		p.Status, p.Code, p.Title, p.Detail = 503, "unavailable", "Service unavailable", "a dependency is unavailable; retry with the same Idempotency-Key"
		c.Header("Retry-After", strconv.Itoa(retryAfter))
		s.log.Warn("dependency unavailable", "request_id", requestID(c), "error", err)
	default:
		p.Status, p.Code, p.Title, p.Detail = 500, "internal", "Internal error", "an internal error occurred; quote the request id when reporting it"
		s.log.Error("request failed", "request_id", requestID(c), "route", c.FullPath(), "error", err)
	}
	p.Type = "https://kasa.dev/problems/" + p.Code
	p.RequestID = requestID(c)
	c.Header("Content-Type", "application/problem+json")
	c.Abort()
	c.Render(p.Status, problemRender{p})
}

type problemRender struct{ p problem }

func (r problemRender) Render(w http.ResponseWriter) error {
	b, err := payment.JSON(r.p)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func (r problemRender) WriteContentType(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/problem+json")
}
