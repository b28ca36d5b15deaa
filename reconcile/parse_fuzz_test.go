package reconcile

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzParseFileRoundTrip holds ParseFile to its inverse: whatever it accepts, Write renders into
// a file that parses back to the same lines, scope and trailers; whatever it refuses, it
// refuses with a *FileError whose every problem names a line of the input.
func FuzzParseFileRoundTrip(f *testing.F) {
	const head = "settlement_date,provider_charge_id,reference,amount,currency,status\n"
	const ref = "0192f1f0-7d0c-7a39-9c5e-8f6a8b0a1c01"
	for _, s := range []string{
		head + "2025-03-01,ch_1," + ref + ",10.00,TRY,settled\n",
		head + "2025-03-01,ch_1," + ref + ",10.00,TRY,settled\ntrailer,2025-03-01,1,2025-03-02T00:00:00Z,,\n",
		head + "trailer,2025-03-01,0,2025-03-01T23:59:59.999999999+03:00\n",
		head + "trailer,2025-03-01,0,2025-03-02T00:00:00Z\ntrailer,2025-03-01,0,2025-03-02T00:00:00Z\n",
		head + "2025-03-01,\"c,h\"," + ref + ",1.5,kwd,settled\r\n",
		head + "2025-02-30,ch 1,nope,1.001,TRY,paid\n",
		"\xEF\xBB\xBF" + head,
		"settlement_date,provider_charge_id,reference,amount,currency,status,type\n" +
			"2025-03-01,rf_1," + ref + ",1.00,TRY,settled,refund\ntrailer,2025-03-01,1,2025-03-02T00:00:00Z,,,\n",
		"settlement_date,provider_charge_id,reference,amount,currency,status,type\n2025-03-01,ch_1," + ref + ",1.00,TRY,settled,charge\n",
		"settlement_date,provider_charge_id,reference,amount,currency,status,type\nscope,all,charge refund,,,,\n" +
			"2025-03-01,ch_1," + ref + ",1.00,TRY,settled,charge\n2025-03-01,ch_2," + ref + ",1.00,TRY,settled,charge\n",
		head + "scope," + ref + ",charge\n",
		"a,b\n\"unterminated",
		head + "trailer,9999-12-31,0,9999-12-31T23:00:00-23:00\n", // as_of past year 9999 in UTC
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := ParseFile(bytes.NewReader(data))
		if err != nil {
			var fe *FileError
			if !errors.As(err, &fe) || len(fe.Errors) == 0 {
				t.Fatalf("want a *FileError listing problems, got %T %v", err, err)
			}
			rows := bytes.Count(data, []byte("\n")) + 1
			for _, le := range fe.Errors {
				if le.Line < 0 || le.Line > rows || le.Message == "" {
					t.Fatalf("problem %+v names no line of a %d-line file", le, rows)
				}
			}
			if n := len(fe.FieldErrors()); n != len(fe.Errors) && n != len(fe.Errors)+1 {
				t.Fatalf("%d problems render as %d field errors", len(fe.Errors), n)
			}
			return
		}
		var buf bytes.Buffer
		if err := WriteFile(&buf, file); err != nil {
			t.Fatalf("WriteFile: %v", err)
		}
		back, err := ParseFile(bytes.NewReader(buf.Bytes()))
		if err != nil {
			t.Fatalf("the rendered file is refused: %v\n%s", err, buf.Bytes())
		}
		if (back.Scope == nil) != (file.Scope == nil) || file.Scope != nil && (back.Scope.AllMerchants != file.Scope.AllMerchants ||
			!slices.Equal(back.Scope.Merchants, file.Scope.Merchants) || back.Scope.Charges != file.Scope.Charges || back.Scope.Refunds != file.Scope.Refunds) {
			t.Fatalf("round trip: scope %+v -> %+v", file.Scope, back.Scope)
		}
		if back.Typed != file.Typed {
			t.Fatalf("round trip: typed %v -> %v", file.Typed, back.Typed)
		}
		if len(back.Lines) != len(file.Lines) || len(back.Trailers) != len(file.Trailers) {
			t.Fatalf("round trip: %d lines %d trailers -> %d lines %d trailers",
				len(file.Lines), len(file.Trailers), len(back.Lines), len(back.Trailers))
		}
		for i, l := range file.Lines {
			b := back.Lines[i]
			l.Number, b.Number = 0, 0
			if l != b {
				t.Fatalf("round trip changed line %d: %+v -> %+v", i, l, b)
			}
		}
		for i, tr := range file.Trailers {
			b := back.Trailers[i]
			if tr.Day != b.Day || tr.Lines != b.Lines || !tr.AsOf.Equal(b.AsOf) {
				t.Fatalf("round trip changed trailer %d: %+v -> %+v", i, tr, b)
			}
		}
	})
}

// FuzzParseDay: a day ParseDay accepts is a real UTC calendar day that renders back to itself.
func FuzzParseDay(f *testing.F) {
	for _, s := range []string{"2025-03-01", "2024-02-29", "2025-02-29", "0000-01-01", "9999-12-31", "2025-3-1", "2025-03-01T00:00:00Z", " 2025-03-01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDay(s)
		if err != nil {
			if !strings.Contains(err.Error(), "YYYY-MM-DD") {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if string(d) != s || DayOf(d.Start()) != d || d.Start().Location() != time.UTC {
			t.Fatalf("%q -> %q starts %v", s, d, d.Start())
		}
		if got := d.End().Sub(d.Start()); got != 24*time.Hour {
			t.Fatalf("%s lasts %v", d, got)
		}
	})
}
