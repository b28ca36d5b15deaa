package reconcile

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

const (
	hdr      = "settlement_date,provider_charge_id,reference,amount,currency,status\n"
	hdrTyped = "settlement_date,provider_charge_id,reference,amount,currency,status,type\n"
	ref1     = "0192f1f0-7d0c-7a39-9c5e-8f6a8b0a1c01"
	ref2     = "0192f1f0-7d0c-7a39-9c5e-8f6a8b0a1c02"
	ref3     = "0192f1f0-7d0c-7a39-9c5e-8f6a8b0a1c03"
)

func TestParseValid(t *testing.T) {
	t.Parallel()
	in := "\xEF\xBB\xBF" + hdr +
		"2025-03-01,ch_1," + ref1 + ",1000.50,TRY,settled\r\n" +
		"2025-03-01,ch_2," + strings.ToUpper(ref2) + ",15,jpy,settled\n" +
		"\n" + // blank lines carry nothing
		`"2025-03-02","ch_3",` + ref3 + `,"1.234",KWD,settled` + "\n" +
		" \t\r\n" // nor does one of spaces, as a hand-edited file may end
	lines, err := Parse(strings.NewReader(in))
	require.NoError(t, err)
	require.Equal(t, []Line{
		{Number: 2, SettlementDate: "2025-03-01", ProviderChargeID: "ch_1", Reference: uuid.MustParse(ref1), AmountMinor: 100050, Currency: "TRY", Status: "settled", Type: TypeCharge},
		{Number: 3, SettlementDate: "2025-03-01", ProviderChargeID: "ch_2", Reference: uuid.MustParse(ref2), AmountMinor: 15, Currency: "JPY", Status: "settled", Type: TypeCharge},
		{Number: 5, SettlementDate: "2025-03-02", ProviderChargeID: "ch_3", Reference: uuid.MustParse(ref3), AmountMinor: 1234, Currency: "KWD", Status: "settled", Type: TypeCharge},
	}, lines)

	var buf bytes.Buffer
	require.NoError(t, Write(&buf, lines))
	again, err := Parse(&buf)
	require.NoError(t, err)
	for i := range again {
		again[i].Number = lines[i].Number
	}
	require.Equal(t, lines, again, "Write is Parse's inverse")
}

func TestParseTrailers(t *testing.T) {
	t.Parallel()
	in := hdr + "2025-03-01,ch_1," + ref1 + ",10.00,TRY,settled\n" +
		"2025-03-02,ch_2," + ref2 + ",10.00,TRY,settled\n" +
		"trailer,2025-03-01,1,2025-03-02T00:05:00Z,,\n" +
		"trailer,2025-03-02,1,2025-03-02T12:00:00.5+03:00\n" + // as many fields as the header, or four
		"trailer,2025-03-03,0,2025-03-04T00:00:00Z,,\n" // nothing settled that day
	f, err := ParseFile(strings.NewReader(in))
	require.NoError(t, err)
	require.Len(t, f.Lines, 2)
	require.Equal(t, []Trailer{
		{Number: 4, Day: "2025-03-01", Lines: 1, AsOf: time.Date(2025, 3, 2, 0, 5, 0, 0, time.UTC)},
		{Number: 5, Day: "2025-03-02", Lines: 1, AsOf: time.Date(2025, 3, 2, 9, 0, 0, 5e8, time.UTC)},
		{Number: 6, Day: "2025-03-03", Lines: 0, AsOf: time.Date(2025, 3, 4, 0, 0, 0, 0, time.UTC)},
	}, f.Trailers)

	var buf bytes.Buffer
	require.NoError(t, Write(&buf, f.Lines, f.Trailers...))
	again, err := ParseFile(&buf)
	require.NoError(t, err)
	require.Equal(t, f, again, "Write is ParseFile's inverse")

	f, err = ParseFile(strings.NewReader(hdr + "2025-03-01,ch_1," + ref1 + ",10.00,TRY,settled\n"))
	require.NoError(t, err)
	require.Empty(t, f.Trailers, "a file without a trailer parses: it lists charges, and proves nothing complete")
}

// The seventh column says what each line is; the trailer counts lines of both types.
func TestParseTyped(t *testing.T) {
	t.Parallel()
	in := hdrTyped +
		"2025-03-01,ch_1," + ref1 + ",10.00,TRY,settled,charge\n" +
		"2025-03-01,rf_1," + ref2 + ",2.50,TRY,settled,refund\n" +
		"2025-03-01,rf_2," + ref3 + ",7.50,TRY,settled,refund\n" +
		"trailer,2025-03-01,3,2025-03-02T00:00:00Z,,,\n"
	f, err := ParseFile(strings.NewReader(in))
	require.NoError(t, err)
	require.Equal(t, []Line{
		{Number: 2, SettlementDate: "2025-03-01", ProviderChargeID: "ch_1", Reference: uuid.MustParse(ref1), AmountMinor: 1000, Currency: "TRY", Status: "settled", Type: TypeCharge},
		{Number: 3, SettlementDate: "2025-03-01", ProviderChargeID: "rf_1", Reference: uuid.MustParse(ref2), AmountMinor: 250, Currency: "TRY", Status: "settled", Type: TypeRefund},
		{Number: 4, SettlementDate: "2025-03-01", ProviderChargeID: "rf_2", Reference: uuid.MustParse(ref3), AmountMinor: 750, Currency: "TRY", Status: "settled", Type: TypeRefund},
	}, f.Lines)
	require.Equal(t, 3, f.Trailers[0].Lines)

	var buf bytes.Buffer
	require.NoError(t, Write(&buf, f.Lines, f.Trailers...))
	require.True(t, strings.HasPrefix(buf.String(), hdrTyped), "refund lines are written with the type column: %s", buf.String())
	again, err := ParseFile(&buf)
	require.NoError(t, err)
	require.Equal(t, f, again, "Write is ParseFile's inverse")

	require.True(t, f.Typed)

	// A typed file of charges only has the untyped one's lines, but it speaks for refunds too
	// (it lists none), and keeps its type column when written back.
	typed, err := ParseFile(strings.NewReader(hdrTyped + "2025-03-01,ch_1," + ref1 + ",10.00,TRY,settled,charge\n"))
	require.NoError(t, err)
	plain, err := ParseFile(strings.NewReader(hdr + "2025-03-01,ch_1," + ref1 + ",10.00,TRY,settled\n"))
	require.NoError(t, err)
	require.Equal(t, plain.Lines, typed.Lines)
	require.True(t, typed.Typed)
	require.False(t, plain.Typed, "the six-column form lists charges only")
	buf.Reset()
	require.NoError(t, Write(&buf, typed.Lines))
	require.True(t, strings.HasPrefix(buf.String(), hdr), "charges alone are written in the six-column form")
	buf.Reset()
	require.NoError(t, WriteFile(&buf, typed))
	require.True(t, strings.HasPrefix(buf.String(), hdrTyped), "unless the file is typed")
	again, err = ParseFile(&buf)
	require.NoError(t, err)
	require.Equal(t, typed, again)
}

// A file may declare its own scope in one row: the merchants it covers and its line types.
func TestParseScope(t *testing.T) {
	t.Parallel()
	f, err := ParseFile(strings.NewReader(hdrTyped + "scope,all,charge refund,,,,\n" + "2025-03-01,rf_1," + ref1 + ",1.00,TRY,settled,refund\n"))
	require.NoError(t, err)
	require.Equal(t, &Scope{Number: 2, AllMerchants: true, Charges: true, Refunds: true}, f.Scope)

	f, err = ParseFile(strings.NewReader(hdr + "2025-03-01,ch_1," + ref1 + ",10.00,TRY,settled\nscope," + ref1 + " " + ref2 + ",charge\n"))
	require.NoError(t, err)
	require.Equal(t, &Scope{Number: 3, Merchants: []uuid.UUID{uuid.MustParse(ref1), uuid.MustParse(ref2)}, Charges: true}, f.Scope,
		"anywhere in the file, padded or not")
	var buf bytes.Buffer
	require.NoError(t, WriteFile(&buf, f))
	require.Equal(t, hdr+"scope,"+ref1+" "+ref2+",charge,,,\n"+"2025-03-01,ch_1,"+ref1+",10.00,TRY,settled\n", buf.String(),
		"written right after the header")

	f, err = ParseFile(strings.NewReader(hdrTyped + "scope,all,refund,,,,\n"))
	require.NoError(t, err)
	require.Equal(t, &Scope{Number: 2, AllMerchants: true, Refunds: true}, f.Scope)

	f, err = ParseFile(strings.NewReader(hdrTyped))
	require.NoError(t, err)
	require.Nil(t, f.Scope, "no scope row: the import declares it, if anyone does")
}

// A reference the bank lists twice is its statement: the file parses with both lines.
func TestParseKeepsAReferenceListedTwice(t *testing.T) {
	t.Parallel()
	f, err := ParseFile(strings.NewReader(hdr + "2025-03-01,ch_1," + ref1 + ",10.00,TRY,settled\n" + "2025-03-01,ch_2," + ref1 + ",10.00,TRY,settled\n" +
		"trailer,2025-03-01,2,2025-03-02T00:00:00Z\n"))
	require.NoError(t, err)
	require.Len(t, f.Lines, 2)
	require.Equal(t, f.Lines[0].Reference, f.Lines[1].Reference)
}

func TestParseHeaderOnly(t *testing.T) {
	t.Parallel()
	lines, err := Parse(strings.NewReader(hdr))
	require.NoError(t, err)
	require.Empty(t, lines)
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	ok := func(ref string) string { return "2025-03-01,ch_1," + ref + ",10.00,TRY,settled\n" }
	tests := []struct {
		name string
		in   string
		want []string // every error, in order
	}{
		{"empty", "", []string{"line 1: header: missing"}},
		{"no header", ok(ref1), []string{"line 1: header: want exactly settlement_date,"}},
		{"header renamed", strings.Replace(hdr, "amount", "amount_major", 1) + ok(ref1), []string{"line 1: header: want exactly"}},
		{"header reordered", "provider_charge_id,settlement_date,reference,amount,currency,status\n", []string{"line 1: header:"}},
		{"header with spaces", "settlement_date, provider_charge_id,reference,amount,currency,status\n", []string{"line 1: header:"}},
		{"bad date", hdr + "2025-3-01,ch_1," + ref1 + ",10.00,TRY,settled\n", []string{"line 2: settlement_date: must be a date YYYY-MM-DD"}},
		{"impossible date", hdr + "2025-02-30,ch_1," + ref1 + ",10.00,TRY,settled\n", []string{"line 2: settlement_date:"}},
		{"empty charge id", hdr + "2025-03-01,," + ref1 + ",10.00,TRY,settled\n", []string{"line 2: provider_charge_id: is required"}},
		{"charge id with space", hdr + "2025-03-01,ch 1," + ref1 + ",10.00,TRY,settled\n", []string{"line 2: provider_charge_id: must be printable"}},
		{"charge id too long", hdr + "2025-03-01," + strings.Repeat("c", 256) + "," + ref1 + ",10.00,TRY,settled\n", []string{"line 2: provider_charge_id: longer than 255"}},
		{"reference not a uuid", hdr + "2025-03-01,ch_1,inv-45982,10.00,TRY,settled\n", []string{"line 2: reference: must be an operation id"}},
		{"reference without dashes", hdr + "2025-03-01,ch_1," + strings.ReplaceAll(ref1, "-", "") + ",10.00,TRY,settled\n", []string{"line 2: reference:"}},
		{"too many decimals", hdr + ok(ref1) + ok(ref2) + "2025-03-01,ch_3," + ref3 + ",10.001,TRY,settled\n",
			[]string{`line 4: amount: "10.001": amount has more fraction digits than the currency allows`}},
		{"decimals for JPY", hdr + "2025-03-01,ch_1," + ref1 + ",10.5,JPY,settled\n", []string{"line 2: amount:"}},
		{"float notation", hdr + "2025-03-01,ch_1," + ref1 + ",1e3,TRY,settled\n", []string{`line 2: amount: "1e3": amount must be a decimal number`}},
		{"negative", hdr + "2025-03-01,ch_1," + ref1 + ",-10.00,TRY,settled\n", []string{"line 2: amount:"}},
		{"zero", hdr + "2025-03-01,ch_1," + ref1 + ",0.00,TRY,settled\n", []string{"line 2: amount:"}},
		{"thousands separator", hdr + "2025-03-01,ch_1," + ref1 + ",\"1,000.00\",TRY,settled\n", []string{"line 2: amount:"}},
		{"unknown currency", hdr + "2025-03-01,ch_1," + ref1 + ",10.00,ABC,settled\n", []string{"line 2: currency: currency is not a known ISO 4217 code"}},
		{"status", hdr + "2025-03-01,ch_1," + ref1 + ",10.00,TRY,refunded\n", []string{`line 2: status: want "settled", got "refunded"`}},
		{"too few fields", hdr + "2025-03-01,ch_1," + ref1 + ",10.00,TRY\n", []string{"line 2: want 6 fields, got 5"}},
		{"too many fields", hdr + ok(ref1) + "2025-03-01,ch_2," + ref2 + ",10.00,TRY,settled,x\n", []string{"line 3: want 6 fields, got 7"}},
		{"stray quote", hdr + ok(ref1) + "2025-03-01,ch\"2," + ref2 + ",10.00,TRY,settled\n", []string{"line 3: malformed CSV"}},
		{"trailer too short", hdr + ok(ref1) + "trailer,2025-03-01,1\n", []string{"line 3: trailer: want trailer,<YYYY-MM-DD>,<number of lines>,<as_of RFC 3339>"}},
		{"trailer with more", hdr + ok(ref1) + "trailer,2025-03-01,1,2025-03-02T00:00:00Z,x,\n", []string{"line 3: trailer: want"}},
		{"trailer fields", hdr + "trailer,2025-3-1,-1,yesterday\n",
			[]string{"line 2: trailer: day:", `line 2: trailer: lines: "-1"`, `line 2: trailer: as_of: "yesterday"`}},
		{"trailer before its day", hdr + ok(ref1) + "trailer,2025-03-01,1,2025-02-28T23:59:59Z\n", []string{"line 3: trailer: as_of: 2025-02-28T23:59:59Z is before 2025-03-01"}},
		{"trailer counts more lines: cut short", hdr + ok(ref1) + "trailer,2025-03-01,2,2025-03-02T00:00:00Z,,\n",
			[]string{"line 3: trailer: declares 2 line(s) for 2025-03-01, the file has 1: it is incomplete or damaged"}},
		{"trailer counts fewer lines", hdr + ok(ref1) + ok(ref2) + "trailer,2025-03-01,1,2025-03-02T00:00:00Z,,\n", []string{"line 4: trailer: declares 1 line(s)"}},
		{"trailer for another day", hdr + ok(ref1) + "trailer,2025-03-02,0,2025-03-03T00:00:00Z,,\n",
			[]string{"line 2: settlement_date: 2025-03-01 has no trailer, but the file has trailers for other days"}},
		{"two trailers for a day", hdr + "trailer,2025-03-01,0,2025-03-02T00:00:00Z\ntrailer,2025-03-01,0,2025-03-02T00:00:00Z\n",
			[]string{"line 3: trailer: a second trailer for 2025-03-01 (the first is on line 2)"}},
		{"trailer instead of the header", "trailer,2025-03-01,0,2025-03-02T00:00:00Z\n", []string{"line 1: want 6 or 7 fields, got 4"}},
		{"typed header renamed", strings.Replace(hdrTyped, "type", "kind", 1), []string{"line 1: header: want exactly"}},
		{"typed file, untyped line", hdrTyped + ok(ref1), []string{"line 2: want 7 fields, got 6"}},
		{"unknown type", hdrTyped + "2025-03-01,ch_1," + ref1 + ",10.00,TRY,settled,payout\n", []string{`line 2: type: want "charge", "refund" or "capture", got "payout"`}},
		{"empty type", hdrTyped + "2025-03-01,ch_1," + ref1 + ",10.00,TRY,settled,\n", []string{`line 2: type: want "charge", "refund" or "capture", got ""`}},
		{"scope too short", hdr + "scope,all\n", []string{"line 2: scope: want scope,<all | merchant ids"}},
		{"scope with more", hdrTyped + "scope,all,charge,x,,,\n", []string{"line 2: scope: want"}},
		{"scope merchants", hdr + "scope,everyone,charge,,,\n", []string{`line 2: scope: merchants: "everyone" is not a merchant id`}},
		{"scope merchant twice", hdr + "scope," + ref1 + " " + ref1 + ",charge,,,\n", []string{"line 2: scope: merchants: " + ref1 + " is listed twice"}},
		{"scope types", hdrTyped + "scope,all,charges,,,,\n", []string{`line 2: scope: types: "charges": want charge, refund or charge refund`}},
		{"scope types twice", hdrTyped + "scope,all,charge charge,,,,\n", []string{"line 2: scope: types:"}},
		{"scope of refunds without the type column", hdr + "scope,all,charge refund,,,\n",
			[]string{"line 2: scope: covers refunds, but the file has no type column to list them"}},
		{"two scope rows", hdr + "scope,all,charge,,,\nscope," + ref1 + ",charge,,,\n", []string{"line 3: scope: a second scope row (the first is on line 2)"}},
		{"every problem of a line and of every line", hdr +
			"2025-13-01,ch_1,nope,10.00,XXX,paid\n" + ok(ref1) + "2025-03-01,ch_2," + ref2 + ",abc,TRY,settled\n",
			[]string{"line 2: settlement_date:", "line 2: reference:", "line 2: currency:", "line 2: status:", "line 4: amount:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lines, err := Parse(strings.NewReader(tt.in))
			require.Nil(t, lines)
			var fe *FileError
			require.True(t, errors.As(err, &fe), "want a *FileError, got %v", err)
			require.Len(t, fe.Errors, len(tt.want), "%v", err)
			for i, w := range tt.want {
				require.True(t, strings.HasPrefix(fe.Errors[i].Error(), w), "error %d: want prefix %q, got %q", i, w, fe.Errors[i].Error())
			}
			require.Contains(t, err.Error(), tt.want[0])
		})
	}
}

func TestParseCapsErrors(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString(hdr)
	for range MaxErrors + 50 {
		b.WriteString("2025-03-01,ch_1," + uuid.NewString() + ",1.001,TRY,settled\n")
	}
	_, err := Parse(strings.NewReader(b.String()))
	var fe *FileError
	require.ErrorAs(t, err, &fe)
	require.Len(t, fe.Errors, MaxErrors)
	require.Equal(t, 50, fe.Omitted)
	require.Contains(t, err.Error(), "150 error(s)")
	fields := fe.FieldErrors()
	require.Equal(t, "line 2", fields[0].Field)
	require.True(t, strings.HasPrefix(fields[0].Message, "amount: "), fields[0].Message)
	require.Equal(t, "50 more error(s) not listed", fields[len(fields)-1].Message)
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestParseReadError(t *testing.T) {
	t.Parallel()
	_, err := Parse(failingReader{})
	require.ErrorContains(t, err, "disk on fire")
	var fe *FileError
	require.False(t, errors.As(err, &fe), "a read failure is not the file's fault")
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(hdr + "2025-03-01,ch_1," + ref1 + ",1000.50,TRY,settled\n"))
	f.Add([]byte(hdr + "2025-03-01,ch_1," + ref1 + ",15,JPY,settled\n2025-03-01,ch_1," + ref1 + ",15,JPY,settled\n"))
	f.Add([]byte("\xEF\xBB\xBF" + hdr + `"2025-03-01","c""h",` + ref2 + `,"1.234",kwd,settled`))
	f.Add([]byte(hdr + "2025-03-01,ch_1," + ref1 + ",15,JPY,settled\ntrailer,2025-03-01,1,2025-03-02T00:00:00Z,,\n"))
	f.Add([]byte("a,b\n\"unterminated"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		f, err := ParseFile(bytes.NewReader(data))
		if err != nil {
			var fe *FileError
			if !errors.As(err, &fe) || len(fe.Errors) == 0 {
				t.Fatalf("want a *FileError listing problems, got %v", err)
			}
			return
		}
		// A reference listed twice parses: reconciliation reports it (charged_twice).
		lines := f.Lines
		for _, l := range lines {
			if l.AmountMinor <= 0 || l.Status != StatusSettled || l.ProviderChargeID == "" {
				t.Fatalf("accepted an invalid line %+v", l)
			}
		}
		// What Parse accepts, Write renders back to the same lines.
		var buf bytes.Buffer
		if err := Write(&buf, lines, f.Trailers...); err != nil {
			t.Fatal(err)
		}
		back, err := ParseFile(&buf)
		if err != nil || len(back.Lines) != len(lines) || len(back.Trailers) != len(f.Trailers) {
			t.Fatalf("re-parse of the rendered file: %v", err)
		}
		again := back.Lines
		for i := range lines {
			a, b := lines[i], again[i]
			a.Number, b.Number = 0, 0
			if a != b {
				t.Fatalf("round trip changed line %d: %+v -> %+v", i, a, b)
			}
		}
	})
}

// A bank's file may pad amounts with zeros past the currency's digits (JPY "1500.00", TRY
// "40.000"): they say nothing more, and the file imports. Any other digit there is an error.
func TestParsePaddedAmounts(t *testing.T) {
	t.Parallel()
	in := hdr + "2025-03-01,ch_1," + ref1 + ",1500.00,JPY,settled\n" +
		"2025-03-01,ch_2," + ref2 + ",40.000,TRY,settled\n"
	lines, err := Parse(strings.NewReader(in))
	require.NoError(t, err)
	require.Equal(t, []int64{1500, 4000}, []int64{lines[0].AmountMinor, lines[1].AmountMinor})
}
