// Package reconcile matches a provider's settlement file to kasa's payments and refunds
// (docs/reconciliation.md): it resolves unknown ones through their workflow's checked `settle` update
// and reports every disagreement between the bank and kasa without changing it silently.
package reconcile

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
)

// Header is the settlement file's first row in its six-column form, which lists charges only.
var Header = []string{"settlement_date", "provider_charge_id", "reference", "amount", "currency", "status"}

// HeaderTyped is the first row of the seven-column form: every line says in `type` whether it
// is a charge or a refund.
var HeaderTyped = []string{"settlement_date", "provider_charge_id", "reference", "amount", "currency", "status", "type"}

// Line types. A refund's line carries the refund's operation id as reference, the refund's id
// at the bank as provider_charge_id, and the amount paid back.
// A capture's line is a manual payment's charge: its reference is the payment's id, its amount
// what was captured; a file that covers charges covers captures.
const (
	TypeCharge  = "charge"
	TypeRefund  = "refund"
	TypeCapture = "capture"
)

// StatusSettled is the only status a settlement line may carry.
const StatusSettled = "settled"

// TrailerTag starts a trailer row: `trailer,<YYYY-MM-DD>,<lines>,<as_of>` says the file holds
// every settlement the bank booked on that day up to as_of (RFC 3339), and how many lines that
// is. Only a day with a trailer can prove that an unlisted payment was not charged: a file cut
// short at a line boundary still parses, but loses its trailer (docs/reconciliation.md).
const TrailerTag = "trailer"

// ScopeTag starts the file's scope row: `scope,<merchants>,<types>` declares what the file
// speaks for. <merchants> is `all` or merchant ids separated by spaces; <types> is `charge`,
// `refund` or `charge refund`: the line types whose absence from the file means something. A
// file declares its scope at most once; without one, the import must declare the merchants
// (Options) and the file covers charges only. Covering refunds needs the type column.
const ScopeTag = "scope"

// MaxErrors bounds how many line errors a FileError lists; the rest are only counted.
const MaxErrors = 100

// maxChargeIDLen bounds provider_charge_id (it becomes the payment's provider_reference).
const maxChargeIDLen = 255

// Day is a UTC calendar day, rendered YYYY-MM-DD.
type Day string

// Start is the day's first instant (UTC).
func (d Day) Start() time.Time {
	t, _ := time.Parse(time.DateOnly, string(d))
	return t
}

// End is the next day's first instant (UTC).
func (d Day) End() time.Time { return d.Start().AddDate(0, 0, 1) }

// Next is the following day.
func (d Day) Next() Day { return DayOf(d.End()) }

// Prev is the day before.
func (d Day) Prev() Day { return DayOf(d.Start().AddDate(0, 0, -1)) }

// ParseDay accepts exactly YYYY-MM-DD.
func ParseDay(s string) (Day, error) {
	t, err := time.Parse(time.DateOnly, s)
	if err != nil || len(s) != len(time.DateOnly) || t.Format(time.DateOnly) != s {
		return "", errors.New("must be a date YYYY-MM-DD")
	}
	return Day(s), nil
}

// DayOf is the UTC day of t.
func DayOf(t time.Time) Day { return Day(t.UTC().Format(time.DateOnly)) }

// Line is one validated settlement line: the bank says it moved AmountMinor for Reference.
type Line struct {
	Number           int       `json:"line"` // line number in the file (the header is line 1)
	SettlementDate   Day       `json:"settlement_date"`
	ProviderChargeID string    `json:"provider_charge_id"`
	Reference        uuid.UUID `json:"reference"` // the operation id = payment id
	AmountMinor      int64     `json:"amount_minor"`
	Currency         string    `json:"currency"`
	Status           string    `json:"status"`
	Type             string    `json:"type"` // TypeCharge or TypeRefund
}

// Amount renders the line's amount in major units.
func (l Line) Amount() string { return payment.FormatAmount(l.AmountMinor, l.Currency) }

// Trailer is a file's declaration that it is complete for Day up to AsOf: it lists every
// settlement the bank booked on Day until then, Lines of them.
type Trailer struct {
	Number int       `json:"line"` // line number in the file
	Day    Day       `json:"day"`
	Lines  int       `json:"lines"`
	AsOf   time.Time `json:"as_of"`
}

// Scope is what a file's scope row declares it covers: the merchants (all, or those listed)
// and the line types. Only what it covers can be released by the file's silence.
type Scope struct {
	Number       int         `json:"line"` // line number in the file
	AllMerchants bool        `json:"all_merchants"`
	Merchants    []uuid.UUID `json:"merchants,omitempty"`
	Charges      bool        `json:"charges"`
	Refunds      bool        `json:"refunds"`
}

// File is a parsed settlement file: its lines and the trailers declaring it complete (none in
// a file without trailers, which can only say what was charged).
type File struct {
	Lines    []Line
	Trailers []Trailer
	// Scope is the file's own declaration of what it covers; nil when it has no scope row.
	Scope *Scope
	// Typed: the file has the seventh column, type. Only such a file can list refunds; it
	// covers them only when its scope row says so (the column alone proves nothing).
	Typed bool
}

// LineError is one problem of a settlement file, at a line (0: the file as a whole).
type LineError struct {
	Line    int    `json:"line"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func (e LineError) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// FileError is a settlement file that cannot be reconciled as sent: every problem found, with
// its line number (at most MaxErrors listed; Omitted counts the rest). Nothing was changed.
type FileError struct {
	Errors  []LineError
	Omitted int
}

func (e *FileError) Error() string {
	n := len(e.Errors) + e.Omitted
	parts := make([]string, len(e.Errors))
	for i, le := range e.Errors {
		parts[i] = le.Error()
	}
	msg := fmt.Sprintf("invalid settlement file: %d error(s): %s", n, strings.Join(parts, "; "))
	if e.Omitted > 0 {
		msg += fmt.Sprintf("; and %d more", e.Omitted)
	}
	return msg
}

// FieldErrors renders the problems as payment.FieldError ({"field": "line 7", "message":
// "amount: ..."}) for the API's problem+json body.
func (e *FileError) FieldErrors() []payment.FieldError {
	out := make([]payment.FieldError, 0, len(e.Errors)+1)
	for _, le := range e.Errors {
		field := "file"
		if le.Line > 0 {
			field = "line " + strconv.Itoa(le.Line)
		}
		msg := le.Message
		if le.Field != "" {
			msg = le.Field + ": " + msg
		}
		out = append(out, payment.FieldError{Field: field, Message: msg})
	}
	if e.Omitted > 0 {
		out = append(out, payment.FieldError{Field: "file", Message: fmt.Sprintf("%d more error(s) not listed", e.Omitted)})
	}
	return out
}

func (e *FileError) add(line int, field, msg string) {
	if len(e.Errors) >= MaxErrors {
		e.Omitted++
		return
	}
	e.Errors = append(e.Errors, LineError{Line: line, Field: field, Message: msg})
}

// Parse reads a settlement file's lines (ParseFile without the trailers).
func Parse(r io.Reader) ([]Line, error) {
	f, err := ParseFile(r)
	if err != nil {
		return nil, err
	}
	return f.Lines, nil
}

// ParseFile reads a settlement CSV strictly: the header row exactly as Header or HeaderTyped
// (a UTF-8 byte order mark before it is tolerated), as many fields on every line, each
// validated, amounts parsed exactly for the currency's exponent; at most one scope row; then
// the trailers, if any: at most one per day, each counting exactly its day's lines (of both
// types), and every line's day with a trailer. A line of the six-column form is a charge. A
// reference listed twice is kept twice: it is the bank's statement, and reconciliation reports
// it (charged_twice) while the rest of the file applies. Every problem is collected with its
// line number into a *FileError; a read failure is returned as is.
func ParseFile(r io.Reader) (*File, error) {
	br := &bomSkipper{r: r}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = -1 // a trailer may be shorter; counted below
	cr.ReuseRecord = true

	var (
		fe     FileError
		f      File
		header = true
		width  = len(Header) // fields per line, set by the header
	)
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		var pe *csv.ParseError
		if err != nil && !errors.As(err, &pe) {
			return nil, fmt.Errorf("read settlement file: %w", err)
		}
		if err != nil {
			// A syntax error (a stray quote...): the rest of the file cannot be trusted to be
			// split into the same records, so stop here.
			fe.add(pe.StartLine, "", "malformed CSV: "+pe.Err.Error())
			break
		}
		num, _ := cr.FieldPos(0)
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue // a line of spaces carries nothing, as a blank one does
		}
		if header {
			header = false
			switch len(rec) {
			case len(Header), len(HeaderTyped):
				width = len(rec)
				f.Typed = width == len(HeaderTyped)
				if !equal(rec, Header) && !equal(rec, HeaderTyped) {
					fe.add(num, "header", "want exactly "+strings.Join(Header, ",")+" (or with a seventh column type)")
				}
			default:
				fe.add(num, "", fmt.Sprintf("want %d or %d fields, got %d", len(Header), len(HeaderTyped), len(rec)))
			}
			continue
		}
		if rec[0] == ScopeTag {
			if sc, ok := parseScope(num, rec, f.Typed, &fe); ok {
				if f.Scope != nil {
					fe.add(num, ScopeTag, fmt.Sprintf("a second scope row (the first is on line %d)", f.Scope.Number))
					continue
				}
				f.Scope = &sc
			}
			continue
		}
		if rec[0] == TrailerTag {
			if t, ok := parseTrailer(num, rec, &fe); ok {
				f.Trailers = append(f.Trailers, t)
			}
			continue
		}
		if len(rec) != width {
			fe.add(num, "", fmt.Sprintf("want %d fields, got %d", width, len(rec)))
			continue
		}
		l, ok := parseLine(num, rec, &fe)
		if !ok {
			continue
		}
		f.Lines = append(f.Lines, l)
	}
	if header {
		fe.add(1, "header", "missing: the file is empty (want "+strings.Join(Header, ",")+")")
	}
	if len(fe.Errors) == 0 {
		checkTrailers(&f, &fe)
	}
	if len(fe.Errors) > 0 {
		return nil, &fe
	}
	return &f, nil
}

// parseTrailer reads `trailer,<day>,<lines>,<as_of>`; further fields, if any, must be empty
// (a trailer written with as many fields as the header).
func parseTrailer(num int, rec []string, fe *FileError) (Trailer, bool) {
	t := Trailer{Number: num}
	before := len(fe.Errors) + fe.Omitted
	if len(rec) < 4 || strings.Join(rec[4:], "") != "" {
		fe.add(num, TrailerTag, "want "+TrailerTag+",<YYYY-MM-DD>,<number of lines>,<as_of RFC 3339>")
		return t, false
	}
	if d, err := ParseDay(rec[1]); err != nil {
		fe.add(num, TrailerTag, "day: "+err.Error())
	} else {
		t.Day = d
	}
	if n, err := strconv.Atoi(rec[2]); err != nil || n < 0 || strconv.Itoa(n) != rec[2] {
		fe.add(num, TrailerTag, fmt.Sprintf("lines: %q must be a whole number", rec[2]))
	} else {
		t.Lines = n
	}
	switch at, err := time.Parse(time.RFC3339Nano, rec[3]); {
	case err != nil:
		fe.add(num, TrailerTag, fmt.Sprintf("as_of: %q must be an RFC 3339 time", rec[3]))
	case t.Day != "" && at.Before(t.Day.Start()):
		fe.add(num, TrailerTag, fmt.Sprintf("as_of: %s is before %s begins", rec[3], t.Day))
	case at.UTC().Year() > 9999:
		// RFC 3339 (and so the report's JSON) cannot write such a time back.
		fe.add(num, TrailerTag, fmt.Sprintf("as_of: %s is after the year 9999 in UTC", rec[3]))
	default:
		t.AsOf = at.UTC()
	}
	return t, len(fe.Errors)+fe.Omitted == before
}

// parseScope reads `scope,<merchants>,<types>` (see ScopeTag); further fields, if any, must be
// empty. Refunds can be covered only by a file with the type column.
func parseScope(num int, rec []string, typed bool, fe *FileError) (Scope, bool) {
	sc := Scope{Number: num}
	before := len(fe.Errors) + fe.Omitted
	if len(rec) < 3 || strings.Join(rec[3:], "") != "" {
		fe.add(num, ScopeTag, "want "+ScopeTag+",<all | merchant ids separated by spaces>,<charge | refund | charge refund>")
		return sc, false
	}
	if rec[1] == "all" {
		sc.AllMerchants = true
	} else {
		seen := map[uuid.UUID]bool{}
		for _, m := range strings.Split(rec[1], " ") {
			id, err := uuid.Parse(m)
			switch {
			case err != nil || len(m) != 36:
				fe.add(num, ScopeTag, fmt.Sprintf("merchants: %q is not a merchant id (want all, or merchant ids separated by single spaces)", m))
			case seen[id]:
				fe.add(num, ScopeTag, fmt.Sprintf("merchants: %s is listed twice", m))
			default:
				seen[id] = true
				sc.Merchants = append(sc.Merchants, id)
			}
		}
	}
	for _, t := range strings.Split(rec[2], " ") {
		switch {
		case t == TypeCharge && !sc.Charges:
			sc.Charges = true
		case t == TypeRefund && !sc.Refunds:
			sc.Refunds = true
		default:
			fe.add(num, ScopeTag, fmt.Sprintf("types: %q: want charge, refund or charge refund", rec[2]))
			return sc, false
		}
	}
	if sc.Refunds && !typed {
		fe.add(num, ScopeTag, "covers refunds, but the file has no type column to list them")
	}
	return sc, len(fe.Errors)+fe.Omitted == before
}

// checkTrailers holds a file with trailers to them: one per day, each counting its day's lines
// exactly, and no line on a day without one. A file whose trailer disagrees with its lines was
// damaged or assembled wrongly; it is refused whole.
func checkTrailers(f *File, fe *FileError) {
	if len(f.Trailers) == 0 {
		return
	}
	perDay := map[Day]int{}
	for _, l := range f.Lines {
		perDay[l.SettlementDate]++
	}
	declared := map[Day]int{}
	for _, t := range f.Trailers {
		if first, dup := declared[t.Day]; dup {
			fe.add(t.Number, TrailerTag, fmt.Sprintf("a second trailer for %s (the first is on line %d)", t.Day, first))
			continue
		}
		declared[t.Day] = t.Number
		if n := perDay[t.Day]; n != t.Lines {
			fe.add(t.Number, TrailerTag, fmt.Sprintf("declares %d line(s) for %s, the file has %d: it is incomplete or damaged", t.Lines, t.Day, n))
		}
	}
	for _, l := range f.Lines {
		if _, ok := declared[l.SettlementDate]; !ok {
			fe.add(l.Number, "settlement_date", fmt.Sprintf("%s has no trailer, but the file has trailers for other days", l.SettlementDate))
		}
	}
}

func parseLine(num int, rec []string, fe *FileError) (Line, bool) {
	l := Line{Number: num}
	before := len(fe.Errors) + fe.Omitted

	if d, err := ParseDay(rec[0]); err != nil {
		fe.add(num, "settlement_date", err.Error())
	} else {
		l.SettlementDate = d
	}

	switch id := rec[1]; {
	case id == "":
		fe.add(num, "provider_charge_id", "is required")
	case len(id) > maxChargeIDLen:
		fe.add(num, "provider_charge_id", fmt.Sprintf("longer than %d bytes", maxChargeIDLen))
	case !printable(id):
		fe.add(num, "provider_charge_id", "must be printable text without spaces")
	default:
		l.ProviderChargeID = id
	}

	if ref, err := uuid.Parse(rec[2]); err != nil || len(rec[2]) != 36 {
		fe.add(num, "reference", "must be an operation id (UUID xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
	} else {
		l.Reference = ref
	}

	if c, err := payment.ParseCurrency(rec[4]); err != nil {
		fe.add(num, "currency", err.Error())
	} else {
		l.Currency = c
		if minor, err := payment.ParsePaddedAmount(rec[3], c); err != nil {
			fe.add(num, "amount", fmt.Sprintf("%q: %v", rec[3], err))
		} else {
			l.AmountMinor = minor
		}
	}

	if rec[5] != StatusSettled {
		fe.add(num, "status", fmt.Sprintf("want %q, got %q", StatusSettled, rec[5]))
	} else {
		l.Status = rec[5]
	}

	l.Type = TypeCharge
	if len(rec) == len(HeaderTyped) {
		if t := rec[6]; t != TypeCharge && t != TypeRefund && t != TypeCapture {
			fe.add(num, "type", fmt.Sprintf("want %q, %q or %q, got %q", TypeCharge, TypeRefund, TypeCapture, t))
		} else {
			l.Type = t
		}
	}
	return l, len(fe.Errors)+fe.Omitted == before
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// bomSkipper drops a UTF-8 byte order mark at the very start (spreadsheets write one).
type bomSkipper struct {
	r       io.Reader
	checked bool
	buf     []byte
}

func (b *bomSkipper) Read(p []byte) (int, error) {
	if !b.checked {
		b.checked = true
		head := make([]byte, 3)
		n, err := io.ReadFull(b.r, head)
		head = head[:n]
		if !bytes.Equal(head, []byte{0xEF, 0xBB, 0xBF}) {
			b.buf = head
		}
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return 0, err
		}
	}
	if len(b.buf) > 0 {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		return n, nil
	}
	return b.r.Read(p)
}

// Write renders lines as a settlement CSV (header included) followed by the trailers: in the
// six-column form when every line is a charge, else with `type`.
func Write(w io.Writer, lines []Line, trailers ...Trailer) error {
	return WriteFile(w, &File{Lines: lines, Trailers: trailers})
}

// WriteFile renders a file, the inverse of ParseFile: with the `type` column when the file is
// Typed, has a refund line or covers refunds; its scope row, if any, right after the header.
func WriteFile(w io.Writer, f *File) error {
	lines, trailers := f.Lines, f.Trailers
	header := Header
	if f.Typed || (f.Scope != nil && f.Scope.Refunds) {
		header = HeaderTyped
	}
	for _, l := range lines {
		if l.Type != "" && l.Type != TypeCharge {
			header = HeaderTyped
			break
		}
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(header); err != nil {
		return err
	}
	if f.Scope != nil {
		row := ScopeRow(*f.Scope)
		for len(row) < len(header) {
			row = append(row, "")
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	for _, l := range lines {
		row := []string{string(l.SettlementDate), l.ProviderChargeID, l.Reference.String(), l.Amount(), l.Currency, l.Status}
		if len(header) == len(HeaderTyped) {
			t := l.Type
			if t == "" {
				t = TypeCharge
			}
			row = append(row, t)
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	for _, t := range trailers {
		row := TrailerRow(t.Day, t.Lines, t.AsOf)
		for len(row) < len(header) {
			row = append(row, "")
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// TrailerRow is the trailer for day: n lines, complete up to asOf (as many fields as Header).
func TrailerRow(day Day, n int, asOf time.Time) []string {
	return []string{TrailerTag, string(day), strconv.Itoa(n), asOf.UTC().Format(time.RFC3339Nano), "", ""}
}

// ScopeRow is the scope row declaring sc (three fields; WriteFile pads it to the header).
func ScopeRow(sc Scope) []string {
	merchants := "all"
	if !sc.AllMerchants {
		ids := make([]string, len(sc.Merchants))
		for i, m := range sc.Merchants {
			ids[i] = m.String()
		}
		merchants = strings.Join(ids, " ")
	}
	var types []string
	if sc.Charges {
		types = append(types, TypeCharge)
	}
	if sc.Refunds {
		types = append(types, TypeRefund)
	}
	return []string{ScopeTag, merchants, strings.Join(types, " ")}
}
