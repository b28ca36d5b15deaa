package outbox

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func TestSignMatchesTheContract(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"e1","type":"payment.succeeded"}`)
	at := time.Unix(1_700_000_000, 0)
	h := hmac.New(sha256.New, []byte("whsec_abc"))
	h.Write([]byte("1700000000." + string(body)))
	require.Equal(t, "t=1700000000,v1="+hex.EncodeToString(h.Sum(nil)), Sign("whsec_abc", at, body))
}

func TestVerify(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"e1","type":"payment.succeeded","data":{"amount":"10.00"}}`)
	now := time.Now()
	good := Sign("whsec_right", now, body)
	other := Sign("whsec_other", now, body)
	tests := []struct {
		name   string
		secret string
		header string
		body   []byte
		want   error
	}{
		{"valid", "whsec_right", good, body, nil},
		{"another secret", "whsec_wrong", good, body, ErrSignatureMismatch},
		{"tampered body", "whsec_right", good, []byte(`{"id":"e1","type":"payment.succeeded","data":{"amount":"99.00"}}`), ErrSignatureMismatch},
		{"old timestamp", "whsec_right", Sign("whsec_right", now.Add(-10*time.Minute), body), body, ErrSignatureExpired},
		{"future timestamp", "whsec_right", Sign("whsec_right", now.Add(10*time.Minute), body), body, ErrSignatureExpired},
		{"timestamp swapped in", "whsec_right", fmt.Sprintf("t=%d,%s", now.Unix()-1, good[len("t=1700000000,"):]), body, ErrSignatureMismatch},
		{"rotation: one of two v1 matches", "whsec_right", other + "," + good[len("t=1700000000,"):], body, nil},
		{"no v1", "whsec_right", fmt.Sprintf("t=%d", now.Unix()), body, ErrSignatureHeader},
		{"no t", "whsec_right", good[len("t=1700000000,"):], body, ErrSignatureHeader},
		{"not hex", "whsec_right", fmt.Sprintf("t=%d,v1=zz", now.Unix()), body, ErrSignatureHeader},
		{"garbage", "whsec_right", "nonsense", body, ErrSignatureHeader},
		{"empty", "whsec_right", "", body, ErrSignatureHeader},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Verify(tc.secret, tc.header, tc.body, 5*time.Minute)
			if tc.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.want)
			}
		})
	}
}

func TestBackoffGrowsWithJitterAndCap(t *testing.T) {
	t.Parallel()
	s := NewWebhookSender(WebhookSenderOptions{BackoffBase: time.Second, BackoffMax: time.Minute})
	for attempt, full := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 7: time.Minute, 60: time.Minute, 1000: time.Minute} {
		for range 50 {
			d := s.backoff(attempt)
			require.GreaterOrEqual(t, d, full/2, "attempt %d", attempt)
			require.LessOrEqual(t, d, full, "attempt %d", attempt)
		}
	}
	// 72 hours of retries at the default settings: many attempts, never a gap above an hour.
	d := NewWebhookSender(WebhookSenderOptions{})
	require.Equal(t, 72*time.Hour, d.o.RetryFor)
	var total time.Duration
	n := 0
	for total < 24*time.Hour {
		n++
		total += d.backoff(n)
	}
	require.Greater(t, n, 20)
}

func TestWebhookBody(t *testing.T) {
	t.Parallel()
	id, pid := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	// The outbox's jsonb reorders keys; the body has the API's field order again.
	data := `{"id": "` + pid.String() + `", "amount": "10.00", "status": "succeeded", "currency": "TRY", "account_id": "a",
"created_at": "2026-01-02T03:04:05.000006Z", "invoice_id": "inv-1", "updated_at": "2026-01-02T03:04:05.000007Z",
"failure_code": null, "payment_type": "purchase", "provider_reference": "ch_1"}`
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	body, err := WebhookBody(Event{ID: id, Type: "payment.succeeded", AggregateID: pid, CreatedAt: at, Data: json.RawMessage(data)})
	require.NoError(t, err)
	require.Equal(t, `{"id":"`+id.String()+`","type":"payment.succeeded","created_at":"2026-01-02T03:04:05.123456Z","data":{"id":"`+pid.String()+
		`","status":"succeeded","amount":"10.00","amount_refunded":"0.00","currency":"TRY","invoice_id":"inv-1","payment_type":"purchase","account_id":"a",`+
		`"failure_code":null,"provider_reference":"ch_1","created_at":"2026-01-02T03:04:05.000006Z","updated_at":"2026-01-02T03:04:05.000007Z"}}`, string(body))

	// A refund's data is a refund resource, in the API's order too.
	rid := uuid.Must(uuid.NewV7())
	data = `{"id": "` + rid.String() + `", "amount": "4.00", "reason": null, "status": "succeeded", "currency": "TRY", "payment_id": "` + pid.String() + `",
"created_at": "2026-01-02T03:04:05.000006Z", "updated_at": "2026-01-02T03:04:05.000007Z", "failure_code": null, "provider_reference": "rf_1"}`
	body, err = WebhookBody(Event{ID: id, Type: "refund.succeeded", AggregateID: rid, CreatedAt: at, Data: json.RawMessage(data)})
	require.NoError(t, err)
	require.Equal(t, `{"id":"`+id.String()+`","type":"refund.succeeded","created_at":"2026-01-02T03:04:05.123456Z","data":{"id":"`+rid.String()+
		`","payment_id":"`+pid.String()+`","status":"succeeded","amount":"4.00","currency":"TRY","reason":null,"failure_code":null,`+
		`"provider_reference":"rf_1","created_at":"2026-01-02T03:04:05.000006Z","updated_at":"2026-01-02T03:04:05.000007Z"}}`, string(body))

	// Anything else is passed on as it is, compacted.
	body, err = WebhookBody(Event{ID: id, Type: "payment.succeeded", CreatedAt: at, Data: json.RawMessage(`{"x": 1, "id": "p"}`)})
	require.NoError(t, err)
	require.Contains(t, string(body), `"data":{"x":1,"id":"p"}`)
	_, err = WebhookBody(Event{ID: id, Data: json.RawMessage(`{"x":`)})
	require.Error(t, err)
}

// While a secret is rotated both sign: the new one's v1 first; an empty previous is no v1.
func TestSignWithPreviousSecret(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"e1"}`)
	at := time.Unix(1_700_000_000, 0)
	one := strings.TrimPrefix(Sign("whsec_new", at, body), "t=1700000000,")
	two := strings.TrimPrefix(Sign("whsec_old", at, body), "t=1700000000,")
	require.Equal(t, "t=1700000000,"+one+","+two, Sign("whsec_new", at, body, "whsec_old"))
	require.Equal(t, "t=1700000000,"+one, Sign("whsec_new", at, body, ""))
}
