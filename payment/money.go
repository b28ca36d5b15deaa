package payment

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Money is an exact amount in the currency's minor units (kuruş, cents, fils...).
type Money struct {
	Minor    int64
	Currency string // ISO 4217, upper case
}

// currencyEntry is one code of ISO 4217 List One (currencies_gen.go, generated from
// iso4217/list-one.xml).
type currencyEntry struct {
	numeric int
	minor   int  // minor-unit digits; -1 where the list has none ("N.A.": metals, SDR, XXX, XTS...)
	fund    bool // a fund code (CLF, USN, BOV...): a unit of account, not money a payer holds
}

// ParseCurrency accepts an ISO 4217 code in any case and returns it upper-cased. Only the
// current currencies of List One are payment currencies: withdrawn codes (DEM, TRL), codes
// without minor units (XAU, XDR, XXX, XTS) and fund codes (CLF, USN) are refused.
func ParseCurrency(code string) (string, error) {
	if len(code) != 3 {
		return "", ErrUnknownCurrency
	}
	up := strings.ToUpper(code)
	e, ok := iso4217[up]
	if !ok || e.minor < 0 || e.fund {
		return "", ErrUnknownCurrency
	}
	return up, nil
}

// Exponent is the number of minor-unit digits of an ISO 4217 code as List One gives it
// (TRY 2, JPY 0, KWD 3, IQD 3, CLF 4). A code the list does not give digits for (withdrawn,
// XAU, DEM) gets 2, so that amounts already stored under such a code still format.
func Exponent(code string) int {
	if e, ok := iso4217[code]; ok && e.minor >= 0 {
		return e.minor
	}
	return 2
}

// ParsePaddedAmount is ParseAmount for an amount some other system wrote, a bank's settlement
// file: zeros past the currency's digits ("1500.00" JPY) say nothing more and are let through.
func ParsePaddedAmount(s, code string) (int64, error) {
	if whole, frac, ok := strings.Cut(s, "."); ok && len(frac) > Exponent(code) {
		if kept := strings.TrimRight(frac, "0"); len(kept) <= Exponent(code) {
			s = whole
			if kept != "" {
				s += "." + kept
			}
		}
	}
	return ParseAmount(s, code)
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
	// More digits than the minor unit is an error even when they are zeros ("1000.000" TRY):
	// the amount then says a precision the currency does not have (docs/api.md).
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
