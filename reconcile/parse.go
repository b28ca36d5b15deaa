// Package reconcile matches a provider's settlement file to kasa's payments (docs/operations.md): it
// resolves unknown payments through the workflow's checked `settle` update and reports every
// disagreement between the bank and kasa without changing it silently.
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

// Header is the settlement file's required first row, exactly.
var Header = []string{"settlement_date", "provider_charge_id", "reference", "amount", "currency", "status"}

// StatusSettled is the only status a settlement line may carry.
const StatusSettled = "settled"

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
}

// Amount renders the line's amount in major units.
func (l Line) Amount() string { return payment.FormatAmount(l.AmountMinor, l.Currency) }

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

// Parse reads a settlement CSV strictly: the header row exactly as Header (a UTF-8 byte order
// mark before it is tolerated), six fields on every line, each validated, amounts parsed
// exactly for the currency's exponent, and each reference at most once. Every problem is
// collected with its line number into a *FileError; a read failure is returned as is.
func Parse(r io.Reader) ([]Line, error) {
	br := &bomSkipper{r: r}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = len(Header)
	cr.ReuseRecord = true

	var (
		fe    FileError
		lines []Line
		seen  = map[uuid.UUID]int{}
	)
	header := true
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		var pe *csv.ParseError
		if err != nil && !errors.As(err, &pe) {
			return nil, fmt.Errorf("read settlement file: %w", err)
		}
		if err != nil && !errors.Is(pe.Err, csv.ErrFieldCount) {
			// A syntax error (a stray quote...): the rest of the file cannot be trusted to be
			// split into the same records, so stop here.
			fe.add(pe.StartLine, "", "malformed CSV: "+pe.Err.Error())
			break
		}
		num, _ := cr.FieldPos(0)
		if err != nil {
			fe.add(num, "", fmt.Sprintf("want %d fields, got %d", len(Header), len(rec)))
			header = false
			continue
		}
		if header {
			header = false
			if !equal(rec, Header) {
				fe.add(num, "header", "want exactly "+strings.Join(Header, ","))
			}
			continue
		}
		l, ok := parseLine(num, rec, &fe)
		if !ok {
			continue
		}
		if first, dup := seen[l.Reference]; dup {
			fe.add(num, "reference", fmt.Sprintf("%s is also on line %d (one settlement per payment)", l.Reference, first))
			continue
		}
		seen[l.Reference] = num
		lines = append(lines, l)
	}
	if header {
		fe.add(1, "header", "missing: the file is empty (want "+strings.Join(Header, ",")+")")
	}
	if len(fe.Errors) > 0 {
		return nil, &fe
	}
	return lines, nil
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
		if minor, err := payment.ParseAmount(rec[3], c); err != nil {
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

// Write renders lines as a settlement CSV (header included), the inverse of Parse.
func Write(w io.Writer, lines []Line) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(Header); err != nil {
		return err
	}
	for _, l := range lines {
		if err := cw.Write([]string{string(l.SettlementDate), l.ProviderChargeID, l.Reference.String(), l.Amount(), l.Currency, l.Status}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
