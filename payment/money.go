package payment

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"golang.org/x/text/currency"
)

// Money is an exact amount in the currency's minor units (kuruş, cents, fils...).
type Money struct {
	Minor    int64
	Currency string // ISO 4217, upper case
}

// nonMonetary are ISO 4217 codes that name no spendable currency (metals, funds, testing).
var nonMonetary = map[string]bool{
	"XXX": true, "XTS": true, "XAU": true, "XAG": true, "XPT": true, "XPD": true, "XDR": true,
	"XBA": true, "XBB": true, "XBC": true, "XBD": true, "XSU": true, "XUA": true,
}

// ParseCurrency accepts an ISO 4217 code in any case and returns it upper-cased.
func ParseCurrency(code string) (string, error) {
	if len(code) != 3 {
		return "", ErrUnknownCurrency
	}
	up := strings.ToUpper(code)
	for _, r := range up {
		if r < 'A' || r > 'Z' {
			return "", ErrUnknownCurrency
		}
	}
	if nonMonetary[up] {
		return "", ErrUnknownCurrency
	}
	if _, err := currency.ParseISO(up); err != nil {
		return "", ErrUnknownCurrency
	}
	return up, nil
}

// Exponent is the number of minor-unit digits of an ISO 4217 currency (TRY 2, JPY 0, KWD 3).
func Exponent(code string) int {
	u, err := currency.ParseISO(code)
	if err != nil {
		return 2
	}
	scale, _ := currency.Standard.Rounding(u)
	return scale
}

// ParseAmount parses a positive decimal string ("1000", "1000.5", "1000.50") exactly into minor units.
// It never goes through float64: "0.1" is 10 kuruş, not 9.999.. kuruş.
func ParseAmount(s, code string) (int64, error) {
	exp := Exponent(code)
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" || (hasDot && frac == "") {
		return 0, ErrInvalidAmount
	}
	if !allDigits(intPart) || !allDigits(frac) {
		return 0, ErrInvalidAmount
	}
	// Trailing zeros carry no value: "1000.000" is a valid TRY amount.
	frac = strings.TrimRight(frac, "0")
	if len(frac) > exp {
		return 0, ErrTooManyDecimals
	}
	intPart = strings.TrimLeft(intPart, "0")
	if len(intPart)+exp > 18 {
		return 0, ErrAmountTooLarge
	}
	digits := intPart + frac + strings.Repeat("0", exp-len(frac))
	if digits == "" {
		return 0, ErrNonPositiveAmount
	}
	minor, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, ErrAmountTooLarge
	}
	if minor <= 0 {
		return 0, ErrNonPositiveAmount
	}
	return minor, nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// FormatAmount renders minor units as a decimal string with exactly the currency's exponent.
func FormatAmount(minor int64, code string) string {
	exp := Exponent(code)
	sign := ""
	u := uint64(minor)
	if minor < 0 {
		sign = "-"
		u = uint64(-minor)
		if minor == math.MinInt64 {
			u = uint64(math.MaxInt64) + 1
		}
	}
	s := strconv.FormatUint(u, 10)
	if exp == 0 {
		return sign + s
	}
	if len(s) <= exp {
		s = strings.Repeat("0", exp-len(s)+1) + s
	}
	return fmt.Sprintf("%s%s.%s", sign, s[:len(s)-exp], s[len(s)-exp:])
}

// String renders Money as "1000.00 TRY".
func (m Money) String() string { return FormatAmount(m.Minor, m.Currency) + " " + m.Currency }
