package payment

import (
	"encoding/xml"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// listOneEntry is one currency of the committed ISO 4217 List One, read here without the
// generator so that a generator bug cannot hide behind its own output.
type listOneEntry struct {
	numeric int
	minor   string // "0".."4" or "N.A."
	fund    bool
}

func readListOne(t *testing.T) (published string, entries map[string]listOneEntry) {
	t.Helper()
	raw, err := os.ReadFile("iso4217/list-one.xml")
	require.NoError(t, err)
	var doc struct {
		Published string `xml:"Pblshd,attr"`
		Entries   []struct {
			Name struct {
				IsFund string `xml:"IsFund,attr"`
			} `xml:"CcyNm"`
			Code    string `xml:"Ccy"`
			Numeric string `xml:"CcyNbr"`
			Minor   string `xml:"CcyMnrUnts"`
		} `xml:"CcyTbl>CcyNtry"`
	}
	require.NoError(t, xml.Unmarshal(raw, &doc))
	entries = map[string]listOneEntry{}
	for _, e := range doc.Entries {
		if e.Code == "" { // "No universal currency" rows (Antarctica...)
			continue
		}
		n, err := strconv.Atoi(e.Numeric)
		require.NoError(t, err, e.Code)
		got := listOneEntry{numeric: n, minor: strings.TrimSpace(e.Minor), fund: e.Name.IsFund == "true"}
		if prev, ok := entries[e.Code]; ok {
			require.Equal(t, prev, got, "%s differs between its country rows", e.Code)
		}
		entries[e.Code] = got
	}
	require.Greater(t, len(entries), 150, "List One parsed to too few currencies")
	return doc.Published, entries
}

// TestCurrencyTableMatchesListOne checks every one of the 17,576 three-letter codes: a code is a
// payment currency exactly when List One has it with a minor unit and not as a fund, and its
// exponent is List One's minor unit.
func TestCurrencyTableMatchesListOne(t *testing.T) {
	t.Parallel()
	published, list := readListOne(t)
	require.Equal(t, published, ISO4217Published)
	accepted := 0
	for a := 'A'; a <= 'Z'; a++ {
		for b := 'A'; b <= 'Z'; b++ {
			for c := 'A'; c <= 'Z'; c++ {
				code := string([]rune{a, b, c})
				e, listed := list[code]
				got, err := ParseCurrency(strings.ToLower(code))
				if !listed || e.minor == "N.A." || e.fund {
					require.ErrorIs(t, err, ErrUnknownCurrency, "%s must be refused (listed %v, %+v)", code, listed, e)
					continue
				}
				require.NoError(t, err, "%s is an active ISO 4217 currency", code)
				require.Equal(t, code, got)
				accepted++
			}
		}
	}
	require.Len(t, iso4217, len(list), "the generated table has exactly List One's codes")
	for code, e := range list {
		want := currencyEntry{numeric: e.numeric, minor: -1, fund: e.fund}
		if e.minor != "N.A." {
			var err error
			want.minor, err = strconv.Atoi(e.minor)
			require.NoError(t, err, code)
			require.Equal(t, want.minor, Exponent(code), "minor units of %s", code)
		}
		require.Equal(t, want, iso4217[code], code)
	}
	require.Greater(t, accepted, 150)
}

func TestCurrencyExamples(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code     string
		exponent int
		accepted bool
	}{
		{"TRY", 2, true},
		{"JPY", 0, true},
		{"KWD", 3, true},
		{"IQD", 3, true},  // CLDR says 0
		{"IRR", 2, true},  // CLDR says 0
		{"COP", 2, true},  // CLDR says 0
		{"IDR", 2, true},  // CLDR says 0
		{"MRU", 2, true},  // unknown to CLDR's table in x/text
		{"VES", 2, true},  // unknown to CLDR's table in x/text
		{"UYW", 4, true},  // four minor digits, not a fund in List One
		{"CLF", 4, false}, // a fund: a unit of account, not money a payer holds
		{"USN", 2, false}, // fund
		{"BOV", 2, false}, // fund
		{"DEM", 2, false}, // withdrawn in 2002: List Three, not List One
		{"TRL", 2, false}, // withdrawn in 2005
		{"XXX", 2, false}, // no minor unit in List One
		{"XAU", 2, false},
		{"XDR", 2, false},
		{"XTS", 2, false},
	}
	for _, tt := range tests {
		_, err := ParseCurrency(tt.code)
		if tt.accepted {
			require.NoError(t, err, tt.code)
		} else {
			require.ErrorIs(t, err, ErrUnknownCurrency, tt.code)
		}
		require.Equal(t, tt.exponent, Exponent(tt.code), tt.code)
	}
}

// TestAmountRoundTripByExponent parses and formats amounts in currencies of 0 to 4 minor digits.
func TestAmountRoundTripByExponent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code, in, formatted string
		minor               int64
		err                 error
	}{
		{"JPY", "15", "15", 15, nil},
		{"JPY", "1.5", "", 0, ErrTooManyDecimals},
		{"TRY", "0.01", "0.01", 1, nil},
		{"IQD", "1.5", "1.500", 1500, nil},
		{"IQD", "0.001", "0.001", 1, nil},
		{"IQD", "1.0001", "", 0, ErrTooManyDecimals},
		{"IRR", "1.25", "1.25", 125, nil},
		{"UYW", "1.2345", "1.2345", 12345, nil},
		{"UYW", "0.0001", "0.0001", 1, nil},
		{"UYW", "7", "7.0000", 70000, nil},
		{"UYW", "1.23456", "", 0, ErrTooManyDecimals},
		{"UYW", "99999999999999.9999", "99999999999999.9999", 999999999999999999, nil},
		{"UYW", "100000000000000", "", 0, ErrAmountTooLarge},
	}
	for _, tt := range tests {
		got, err := ParseAmount(tt.in, tt.code)
		if tt.err != nil {
			require.ErrorIs(t, err, tt.err, "%s %s", tt.in, tt.code)
			continue
		}
		require.NoError(t, err, "%s %s", tt.in, tt.code)
		require.Equal(t, tt.minor, got, "%s %s", tt.in, tt.code)
		require.Equal(t, tt.formatted, FormatAmount(got, tt.code), "%s %s", tt.in, tt.code)
		back, err := ParseAmount(FormatAmount(got, tt.code), tt.code)
		require.NoError(t, err)
		require.Equal(t, got, back, "round trip %s %s", tt.in, tt.code)
	}
}
