package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// opKind is what the idempotent create path needs of one kind of operation. Payments and
// refunds share the path (answers, takeover, the wait for the outcome), each in its own key
// space and with its own workflow.
type opKind interface {
	// path is the resource's path prefix, "/v1/payments/".
	path() string
	record(ctx context.Context, merchantID uuid.UUID, key string) (store.Record, error)
	takeOver(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error)
	// current is the operation as it is now: its resource and status.
	current(ctx context.Context, id uuid.UUID) (any, payment.Status, error)
	// load is the operation of a record, ready to run (a takeover's).
	load(ctx context.Context, id uuid.UUID) (op, error)
	await(ctx context.Context, o op, runID string) error
	// unsaved is the answer of a completed record that has none stored.
	unsaved(ctx context.Context, rec store.Record) (payment.Status, []byte, error)
	// finished observes how long a new operation took to its answer.
	finished(since time.Time)
}

// op is one operation of a kind: what its workflow is started and awaited with.
type op struct {
	id, merchantID uuid.UUID
	key            string
	start          func(ctx context.Context) (runID string, err error)
	resource       func() any // as it was begun: what a queued payment's answer shows
}

// creation is one parsed create request of a kind: its canonical hash, and the store call that
// begins it (or finds the key's record); with queue, a new payment waits in the start backlog.
// queueable: the kind is admitted through the backlog (payments are; refunds always start).
// refusal, of a queueable kind, is what begin would refuse the request for without writing.
// seen, when set, is what begin checks of a request whose key has a record before answering it:
// a record found in memory is held to it too.
type creation struct {
	hash      string
	queueable bool
	begin     func(ctx context.Context, queue bool) (store.Record, op, store.Began, error)
	refusal   func(ctx context.Context) error
	seen      func(ctx context.Context, rec store.Record) error
}

// create is the idempotent create path every kind of operation shares: the key, the body, a
// replay from memory, the store's begin, then the answer of an existing record or the new
// operation's run. parse turns the body into the kind's creation.
func (s *Server) create(c *gin.Context, k opKind, scope store.Scope, parse func(merchantID uuid.UUID, key string, body []byte) (creation, error)) {
	if !s.queryOK(c) {
		return
	}
	m := merchantOf(c)
	key, err := idempotencyKey(c)
	if err != nil {
		s.writeError(c, err)
		return
	}
	body, err := readJSONBody(c)
	if err != nil {
		s.writeError(c, err)
		return
	}
	req, err := parse(m.ID, key, body)
	if err != nil {
		s.writeError(c, err)
		return
	}
	// Most repeated keys are retries of finished operations, answered from memory. Begin answers
	// the others in the same round trip that decides a new key's owner.
	ctx := c.Request.Context()
	if rec, ok := s.replays.get(m.ID, scope, key); ok {
		if req.seen != nil {
			if err := req.seen(ctx, rec); err != nil {
				s.writeError(c, err)
				return
			}
		}
		s.answerExisting(c, k, rec, req.hash)
		return
	}
	start := time.Now()
	running := !req.queueable || s.admission.take(m.ID)
	if req.queueable && running {
		defer s.admission.give(m.ID)
	}
	if req.queueable {
		if err := s.admission.admitFor(ctx, m.ID, running); err != nil {
			// Past the backlog's bound nothing new is written, but a key seen before still
			// gets its answer, and so does a request begin would refuse (another key's live
			// payment for the invoice): that answer is for good, where a 503 says come back.
			if rec, rerr := k.record(ctx, m.ID, key); rerr == nil {
				s.answerExisting(c, k, rec, req.hash)
				return
			}
			var invalid *payment.ValidationError
			var dup *payment.DuplicatePaymentError
			if rerr := req.refusal(ctx); errors.As(rerr, &invalid) || errors.As(rerr, &dup) {
				s.writeError(c, rerr)
				return
			}
			s.metrics.backlogRefused.Inc()
			s.writeError(c, err)
			return
		}
	}
	work, cancel := s.whole(ctx)
	defer cancel()
	rec, o, began, err := req.begin(work, !running)
	if err != nil {
		s.writeError(c, err)
		return
	}
	if began == store.BeganRaced {
		s.metrics.conflicts.WithLabelValues("idempotency_records_pkey").Inc()
	}
	if began != store.BeganNew {
		s.replays.put(rec)
		s.answerExisting(c, k, rec, req.hash)
		return
	}
	s.metrics.idempotency.WithLabelValues("new").Inc()
	if rec.Queued {
		s.metrics.idempotency.WithLabelValues("queued").Inc()
		s.admission.wasQueued()
		s.writeQueued(c, k, o)
		return
	}
	s.run(c, k, o, start)
}

// writeQueued answers a payment queued in the start backlog: 202, processing, with about how
// long the backlog ahead of it takes to start.
func (s *Server) writeQueued(c *gin.Context, k opKind, o op) {
	c.Header("Location", k.path()+o.id.String())
	c.Header("Retry-After", strconv.Itoa(s.admission.queuedRetryAfter(c.Request.Context())))
	writeJSON(c, http.StatusAccepted, o.resource())
}

// answerExisting answers a request whose key was seen before, without executing anything again.
func (s *Server) answerExisting(c *gin.Context, k opKind, rec store.Record, hash string) {
	ctx := c.Request.Context()
	if rec.RequestHash != hash {
		s.metrics.idempotency.WithLabelValues("reused").Inc()
		s.writeError(c, payment.ErrIdempotencyReused)
		return
	}
	switch rec.Status {
	case store.RecordCompleted:
		s.metrics.idempotency.WithLabelValues("replayed").Inc()
		s.replay(c, k, rec)
	case store.RecordUnknown:
		s.metrics.idempotency.WithLabelValues("unknown").Inc()
		s.writeCurrent(c, k, rec.MerchantID, rec.Key, rec.OperationID, true)
	default:
		// Processing. If its owner died before starting the workflow and the lease ran out,
		// exactly one retry takes the operation over and starts the (deduplicated) workflow.
		// A queued one is the drainer's to start, in its turn. Whether the lease ran out is the
		// database's to say, whose clock stamped it: this host's may be minutes off.
		if !rec.WorkflowStarted && !rec.Queued {
			won, err := k.takeOver(ctx, rec.MerchantID, rec.Key, s.Lease)
			if err != nil {
				s.writeError(c, err)
				return
			}
			if won {
				s.metrics.idempotency.WithLabelValues("taken_over").Inc()
				o, err := k.load(ctx, rec.OperationID)
				if err != nil {
					s.writeError(c, err)
					return
				}
				s.run(c, k, o, time.Now())
				return
			}
		}
		s.metrics.idempotency.WithLabelValues("in_use").Inc()
		if rec.Queued { // its retries come back when the backlog ahead of it may have drained
			s.writeError(c, &queuedInUseError{seconds: s.admission.queuedRetryAfter(ctx)})
			return
		}
		s.writeError(c, payment.ErrIdempotencyKeyInUse)
	}
}

// queuedInUseError is ErrIdempotencyKeyInUse for a payment queued in the start backlog, with
// its Retry-After.
type queuedInUseError struct{ seconds int }

func (e *queuedInUseError) Error() string { return payment.ErrIdempotencyKeyInUse.Error() }
func (e *queuedInUseError) Unwrap() error { return payment.ErrIdempotencyKeyInUse }

// run starts the operation's workflow and waits up to SyncWait for its outcome.
func (s *Server) run(c *gin.Context, k opKind, o op, start time.Time) {
	ctx := c.Request.Context()
	var announced <-chan store.Answer
	if s.Outcomes != nil {
		// Watched before the start: with eager start the operation may finish before it returns.
		done, stop := s.Outcomes.WatchOutcome(o.id)
		defer stop()
		announced = done
	}
	startCall := time.Now()
	work, cancel := s.whole(ctx)
	defer cancel()
	runID, err := o.start(work)
	if err != nil {
		// The start may or may not have happened. Either way the record stays, with its lease
		// expired, so the client's retry (or the sweeper) starts the same workflow: a second
		// start for the key is deduplicated by its workflow id.
		if xerr := s.Store.ExpireLease(context.WithoutCancel(ctx), o.id); xerr != nil {
			s.log.Warn("expire lease after failed start", "operation_id", o.id, "error", xerr)
		}
		s.writeError(c, fmt.Errorf("%w: start workflow: %v", payment.ErrUnavailable, err))
		return
	}
	s.metrics.startTime.Observe(time.Since(startCall).Seconds())
	// No write here to say the workflow started: its first step records that, and until then a
	// second start for the key (after the lease) is deduplicated anyway.
	// The database, not the workflow result, is the answer: it is what every replay returns.
	if a, ok := s.awaitOutcome(ctx, k, o, runID, announced); ok {
		k.finished(start)
		s.replayFirst(c, k, announcedRecord(o.id, a))
		return
	}
	rec, err := ownRecord(ctx, k, o.merchantID, o.key, o.id)
	switch {
	case errors.Is(err, payment.ErrNotFound): // completed and already expired: writeCurrent says so
	case err != nil:
		s.writeError(c, err)
		return
	case rec.Status == store.RecordCompleted:
		k.finished(start)
		s.replayFirst(c, k, rec)
		return
	}
	s.writeCurrent(c, k, o.merchantID, o.key, o.id, false)
}

// whole is ctx without its client's cancellation, for the work a client that leaves must not cut
// in two: a new operation's commit, whose answer lost would leave its record leased to no one
// until the lease ran out, and its workflow's start, whose answer lost would leave the run's
// first task to Temporal's task timeout. The record's lease bounds it, and so does the request's
// deadline (a second before the write timeout): a stalled database or Temporal is still answered 503.
func (s *Server) whole(ctx context.Context) (context.Context, context.CancelFunc) {
	end := time.Now().Add(s.Lease)
	if d, ok := ctx.Deadline(); ok && d.Before(end) {
		end = d
	}
	return context.WithDeadline(context.WithoutCancel(ctx), end)
}

// awaitOutcome waits up to SyncWait for the operation to leave processing. When the worker runs
// in this process, the store announces the committed outcome, with the stored answer when the
// commit completed the operation (then ok); else, or if nothing is announced within PollAfter
// (the workflow ran on a worker elsewhere, or ended without an outcome), it asks Temporal for
// the workflow's result. After PollAfter it also reads the record every 250ms: an unknown
// operation's workflow keeps waiting for reconciliation and never ends. Almost every operation
// finishes within that second and costs neither a call nor a poll.
func (s *Server) awaitOutcome(ctx context.Context, k opKind, o op, runID string, announced <-chan store.Answer) (answer store.Answer, ok bool) {
	ctx, cancel := s.syncWait(ctx)
	defer cancel()
	var done chan error
	await := func() {
		done = make(chan error, 1)
		go func() { done <- k.await(ctx, o, runID) }()
	}
	if announced == nil {
		await()
	}
	first := time.NewTimer(s.PollAfter)
	defer first.Stop()
	var tick <-chan time.Time // no polls before PollAfter
	for {
		select {
		case answer, ok = <-announced:
			return answer, ok
		case err := <-done:
			if err != nil && !errors.Is(err, workflows.ErrStillRunning) {
				s.log.Warn("awaiting workflow", "operation_id", o.id, "error", err)
			}
			return
		case <-first.C:
			if done == nil {
				await()
			}
			t := time.NewTicker(250 * time.Millisecond)
			defer t.Stop()
			tick = t.C
		case <-tick:
			if rec, err := k.record(ctx, o.merchantID, o.key); err == nil && rec.Status != store.RecordProcessing {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// syncWait is ctx for as long as a request waits for an outcome: SyncWait, ended early when the
// server starts shutting down, as a wait that ran out is.
func (s *Server) syncWait(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, s.SyncWait)
	stop := context.AfterFunc(s.life, cancel)
	return ctx, func() { stop(); cancel() }
}

// writeCurrent answers with the operation as it is now (writePending). An operation that became
// final since its record was read completed that record in the same commit: its stored answer
// goes out instead, as it will to every replay, never a 202 with a final resource; replayed says
// the request is a retry of the key, whose final answer is marked as a replay.
func (s *Server) writeCurrent(c *gin.Context, k opKind, merchantID uuid.UUID, key string, id uuid.UUID, replayed bool) {
	ctx := c.Request.Context()
	res, status, err := k.current(ctx, id)
	if err != nil {
		s.writeError(c, err)
		return
	}
	if status.Answered() {
		rec, err := ownRecord(ctx, k, merchantID, key, id)
		switch {
		case errors.Is(err, payment.ErrNotFound):
			// Retention deletes only completed records, and with a retention of seconds it can
			// do so before this first answer goes out: the answer is rendered from the
			// operation, as its commit stored it, never a 404.
			if replayed {
				c.Header("Idempotent-Replayed", "true")
			}
			c.Header("Location", k.path()+id.String())
			writeJSON(c, answerStatus(status), res)
			return
		case err != nil:
			s.writeError(c, err)
			return
		case rec.Status == store.RecordCompleted && replayed:
			s.replay(c, k, rec)
			return
		case rec.Status == store.RecordCompleted:
			s.replayFirst(c, k, rec)
			return
		}
	}
	writePending(c, k.path()+id.String(), res, status)
}

// ownRecord reads a key's record as operation id's: once retention deleted that operation's
// record, a later request may have made another under the key, whose answer is not id's.
func ownRecord(ctx context.Context, k opKind, merchantID uuid.UUID, key string, id uuid.UUID) (store.Record, error) {
	rec, err := k.record(ctx, merchantID, key)
	if err == nil && rec.OperationID != id {
		return store.Record{}, payment.ErrNotFound
	}
	return rec, err
}

// writePending answers a request whose operation has no stored answer yet with the operation as
// it is now; non-final states carry Retry-After.
func writePending(c *gin.Context, location string, resource any, status payment.Status) {
	c.Header("Location", location)
	if !status.Answered() {
		setRetryAfter(c)
	}
	writeJSON(c, http.StatusAccepted, resource)
}

// paymentOps is the payment kind of operation.
type paymentOps struct{ s *Server }

func (paymentOps) path() string { return "/v1/payments/" }

func (k paymentOps) record(ctx context.Context, merchantID uuid.UUID, key string) (store.Record, error) {
	return k.s.Store.Record(ctx, merchantID, key)
}

func (k paymentOps) takeOver(ctx context.Context, merchantID uuid.UUID, key string, lease time.Duration) (bool, error) {
	return k.s.Store.TakeOver(ctx, merchantID, key, lease)
}

func (k paymentOps) current(ctx context.Context, id uuid.UUID) (any, payment.Status, error) {
	p, err := k.s.Store.Payment(ctx, id)
	return p.Resource(), p.Status, err
}

func (k paymentOps) load(ctx context.Context, id uuid.UUID) (op, error) {
	p, err := k.s.Store.Payment(ctx, id)
	return k.op(p), err
}

// op is the payment's operation: its workflow, which asks its worker for the charge policy.
func (k paymentOps) op(p payment.Payment) op {
	return op{id: p.ID, merchantID: p.MerchantID, key: p.IdempotencyKey, resource: func() any { return p.Resource() }, start: func(ctx context.Context) (string, error) {
		return k.s.Workflows.StartPayment(ctx, p.IdempotencyKey, workflows.InputFor(p))
	}}
}

func (k paymentOps) await(ctx context.Context, o op, runID string) error {
	_, err := k.s.Workflows.AwaitPayment(ctx, o.merchantID, o.key, runID)
	return err
}

// unsaved renders a payment's answer and stores it once: records completed before answers were
// stored with the commit have none.
func (k paymentOps) unsaved(ctx context.Context, rec store.Record) (payment.Status, []byte, error) {
	p, err := k.s.Store.Payment(ctx, rec.OperationID)
	if err != nil {
		return "", nil, err
	}
	body, err := p.AnswerBody() // fails unless the payment is final
	if err != nil {
		return "", nil, err
	}
	return k.s.Store.SaveResponse(ctx, rec.MerchantID, rec.Key, p.Status, body)
}

func (k paymentOps) finished(since time.Time) {
	k.s.metrics.paymentTime.Observe(time.Since(since).Seconds())
}
