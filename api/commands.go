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

// commandLease is how long an unanswered capture or cancel is its request's: a retry within it
// is told the key is in use, one after it sends the same command again.
func (s *Server) commandLease() time.Duration { return s.SyncWait + 5*time.Second }

// command implements POST /v1/payments/{id}/capture and /cancel (docs/api.md, "Authorize now,
// capture later"): the key rules of a payment's, in one key space for both commands, kept for
// good once answered. The payment's workflow decides: its update validator refuses what the
// payment cannot do now, before anything is written.
func (s *Server) command(kind payment.Command) gin.HandlerFunc {
	return func(c *gin.Context) {
		if !s.queryOK(c) {
			return
		}
		m := merchantOf(c)
		key, err := idempotencyKey(c)
		if err != nil {
			s.writeError(c, err)
			return
		}
		var body []byte
		if c.Request.ContentLength != 0 { // a cancel (or a capture of everything) may send none
			if body, err = readJSONBody(c); err != nil {
				s.writeError(c, err)
				return
			}
		}
		req, err := payment.ParseCommandRequest(kind, body)
		if err != nil {
			s.writeError(c, err)
			return
		}
		ctx := c.Request.Context()
		p, err := s.Store.Payment(ctx, uuidParam(c))
		if err == nil && p.MerchantID != m.ID {
			err = payment.ErrNotFound
		}
		if err != nil {
			s.writeError(c, err)
			return
		}
		amount, err := req.AmountMinor(p.Currency)
		if err != nil {
			s.writeError(c, err)
			return
		}
		cmd := store.Command{MerchantID: m.ID, Key: key, ID: payment.NewID(), PaymentID: p.ID, Kind: kind, RequestHash: req.Hash(p.ID), AmountMinor: amount}
		existing, err := s.Store.Command(ctx, m.ID, key)
		switch {
		case err == nil:
			s.commandAgain(c, existing, cmd.RequestHash, p)
			return
		case !errors.Is(err, payment.ErrNotFound):
			s.writeError(c, err)
			return
		}
		if err := s.refused(ctx, kind, p, amount); err != nil {
			s.writeError(c, err)
			return
		}
		work, cancel := s.whole(ctx) // a client that leaves must not lose the begin's answer
		cmd, began, err := s.Store.BeginCommand(work, cmd, s.commandLease())
		cancel()
		switch {
		case err != nil:
			s.writeError(c, err)
		case !began: // a concurrent request with the key won
			s.commandAgain(c, cmd, req.Hash(p.ID), p)
		default:
			s.runCommand(c, cmd, p)
		}
	}
}

// uuidParam is the path's id; a malformed one names nothing (uuid.Nil is never a payment).
func uuidParam(c *gin.Context) uuid.UUID {
	id, _ := uuid.Parse(c.Param("id"))
	return id
}

// refusal is what the payment's row already says about the command at now: the workflow's
// validator says it again for good, but most refusals need not reach it. A capture window that
// has ended refuses a capture even before the workflow has voided the authorization.
func refusal(kind payment.Command, p payment.Payment, amount int64, now time.Time) error {
	switch {
	case kind == payment.CommandCancel && p.Status != payment.StatusRequiresCapture:
		return payment.ErrNotCancelable
	case kind == payment.CommandCapture && (p.Status != payment.StatusRequiresCapture || !now.Before(p.CaptureBefore)):
		return payment.ErrNotCapturable
	case amount > p.Capturable():
		return &payment.CaptureExceedsError{Capturable: p.Capturable(), Currency: p.Currency}
	}
	return nil
}

// refused is refusal now by the database's clock, which stamped capture_before: this host's,
// minutes ahead of it, would refuse a capture the window still allows, and behind it would let
// through one the window no longer does. Only a capture of a waiting payment needs the time.
func (s *Server) refused(ctx context.Context, kind payment.Command, p payment.Payment, amount int64) error {
	var now time.Time
	if kind == payment.CommandCapture && p.Status == payment.StatusRequiresCapture {
		var err error
		if now, err = s.Store.Now(ctx); err != nil {
			return err
		}
	}
	err := refusal(kind, p, amount, now)
	var over *payment.CaptureExceedsError
	if errors.As(err, &over) {
		// The refusal names what the payment shows as capturable: nothing while a capture or
		// cancel is under way, not the authorized amount that command is taking.
		if err := s.markCaptureClosed(ctx, &p); err != nil {
			return err
		}
		over.Capturable = p.Capturable()
	}
	return err
}

// commandAgain answers a request whose key was seen before: the stored answer, 422 for another
// request, 409 while another request runs it, the answer a decided payment gives it, or else the
// command sent again (the same update).
func (s *Server) commandAgain(c *gin.Context, cmd store.Command, hash string, p payment.Payment) {
	ctx := c.Request.Context()
	switch {
	case cmd.RequestHash != hash:
		s.metrics.idempotency.WithLabelValues("reused").Inc()
		s.writeError(c, payment.ErrIdempotencyReused)
		return
	case cmd.Answered():
		s.metrics.idempotency.WithLabelValues("replayed").Inc()
		c.Header("Idempotent-Replayed", "true")
		c.Header("Location", s.payments.path()+cmd.PaymentID.String())
		c.Data(cmd.ResponseStatus, "application/json", cmd.ResponseBody)
		return
	}
	won, err := s.Store.LeaseCommand(ctx, cmd.MerchantID, cmd.Key, s.commandLease())
	if err != nil {
		s.writeError(c, err)
		return
	}
	if !won {
		s.metrics.idempotency.WithLabelValues("in_use").Inc()
		s.writeError(c, payment.ErrIdempotencyKeyInUse)
		return
	}
	if !p.Status.Final() {
		// Sent again under its id: the workflow answers for the command it took (the same
		// update), and refuses one it never took (another command is under way, or unknown).
		s.runCommand(c, cmd, p)
		return
	}
	s.answerCommand(c, cmd, p)
}

// runCommand sends the command to the payment's workflow, waits up to SyncWait for what it led
// to, and answers with the payment.
func (s *Server) runCommand(c *gin.Context, cmd store.Command, p payment.Payment) {
	ctx, cancel := s.syncWait(c.Request.Context())
	update := workflows.UpdateCapture
	if cmd.Kind == payment.CommandCancel {
		update = workflows.UpdateCancel
	}
	_, err := s.Workflows.Command(ctx, p.MerchantID, p.IdempotencyKey, update, workflows.Command{ID: cmd.ID, AmountMinor: cmd.AmountMinor})
	cancel()
	bg := context.WithoutCancel(c.Request.Context())
	var over *payment.CaptureExceedsError
	switch {
	case errors.As(err, &over), errors.Is(err, payment.ErrNotCapturable), errors.Is(err, payment.ErrNotCancelable):
		if over != nil {
			over.Currency = p.Currency
		}
		// A workflow that ended since the payment was read refuses every command, even the one
		// it took in an earlier run: the payment, final now, says whose it was.
		if now, rerr := s.Store.Payment(bg, p.ID); rerr == nil && now.Status.Final() {
			s.answerCommand(c, cmd, now)
			return
		}
		s.forgetRefused(bg, cmd)
		s.writeError(c, err)
		return
	case err != nil && !errors.Is(err, workflows.ErrStillRunning):
		if uerr := s.Store.UnleaseCommand(bg, cmd.MerchantID, cmd.Key); uerr != nil {
			s.log.Warn("unlease command", "key", cmd.Key, "error", uerr)
		}
		s.writeError(c, err)
		return
	}
	now, err := s.Store.Payment(bg, p.ID)
	if err != nil {
		s.writeError(c, err)
		return
	}
	s.answerCommand(c, cmd, now)
}

// answerCommand answers with the payment as the command left it, storing the answer once the
// command is decided: a capture 201 when the payment succeeded (402 when the bank took nothing
// and the authorization was let go), a cancel 200 when it was canceled; 202 while the bank's
// answer is awaited or unknown.
func (s *Server) answerCommand(c *gin.Context, cmd store.Command, p payment.Payment) {
	bg := context.WithoutCancel(c.Request.Context())
	// A command whose request failed may never have reached the workflow: a final payment is
	// its effect only when the workflow marked it as the command it took; another command, the
	// expiry or a settlement decided it otherwise.
	var other bool
	if p.Status.Final() {
		taken, err := s.Store.TakenCommand(bg, p.ID)
		if err != nil {
			s.writeError(c, err)
			return
		}
		other = taken != cmd.ID
	}
	status := http.StatusAccepted
	switch {
	case other:
		s.forgetRefused(bg, cmd)
		s.writeError(c, refusal(cmd.Kind, p, cmd.AmountMinor, time.Now()))
		return
	case cmd.Kind == payment.CommandCapture && p.Status == payment.StatusSucceeded:
		status = http.StatusCreated
	case cmd.Kind == payment.CommandCapture && p.Status == payment.StatusCanceled && p.FailureCode == payment.FailureDeclined:
		status = http.StatusPaymentRequired // this capture was sent, and the bank refused it
	case cmd.Kind == payment.CommandCancel && p.Status == payment.StatusCanceled && p.FailureCode == payment.FailureCanceled:
		status = http.StatusOK
	case p.Status.Final():
		// Taken, and the bank did otherwise (it captured the authorization this cancel was
		// voiding): the command reached the bank, so its key stays its own.
		s.writeError(c, refusal(cmd.Kind, p, cmd.AmountMinor, time.Now()))
		return
	}
	if err := s.markCaptureClosed(bg, &p); err != nil {
		s.writeError(c, err)
		return
	}
	body, err := payment.JSON(p.Resource())
	if err != nil {
		s.writeError(c, err)
		return
	}
	if status == http.StatusAccepted {
		err = s.Store.UnleaseCommand(bg, cmd.MerchantID, cmd.Key)
		setRetryAfter(c)
	} else {
		err = s.Store.AnswerCommand(bg, cmd.MerchantID, cmd.Key, status, body)
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.Header("Location", s.payments.path()+p.ID.String())
	c.Data(status, "application/json", body)
}

// forgetRefused deletes an unanswered command that changed nothing: its key is free again.
func (s *Server) forgetRefused(ctx context.Context, cmd store.Command) {
	if err := s.Store.DeleteCommand(ctx, cmd.MerchantID, cmd.Key); err != nil {
		s.log.Warn("forget refused command", "key", cmd.Key, "error", err)
	}
}
