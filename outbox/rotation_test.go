package outbox

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// After a webhook secret rotation, webhooks carry the new secret's signature first and the old
// one's next, until the overlap ends; then only the new one's. A receiver holding either secret
// accepts them meanwhile.
func TestRotatedSecretSignsWithBothDuringTheOverlap(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t)
	hook := newHook(t, answer(200))
	m := newMerchant(t, hook.URL)
	startPipeline(t, b, pipelineOptions{relays: 1})

	_, err := db.RotateWebhookSecret(ctx, m.ID, "whsec_new", time.Hour)
	require.NoError(t, err)
	settle(t, m, false)
	require.Eventually(t, func() bool { return hook.Count() == 1 }, 10*time.Second, 10*time.Millisecond)
	r := hook.Requests()[0]
	ts, _, _ := strings.Cut(strings.TrimPrefix(r.Signature, "t="), ",")
	unix, err := strconv.ParseInt(ts, 10, 64)
	require.NoError(t, err)
	at := time.Unix(unix, 0)
	require.Equal(t, Sign("whsec_new", at, r.Body, m.WebhookSecret), r.Signature, "t=<t>,v1=<new>,v1=<old>")
	require.Equal(t, 2, strings.Count(r.Signature, "v1="))
	require.NoError(t, Verify("whsec_new", r.Signature, r.Body, time.Minute))
	require.NoError(t, Verify(m.WebhookSecret, r.Signature, r.Body, time.Minute))

	// Rotated again with the overlap over: only the newest secret signs.
	_, err = db.RotateWebhookSecret(ctx, m.ID, "whsec_newer", -time.Second)
	require.NoError(t, err)
	settle(t, m, false)
	require.Eventually(t, func() bool { return hook.Count() == 2 }, 10*time.Second, 10*time.Millisecond)
	r = hook.Requests()[1]
	require.Equal(t, 1, strings.Count(r.Signature, "v1="), r.Signature)
	require.NoError(t, Verify("whsec_newer", r.Signature, r.Body, time.Minute))
	require.ErrorIs(t, Verify("whsec_new", r.Signature, r.Body, time.Minute), ErrSignatureMismatch)
}

// A refund's events reach the merchant as payment events do, its data the refund resource.
func TestRefundEventsAreDelivered(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t)
	hook := newHook(t, answer(200))
	m := newMerchant(t, hook.URL)
	startPipeline(t, b, pipelineOptions{relays: 1})

	pid := settle(t, m, false)
	require.Eventually(t, func() bool { return hook.Count() == 1 }, 10*time.Second, 10*time.Millisecond)
	_, r, _, err := db.BeginRefund(ctx, store.BeginRefundInput{MerchantID: m.ID, PaymentID: pid, Key: "refund-1",
		Request: payment.RefundRequest{Amount: "0.40"}, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, db.HoldRefund(ctx, r.ID))
	r, err = db.PostRefund(ctx, r.ID, "rf_1")
	require.NoError(t, err)

	require.Eventually(t, func() bool { return hook.Count() == 2 }, 10*time.Second, 10*time.Millisecond)
	got := hook.Requests()[1]
	var body struct {
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(got.Body, &body))
	require.Equal(t, "refund.succeeded", body.Type)
	want, err := payment.JSON(r.Resource())
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(body.Data))
	require.NoError(t, Verify(m.WebhookSecret, got.Signature, got.Body, time.Minute))
}
