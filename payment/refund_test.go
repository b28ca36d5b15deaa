package payment

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func TestParseRefundRequestEquivalentHash(t *testing.T) {
	t.Parallel()
	pay := uuid.MustParse(acct)
	bodies := []string{
		`{"amount":"30.00","reason":"damaged"}`,
		`{"amount":30,"reason":"damaged"}`,
		`{"reason":"damaged","amount":"030.0"}`,
		` {"amount":30.00,"reason":"damaged"} `,
	}
	var first string
	for _, b := range bodies {
		r, err := ParseRefundRequest([]byte(b))
		require.NoError(t, err, b)
		minor, err := r.AmountMinor("TRY")
		require.NoError(t, err, b)
		require.Equal(t, int64(3000), minor, b)
		if first == "" {
			first = r.Hash(pay)
		}
		require.Equal(t, first, r.Hash(pay), b)
	}
	for _, other := range []string{`{"amount":"30.01","reason":"damaged"}`, `{"amount":"30"}`, `{"reason":"damaged"}`, `{"amount":"3","reason":"0damaged"}`} {
		r, err := ParseRefundRequest([]byte(other))
		require.NoError(t, err, other)
		require.NotEqual(t, first, r.Hash(pay), other)
	}
	r, err := ParseRefundRequest([]byte(bodies[0]))
	require.NoError(t, err)
	require.NotEqual(t, first, r.Hash(NewID()), "another payment's refund is another request")

	// No amount: all that is refundable, a request of its own.
	for _, b := range []string{`{}`, `{"amount":null}`, `{"reason":null}`} {
		r, err := ParseRefundRequest([]byte(b))
		require.NoError(t, err, b)
		minor, err := r.AmountMinor("TRY")
		require.NoError(t, err)
		require.Zero(t, minor, b)
		require.Empty(t, r.Reason)
	}
}

func TestParseRefundRequestInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, field string
	}{
		{"empty", ``, "body"},
		{"not an object", `"30"`, "body"},
		{"trailing", `{"amount":"1"}{}`, "body"},
		{"duplicate", `{"amount":"1","amount":"2"}`, "body"},
		{"unknown field", `{"amount":"1","currency":"TRY"}`, "currency"},
		{"case-folded name", `{"Amount":"1"}`, "Amount"},
		{"negative", `{"amount":"-5"}`, "amount"},
		{"zero", `{"amount":0}`, "amount"},
		{"zero string", `{"amount":"0.00"}`, "amount"},
		{"exponent", `{"amount":1e3}`, "amount"},
		{"bool amount", `{"amount":true}`, "amount"},
		{"comma", `{"amount":"1,5"}`, "amount"},
		{"no digits after dot", `{"amount":"5."}`, "amount"},
		{"20 digits", `{"amount":"12345678901234567890"}`, "amount"},
		{"reason not a string", `{"reason":5}`, "reason"},
		{"reason too long", `{"reason":"` + strings.Repeat("é", 201) + `"}`, "reason"},
		{"reason with a newline", `{"reason":"a\nb"}`, "reason"},
		{"reason with a NUL", `{"reason":"a\u0000b"}`, "reason"},
		{"reason not UTF-8", "{\"reason\":\"retourn\xe9\"}", "body"},
		// Half of a UTF-16 pair (a reason cut in the middle of an emoji) names no character.
		{"reason with a lone high surrogate", `{"reason":"retour \ud83d"}`, "body"},
		{"reason with a lone low surrogate", `{"reason":"\ude00 retour"}`, "body"},
		{"reason with a pair reversed", `{"reason":"\ude00\ud83d"}`, "body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRefundRequest([]byte(tt.body))
			var ve *ValidationError
			require.True(t, errors.As(err, &ve), "want a ValidationError, got %v", err)
			var fields []string
			for _, f := range ve.Fields {
				fields = append(fields, f.Field)
			}
			require.Contains(t, fields, tt.field)
		})
	}
	r, err := ParseRefundRequest([]byte(`{"reason":"` + strings.Repeat("é", 200) + `"}`))
	require.NoError(t, err, "200 characters are allowed, however many bytes")
	require.Len(t, []rune(r.Reason), 200)
	for body, want := range map[string]string{`{"reason":"\ud83d\ude00"}`: "😀", `{"reason":"a\\ud83d"}`: `a\ud83d`} {
		r, err := ParseRefundRequest([]byte(body))
		require.NoError(t, err, body)
		require.Equal(t, want, r.Reason, body)
	}
}

// The amount's digits are checked against the payment's currency, which the request does not name.
func TestRefundRequestAmountMinorByCurrency(t *testing.T) {
	t.Parallel()
	r, err := ParseRefundRequest([]byte(`{"amount":"1.5"}`))
	require.NoError(t, err)
	minor, err := r.AmountMinor("KWD")
	require.NoError(t, err)
	require.Equal(t, int64(1500), minor)
	_, err = r.AmountMinor("JPY")
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "amount", ve.Fields[0].Field)
	require.ErrorIs(t, err, ErrTooManyDecimals)

	// Zeros count, as in a payment's amount (docs/api.md).
	for _, tt := range []struct{ body, currency string }{{`{"amount":"30.000"}`, "TRY"}, {`{"amount":30.000}`, "TRY"}, {`{"amount":"5.0"}`, "JPY"}} {
		r, err := ParseRefundRequest([]byte(tt.body))
		require.NoError(t, err, tt.body)
		_, err = r.AmountMinor(tt.currency)
		require.ErrorIs(t, err, ErrTooManyDecimals, "%s in %s", tt.body, tt.currency)
	}
	r, err = ParseRefundRequest([]byte(`{"amount":"5.000"}`))
	require.NoError(t, err)
	minor, err = r.AmountMinor("KWD")
	require.NoError(t, err)
	require.Equal(t, int64(5000), minor, "as many digits as the currency has")
}

func TestRefundResource(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	r := Refund{
		ID: uuid.MustParse("0192f1f0-7d0c-7a39-9c5e-000000000001"), PaymentID: uuid.MustParse("0192f1f0-7d0c-7a39-9c5e-000000000002"),
		MerchantID: NewID(), AccountID: NewID(), IdempotencyKey: "k", AmountMinor: 3000, Currency: "TRY",
		Status: StatusProcessing, CreatedAt: at, UpdatedAt: at,
	}
	body, err := JSON(r.Resource())
	require.NoError(t, err)
	require.Equal(t, `{"id":"0192f1f0-7d0c-7a39-9c5e-000000000001","payment_id":"0192f1f0-7d0c-7a39-9c5e-000000000002",`+
		`"status":"processing","amount":"30.00","currency":"TRY","reason":null,"failure_code":null,"provider_reference":null,`+
		`"created_at":"2026-01-02T03:04:05.000006Z","updated_at":"2026-01-02T03:04:05.000006Z"}`+"\n", string(body))
	_, err = r.AnswerBody()
	require.Error(t, err, "only a final refund has a stored answer")

	r.Status, r.FailureCode, r.Reason = StatusFailed, FailureDeclined, "changed <mind>"
	body, err = r.AnswerBody()
	require.NoError(t, err)
	require.Contains(t, string(body), `"status":"failed"`)
	require.Contains(t, string(body), `"reason":"changed <mind>"`)
	require.Contains(t, string(body), `"failure_code":"declined"`)
}

func TestPaymentResourceAmountRefunded(t *testing.T) {
	t.Parallel()
	p := Payment{ID: NewID(), AmountMinor: 10000, AmountRefunded: 3000, Currency: "TRY", Status: StatusSucceeded}
	body, err := JSON(p.Resource())
	require.NoError(t, err)
	require.Contains(t, string(body), `"amount":"100.00","amount_refunded":"30.00","currency":"TRY"`)
	p.AmountRefunded = 0
	body, err = JSON(p.Resource())
	require.NoError(t, err)
	require.Contains(t, string(body), `"amount_refunded":"0.00"`)
}

func TestRefundExceedsError(t *testing.T) {
	t.Parallel()
	var err error = &RefundExceedsError{Refundable: 4000, Currency: "TRY"}
	var re *RefundExceedsError
	require.ErrorAs(t, err, &re)
	require.Equal(t, "40.00", re.RefundableAmount())
	require.Contains(t, err.Error(), "40.00 TRY")
	require.NotErrorIs(t, err, ErrPaymentNotRefundable)
}

func FuzzParseRefundRequest(f *testing.F) {
	f.Add([]byte(`{"amount":"30.00","reason":"damaged"}`))
	f.Add([]byte(`{"amount":1.5}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseRefundRequest(body)
		if err != nil {
			return
		}
		minor, err := r.AmountMinor("KWD")
		if err != nil || minor < 0 {
			return
		}
		// The canonical form parses back to the same request.
		again := `{"reason":` + string(must(JSON(r.Reason)))
		if minor > 0 {
			again += `,"amount":"` + FormatAmount(minor, "KWD") + `"`
		}
		r2, err := ParseRefundRequest([]byte(again + "}"))
		if err != nil {
			t.Fatalf("canonical form %s rejected: %v", again, err)
		}
		pay := NewID()
		if r2.Hash(pay) != r.Hash(pay) {
			t.Fatalf("equivalent refund requests hash differently: %s", again)
		}
	})
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b[:len(b)-1] // JSON's trailing newline
}
