package payment

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseAmount(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, cur string
		want    int64
		err     error
	}{
		{"1000", "TRY", 100000, nil},
		{"1000.00", "TRY", 100000, nil},
		{"1000.5", "TRY", 100050, nil},
		{"0.01", "TRY", 1, nil},
		{"0.10", "TRY", 10, nil},
		{"1000.0", "TRY", 100000, nil},
		{"1000.000", "TRY", 0, ErrTooManyDecimals}, // more digits than the minor unit, zeros or not
		{"1000.0", "JPY", 0, ErrTooManyDecimals},
		{"0.001", "TRY", 0, ErrTooManyDecimals},
		{"1.5", "JPY", 0, ErrTooManyDecimals},
		{"15", "JPY", 15, nil},
		{"1.234", "KWD", 1234, nil},
		{"1.2345", "KWD", 0, ErrTooManyDecimals},
		{"0", "TRY", 0, ErrNonPositiveAmount},
		{"0.00", "TRY", 0, ErrNonPositiveAmount},
		{"12345678901234567890", "TRY", 0, ErrAmountTooLarge},
		{"1e3", "TRY", 0, ErrInvalidAmount},
		{"", "TRY", 0, ErrInvalidAmount},
		{".5", "TRY", 0, ErrInvalidAmount},
		{"5.", "TRY", 0, ErrInvalidAmount},
		{"1,5", "TRY", 0, ErrInvalidAmount},
		{" 5", "TRY", 0, ErrInvalidAmount},
		{"9999999999999999.99", "TRY", 999999999999999999, nil},
	}
	for _, tt := range tests {
		got, err := ParseAmount(tt.in, tt.cur)
		if tt.err != nil {
			require.ErrorIs(t, err, tt.err, "%q %s", tt.in, tt.cur)
			continue
		}
		require.NoError(t, err, "%q", tt.in)
		require.Equal(t, tt.want, got, "%q", tt.in)
		require.Equal(t, got, mustParse(t, FormatAmount(got, tt.cur), tt.cur), "round trip %q", tt.in)
	}
}

func mustParse(t *testing.T, s, cur string) int64 {
	v, err := ParseAmount(s, cur)
	require.NoError(t, err)
	return v
}

func TestFormatAmount(t *testing.T) {
	t.Parallel()
	require.Equal(t, "1000.00", FormatAmount(100000, "TRY"))
	require.Equal(t, "0.05", FormatAmount(5, "TRY"))
	require.Equal(t, "15", FormatAmount(15, "JPY"))
	require.Equal(t, "1.234", FormatAmount(1234, "KWD"))
	require.Equal(t, "-0.05", FormatAmount(-5, "TRY"))
}

func TestParseCurrency(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"try": "TRY", "Usd": "USD", "JPY": "JPY", "xof": "XOF"} {
		got, err := ParseCurrency(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"", "TR", "TRYY", "ABC", "XXX", "XAU", "1AB", "tr\x00"} {
		_, err := ParseCurrency(in)
		require.ErrorIs(t, err, ErrUnknownCurrency, in)
	}
}

const acct = "0192f1f0-7d0c-7a39-9c5e-8f6a8b0a1c2d"

func TestParseRequestEquivalentHash(t *testing.T) {
	t.Parallel()
	bodies := []string{
		`{"invoice_id":"45982","amount":"1000.00","currency":"TRY","account_id":"` + acct + `"}`,
		`{"invoice_id":45982,"amount":1000,"currency":"try","account_id":"` + acct + `","payment_type":"purchase"}`,
		`{"account_id":"` + acct + `","currency":"Try","amount":"1000","invoice_id":"45982"}`,
		` {"invoice_id":"45982","amount":1000.0,"currency":"TRY","account_id":"` + acct + `"} `,
	}
	var first string
	for _, b := range bodies {
		r, err := ParseRequest([]byte(b))
		require.NoError(t, err, b)
		require.Equal(t, int64(100000), r.AmountMinor)
		if first == "" {
			first = r.Hash()
		}
		require.Equal(t, first, r.Hash(), b)
	}
	other, err := ParseRequest([]byte(`{"invoice_id":"45982","amount":"1000.01","currency":"TRY","account_id":"` + acct + `"}`))
	require.NoError(t, err)
	require.NotEqual(t, first, other.Hash())
}

func TestParseRequestInvalid(t *testing.T) {
	t.Parallel()
	valid := func(kv string) string {
		return `{"invoice_id":"1","currency":"TRY","account_id":"` + acct + `",` + kv + `}`
	}
	tests := []struct {
		name, body, field string
	}{
		{"empty", ``, "body"},
		{"malformed", `{"invoice_id":`, "body"},
		{"array", `[1]`, "body"},
		{"trailing", valid(`"amount":"1"`) + `{}`, "body"},
		{"duplicate", valid(`"amount":"1","amount":"2"`), "body"},
		{"unknown field", valid(`"amount":"1","tip":"2"`), "tip"},
		{"negative", valid(`"amount":"-5"`), "amount"},
		{"negative number", valid(`"amount":-5`), "amount"},
		{"zero", valid(`"amount":0`), "amount"},
		{"too many decimals", valid(`"amount":"1.001"`), "amount"},
		{"20 digits", valid(`"amount":"12345678901234567890"`), "amount"},
		{"exponent", valid(`"amount":1e3`), "amount"},
		{"bool amount", valid(`"amount":true`), "amount"},
		{"missing amount", valid(`"payment_type":"purchase"`), "amount"},
		{"bad payment type", valid(`"amount":"1","payment_type":"Purchase!"`), "payment_type"},
		{"bad invoice", `{"invoice_id":"a b","amount":"1","currency":"TRY","account_id":"` + acct + `"}`, "invoice_id"},
		{"long invoice", `{"invoice_id":"` + strings.Repeat("a", 65) + `","amount":"1","currency":"TRY","account_id":"` + acct + `"}`, "invoice_id"},
		{"fractional invoice", `{"invoice_id":1.5,"amount":"1","currency":"TRY","account_id":"` + acct + `"}`, "invoice_id"},
		{"unknown currency", `{"invoice_id":"1","amount":"1","currency":"ABC","account_id":"` + acct + `"}`, "currency"},
		{"withdrawn currency", `{"invoice_id":"1","amount":"1","currency":"TRL","account_id":"` + acct + `"}`, "currency"},
		{"fund currency", `{"invoice_id":"1","amount":"1","currency":"CLF","account_id":"` + acct + `"}`, "currency"},
		{"no minor unit", `{"invoice_id":"1","amount":"1","currency":"XDR","account_id":"` + acct + `"}`, "currency"},
		{"IQD has 3 digits", `{"invoice_id":"1","amount":"1.0001","currency":"IQD","account_id":"` + acct + `"}`, "amount"},
		{"bad account", `{"invoice_id":"1","amount":"1","currency":"TRY","account_id":"x"}`, "account_id"},
		// The amount's own form is reported with a bad or missing currency: errors list every field.
		{"bad amount, unknown currency", `{"invoice_id":"1","amount":"x","currency":"ABC","account_id":"` + acct + `"}`, "amount"},
		{"negative amount, no currency", `{"invoice_id":"1","amount":"-1","account_id":"` + acct + `"}`, "amount"},
		{"zero amount, currency not a string", `{"invoice_id":"1","amount":0,"currency":1,"account_id":"` + acct + `"}`, "amount"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRequest([]byte(tt.body))
			var ve *ValidationError
			require.True(t, errors.As(err, &ve), "want a ValidationError, got %v", err)
			var fields []string
			for _, f := range ve.Fields {
				fields = append(fields, f.Field)
			}
			require.Contains(t, fields, tt.field)
		})
	}
}

func TestValidKey(t *testing.T) {
	t.Parallel()
	require.True(t, ValidKey("a"))
	require.True(t, ValidKey(strings.Repeat("k", 255)))
	require.False(t, ValidKey(""))
	require.False(t, ValidKey(strings.Repeat("k", 256)))
	require.False(t, ValidKey("has space"))
	require.False(t, ValidKey("tab\t"))
	require.False(t, ValidKey("ünicode"))
}

func TestStatusTransitions(t *testing.T) {
	t.Parallel()
	require.True(t, StatusProcessing.CanBecome(StatusUnknown))
	require.True(t, StatusUnknown.CanBecome(StatusSucceeded))
	require.False(t, StatusSucceeded.CanBecome(StatusFailed))
	require.False(t, StatusFailed.CanBecome(StatusSucceeded))
	require.False(t, StatusUnknown.CanBecome(StatusProcessing))
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"invoice_id":"45982","amount":"1000.00","currency":"TRY","account_id":"` + acct + `"}`))
	f.Add([]byte(`{"invoice_id":1,"amount":1.5,"currency":"kwd","account_id":"` + acct + `","payment_type":"x"}`))
	f.Add([]byte(`{"a":1,"a":2}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseRequest(body)
		if err != nil {
			return
		}
		if r.AmountMinor <= 0 {
			t.Fatalf("accepted non-positive amount %d", r.AmountMinor)
		}
		// Re-rendering the canonical form must parse back to the same hash.
		again, err := ParseRequest([]byte(`{"invoice_id":"` + r.InvoiceID + `","amount":"` + FormatAmount(r.AmountMinor, r.Currency) +
			`","currency":"` + strings.ToLower(r.Currency) + `","account_id":"` + r.AccountID.String() + `","payment_type":"` + r.PaymentType + `"}`))
		if err != nil {
			t.Fatalf("canonical form rejected: %v", err)
		}
		if again.Hash() != r.Hash() {
			t.Fatalf("equivalent requests hash differently")
		}
	})
}

func FuzzParseAmount(f *testing.F) {
	for _, s := range []string{"1", "1.00", "0.001", "99999999999999999", "1e5"} {
		f.Add(s, "TRY")
	}
	// One currency for each number of minor digits List One uses (0 to 4).
	for _, cur := range []string{"JPY", "KWD", "IQD", "UYW"} {
		f.Add("1.2345", cur)
		f.Add("99999999999999", cur)
	}
	f.Fuzz(func(t *testing.T, s, cur string) {
		c, err := ParseCurrency(cur)
		if err != nil {
			return
		}
		v, err := ParseAmount(s, c)
		if err != nil {
			return
		}
		back, err := ParseAmount(FormatAmount(v, c), c)
		if err != nil || back != v {
			t.Fatalf("round trip of %q: %d -> %q -> %d (%v)", s, v, FormatAmount(v, c), back, err)
		}
	})
}
