package tests

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// A manual payment captured in part, then refunded, under each capability, with the bank's
// answers to the capture and to a refund lost once: while the capture is at the bank or unknown
// nothing is refundable and no other command is taken; once captured, refunds give back at most
// what was captured less what was refunded and what refunds hold; and at every point the payment
// resource, the holds, the ledger and the replays agree with what the bank did.
func TestManualCaptureThenRefundsAnswersLost(t *testing.T) {
	for _, c := range workflows.Capabilities {
		t.Run(string(c), func(t *testing.T) {
			s := newStack(t, c)
			m := s.newMerchant()
			ctx := context.Background()
			paymentID, payer, _ := s.authorize(m, "auth-cr", "80.00", "100.00")

			// The capture's answer is slow: while it is at the bank the payment takes nothing else.
			s.setFaults(`{"rules":[{"on":"capture","action":"delay","delay_ms":3000,"count":1}]}`)
			if c != workflows.CapabilityIdempotent {
				// Without idempotency the slow answer is lost as well: kasa cannot send it again.
				s.setFaults(`{"rules":[{"on":"capture","action":"drop_response","count":1}]}`)
			}
			first := make(chan response, 1)
			go func() { first <- s.command(m, paymentID, "capture", "cap-cr", `{"amount":"30.00"}`) }()
			require.Eventually(t, func() bool {
				cmd, err := db.Command(ctx, mustUUID(t, m.ID), "cap-cr")
				return err == nil && !cmd.Answered()
			}, 5*time.Second, 5*time.Millisecond)
			if c == workflows.CapabilityIdempotent {
				r := s.refund(m, paymentID, "ref-early", `{"amount":"10.00"}`)
				requireProblem(t, r, http.StatusConflict, "payment_not_refundable")
				r = s.command(m, paymentID, "capture", "cap-other", `{"amount":"10.00"}`)
				requireProblem(t, r, http.StatusConflict, "payment_not_capturable")
				r = s.command(m, paymentID, "cancel", "cancel-other", "")
				requireProblem(t, r, http.StatusConflict, "payment_not_cancelable")
			}
			r := <-first
			if c == workflows.CapabilityNone {
				require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
				p := r.json(t)
				require.Equal(t, "unknown", p["status"])
				require.Equal(t, "0.00", p["amount_captured"])
				require.Equal(t, "0.00", p["capturable"])
				require.Equal(t, int64(8000), reserved(t, payer), "an unknown capture keeps the whole hold")
				r = s.refund(m, paymentID, "ref-early", `{"amount":"10.00"}`)
				requireProblem(t, r, http.StatusConflict, "payment_not_refundable")
				r = s.command(m, paymentID, "capture", "cap-other", `{"amount":"10.00"}`)
				requireProblem(t, r, http.StatusConflict, "payment_not_capturable")
				status, err := workflows.Starter{Client: tc}.Settle(ctx, workflows.PaymentWorkflowID(mustUUID(t, m.ID), "auth-cr"),
					workflows.Settlement{Outcome: workflows.OutcomeCharged, Note: "test"})
				require.NoError(t, err)
				require.Equal(t, "succeeded", status)
				r = s.command(m, paymentID, "capture", "cap-cr", `{"amount":"30.00"}`)
			}
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			captured := r
			p := r.json(t)
			require.Equal(t, "succeeded", p["status"])
			require.Equal(t, "30.00", p["amount_captured"])
			require.Equal(t, "0.00", p["capturable"])
			require.Equal(t, "0.00", p["amount_refunded"])
			require.Equal(t, int64(3000), s.held(paymentID).CapturedMinor, "captured once")
			require.Equal(t, int64(7000), balance(t, payer))
			require.Zero(t, reserved(t, payer))

			// Keys refused while the capture was at the bank were kept by nothing.
			r = s.command(m, paymentID, "capture", "cap-other", `{"amount":"10.00"}`)
			requireProblem(t, r, http.StatusConflict, "payment_not_capturable")
			r = s.refund(m, paymentID, "ref-over", `{"amount":"30.01"}`)
			requireProblem(t, r, http.StatusConflict, "refund_exceeds_refundable")
			require.Equal(t, "30.00", r.json(t)["refundable"])

			// A refund whose answer is lost: unknown without idempotency or inquiry, its amount held.
			s.setFaults(`{"rules":[{"on":"refund","action":"drop_response","count":1}]}`)
			r = s.refund(m, paymentID, "ref-early", `{"amount":"10.00"}`)
			lostID := r.json(t)["id"].(string)
			if c == workflows.CapabilityNone {
				require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
				require.Equal(t, "unknown", r.json(t)["status"])
				require.Equal(t, refundState{Held: 1000, Balance: 3000, Reserved: 1000, Refunds: 1, ActiveHolds: 1, Other: 1},
					readRefundState(t, env.DatabaseURL, paymentID))
				over := s.refund(m, paymentID, "ref-rest", `{"amount":"20.01"}`)
				requireProblem(t, over, http.StatusConflict, "refund_exceeds_refundable")
				require.Equal(t, "20.00", over.json(t)["refundable"], "an unknown refund's amount is not refundable again")
				status, err := workflows.Starter{Client: tc}.Settle(ctx, workflows.RefundWorkflowID(mustUUID(t, m.ID), "ref-early"),
					workflows.Settlement{Outcome: workflows.OutcomeCharged, Note: "test"})
				require.NoError(t, err)
				require.Equal(t, "succeeded", status)
				r = s.refund(m, paymentID, "ref-early", `{"amount":"10.00"}`)
			}
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			require.Equal(t, 1, s.simRefunds(lostID), "refunded once at the bank")
			early := r

			r = s.refund(m, paymentID, "ref-rest", `{}`)
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			require.Equal(t, "20.00", r.json(t)["amount"], "the rest of what was captured, not of what was authorized")
			r = s.refund(m, paymentID, "ref-more", `{"amount":"0.01"}`)
			requireProblem(t, r, http.StatusConflict, "refund_exceeds_refundable")
			require.Equal(t, "0.00", r.json(t)["refundable"])

			p = s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "").json(t)
			require.Equal(t, "succeeded", p["status"])
			require.Equal(t, "30.00", p["amount_captured"])
			require.Equal(t, "30.00", p["amount_refunded"])
			require.Equal(t, "0.00", p["capturable"])
			require.Equal(t, int64(10000), balance(t, payer), "what was captured came back, no more")
			require.Zero(t, reserved(t, payer))
			require.Equal(t, refundState{Refunded: 3000, Refunds: 2, Settled: 2, Postings: 2, Succeeded: 2},
				readRefundState(t, env.DatabaseURL, paymentID))

			// Replays repeat the first final answers byte for byte.
			again := s.command(m, paymentID, "capture", "cap-cr", `{"amount":"30"}`)
			require.Equal(t, http.StatusCreated, again.Status)
			require.Equal(t, string(captured.Body), string(again.Body))
			again = s.refund(m, paymentID, "ref-early", `{"amount":"10.00"}`)
			require.Equal(t, http.StatusCreated, again.Status)
			require.Equal(t, string(early.Body), string(again.Body))

			events := []string{"payment.requires_capture", "payment.captured"}
			if c == workflows.CapabilityNone {
				events = []string{"payment.requires_capture", "payment.unknown", "payment.captured"}
			}
			require.Equal(t, events, outboxOf(t, env.DatabaseURL, paymentID))
			require.Equal(t, int64(3000), s.held(paymentID).CapturedMinor, "never captured twice")
			requireVerified(t)
		})
	}
}

// stalledAuthorized is a worker's store whose first Authorized step commits and then stalls
// until release is closed: the payment reads requires_capture (its create is answered 201) while
// the workflow has not yet heard that its authorization was recorded, as when a worker dies or
// stalls right after the commit and its workflow task is run again.
type stalledAuthorized struct {
	activities.Store
	stalled atomic.Bool
	release chan struct{}
}

func (s *stalledAuthorized) Authorized(ctx context.Context, operationID uuid.UUID, providerRef string) (payment.Payment, error) {
	p, err := s.Store.Authorized(ctx, operationID, providerRef)
	if err == nil && s.stalled.CompareAndSwap(false, true) {
		select {
		case <-s.release:
		case <-ctx.Done():
		}
	}
	return p, err
}

// A capture or cancel sent once the payment reads requires_capture, while its workflow has not
// yet heard that the authorization was recorded, is not refused as if the payment could not take
// it: it is answered 503 (retry with the key), and carried out, once, when retried.
func TestManualCommandRightAfterTheAuthorizationIsRecorded(t *testing.T) {
	for _, c := range []struct {
		command, body, status string
		answer                int
		captured, balance     int64
	}{
		{"capture", `{"amount":"20.00"}`, "succeeded", http.StatusCreated, 2000, 8000},
		{"cancel", "", "canceled", http.StatusOK, 0, 10000},
	} {
		t.Run(c.command, func(t *testing.T) {
			steps := &stalledAuthorized{release: make(chan struct{})}
			s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc,
				steps: func(st activities.Store) activities.Store { steps.Store = st; return steps }})
			m := s.newMerchant()
			paymentID, payer, _ := s.authorize(m, "auth-stall", "50.00", "100.00")
			// The create is answered once the commit is seen, a moment before the step marks its stall.
			require.Eventually(t, steps.stalled.Load, 10*time.Second, 10*time.Millisecond,
				"the worker stalls after recording the authorization")

			// The workflow task the stall holds open is taken over (Temporal's heartbeat of a
			// long local activity, or another worker after a crash): the command reaches the run.
			first := make(chan response, 1)
			go func() { first <- s.command(m, paymentID, c.command, "stall", c.body) }()
			time.Sleep(10 * time.Second)
			close(steps.release)
			r := <-first
			require.NotEqual(t, http.StatusConflict, r.Status, "the payment reads requires_capture: %s", r.Body)
			require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
			require.NotEmpty(t, r.Header.Get("Retry-After"))
			require.Zero(t, s.held(paymentID).CapturedMinor)

			require.Eventually(t, func() bool {
				r = s.command(m, paymentID, c.command, "stall", c.body)
				return r.Status != http.StatusServiceUnavailable
			}, 30*time.Second, 200*time.Millisecond)
			require.Equal(t, c.answer, r.Status, "%s", r.Body)
			require.Equal(t, c.status, r.json(t)["status"])
			require.Equal(t, c.captured, s.held(paymentID).CapturedMinor, "the bank did it once")
			require.Equal(t, c.balance, balance(t, payer))
			require.Zero(t, reserved(t, payer))
			requireVerified(t)
		})
	}
}
