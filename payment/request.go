package payment

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
)

// MaxBodyBytes is the largest request body the API accepts.
const MaxBodyBytes = 64 << 10

// DefaultPaymentType applies when a request names none.
const DefaultPaymentType = "purchase"

var (
	invoicePattern     = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)
	paymentTypePattern = regexp.MustCompile(`^[a-z_]{1,32}$`)
)

// Request is a validated payment request in canonical form.
type Request struct {
	InvoiceID   string
	AmountMinor int64
	Currency    string
	AccountID   uuid.UUID
	PaymentType string
	// CaptureManual: authorize now, capture later (the body's "capture": "manual").
	CaptureManual bool
}

// Money returns the requested amount.
func (r Request) Money() Money { return Money{Minor: r.AmountMinor, Currency: r.Currency} }

// Hash is the SHA-256 of the canonical form: equivalent requests ("1000" and 1000.00, "try" and
// "TRY") hash equal, different ones never collide by concatenation (fields are length-prefixed).
func (r Request) Hash() string {
	h := sha256.New()
	for _, f := range []string{r.InvoiceID, r.Currency, r.AccountID.String(), r.PaymentType} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	var amt [8]byte
	binary.BigEndian.PutUint64(amt[:], uint64(r.AmountMinor))
	h.Write(amt[:])
	if r.CaptureManual { // only then: the hashes of automatic payments stay what they were
		h.Write([]byte(CaptureManual))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ParseRequest decodes and validates a POST /v1/payments body strictly: unknown, duplicate or
// missing fields, trailing data and inexact amounts are all a *ValidationError listing every problem.
func ParseRequest(body []byte) (Request, error) {
	fields, err := decodeObject(body)
	if err != nil {
		return Request{}, &ValidationError{Fields: []FieldError{{"body", err.Error()}}}
	}
	var (
		ve  ValidationError
		req Request
	)
	allowed := map[string]bool{"invoice_id": true, "amount": true, "currency": true, "account_id": true, "payment_type": true, "capture": true}
	for _, k := range fields.order {
		if !allowed[k] {
			ve.add(k, "unknown field")
		}
	}

	if raw, ok := fields.get("invoice_id"); !ok {
		ve.add("invoice_id", "is required")
	} else if s, err := stringOrInteger(raw); err != nil || !invoicePattern.MatchString(s) {
		ve.add("invoice_id", "must be 1-64 characters of A-Z a-z 0-9 . _ : - (or a JSON integer)")
	} else {
		req.InvoiceID = s
	}

	if raw, ok := fields.get("currency"); !ok {
		ve.add("currency", "is required")
	} else if s, err := stringValue(raw); err != nil {
		ve.add("currency", "must be a string")
	} else if c, err := ParseCurrency(s); err != nil {
		ve.add("currency", err.Error())
	} else {
		req.Currency = c
	}

	if raw, ok := fields.get("amount"); !ok {
		ve.add("amount", "is required")
	} else if s, err := stringOrNumber(raw); err != nil {
		ve.add("amount", "must be a decimal string or a JSON number")
	} else if req.Currency != "" {
		minor, err := parseSignedAmount(s, req.Currency)
		if err != nil {
			ve.add("amount", err.Error())
		}
		req.AmountMinor = minor
	} else if err := checkAmountForm(s); err != nil {
		// Without a valid currency its fraction digits cannot be judged, but a malformed or
		// non-positive amount is still listed with the other fields.
		ve.add("amount", err.Error())
	}

	if raw, ok := fields.get("account_id"); !ok {
		ve.add("account_id", "is required")
	} else if s, err := stringValue(raw); err != nil {
		ve.add("account_id", "must be a string")
	} else if id, err := uuid.Parse(s); err != nil || len(s) != 36 {
		ve.add("account_id", "must be an account id (UUID)")
	} else {
		req.AccountID = id
	}

	req.PaymentType = DefaultPaymentType
	if raw, ok := fields.get("payment_type"); ok && string(raw) != "null" {
		if s, err := stringValue(raw); err != nil || !paymentTypePattern.MatchString(s) {
			ve.add("payment_type", "must be 1-32 characters of a-z and _")
		} else {
			req.PaymentType = s
		}
	}

	if raw, ok := fields.get("capture"); ok && string(raw) != "null" {
		switch s, err := stringValue(raw); {
		case err == nil && s == CaptureManual:
			req.CaptureManual = true
		case err == nil && s == "automatic":
		default:
			ve.add("capture", `must be "automatic" or "manual"`)
		}
	}

	if len(ve.Fields) > 0 {
		return Request{}, &ve
	}
	return req, nil
}

// checkAmountForm checks what an amount must be in any currency: unsigned decimal digits, above zero.
func checkAmountForm(s string) error {
	if strings.HasPrefix(s, "-") {
		return ErrNonPositiveAmount
	}
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" || (hasDot && frac == "") || !allDigits(intPart) || !allDigits(frac) {
		return ErrInvalidAmount
	}
	if strings.Trim(intPart+frac, "0") == "" {
		return ErrNonPositiveAmount
	}
	return nil
}

func parseSignedAmount(s, code string) (int64, error) {
	if strings.HasPrefix(s, "-") {
		return 0, ErrNonPositiveAmount
	}
	return ParseAmount(s, code)
}

type object struct {
	order  []string
	values map[string]json.RawMessage
}

func (o object) get(k string) (json.RawMessage, bool) {
	v, ok := o.values[k]
	return v, ok
}

// StrictObject checks that body is exactly one JSON object, without duplicate keys or trailing
// data, as ParseRequest requires, and returns its keys in order: other decoders of JSON bodies
// hold their input to the same rules.
func StrictObject(body []byte) ([]string, error) {
	o, err := decodeObject(body)
	return o.order, err
}

// decodeObject reads exactly one JSON object, rejecting duplicate keys and trailing data, which
// encoding/json alone silently accepts.
func decodeObject(body []byte) (object, error) {
	o := object{values: map[string]json.RawMessage{}}
	if len(bytes.TrimSpace(body)) == 0 {
		return o, errors.New("body is empty")
	}
	// JSON is UTF-8 (RFC 8259); encoding/json would turn other bytes into U+FFFD and keep a
	// reason or a name that is not what the client sent.
	if !utf8.Valid(body) {
		return o, errors.New("body is not valid UTF-8")
	}
	if loneSurrogate(body) {
		return o, errors.New(`body has half of a UTF-16 surrogate pair (\uD800-\uDFFF alone)`)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return o, errors.New("body is not valid JSON")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return o, errors.New("body must be a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return o, errors.New("body is not valid JSON")
		}
		key := tok.(string) // inside an object the decoder only yields string keys
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return o, errors.New("body is not valid JSON")
		}
		if _, dup := o.values[key]; dup {
			return o, errors.New("duplicate field " + key)
		}
		o.order = append(o.order, key)
		o.values[key] = raw
	}
	if _, err := dec.Token(); err != nil {
		return o, errors.New("body is not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return o, errors.New("unexpected data after the JSON object")
	}
	return o, nil
}

// loneSurrogate says whether body escapes half of a UTF-16 surrogate pair, which names no
// character: encoding/json would keep U+FFFD in its place. A backslash is only valid in a string.
func loneSurrogate(body []byte) bool {
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		switch r := escapedRune(body[i:]); {
		case r >= 0xd800 && r < 0xdc00: // a high half: its low half must follow
			if low := escapedRune(body[i+6:]); low < 0xdc00 || low >= 0xe000 {
				return true
			}
			i += 11
		case r >= 0xdc00 && r < 0xe000:
			return true
		default:
			i++ // past the escaped character: the second backslash of \\ starts no escape
		}
	}
	return false
}

// escapedRune is the code unit of the \uXXXX escape b starts with, or -1.
func escapedRune(b []byte) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	r, err := strconv.ParseUint(string(b[2:6]), 16, 16)
	if err != nil {
		return -1
	}
	return rune(r)
}

func stringValue(raw json.RawMessage) (string, error) {
	var s string
	if len(raw) == 0 || raw[0] != '"' {
		return "", errors.New("not a string")
	}
	err := json.Unmarshal(raw, &s)
	return s, err
}

// stringOrNumber returns a JSON string's content, or a JSON number's literal text unchanged.
func stringOrNumber(raw json.RawMessage) (string, error) {
	if len(raw) > 0 && raw[0] == '"' {
		return stringValue(raw)
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&n); err != nil {
		return "", err
	}
	if strings.ContainsAny(n.String(), "eE") {
		return "", errors.New("exponent notation is not accepted")
	}
	return n.String(), nil
}

func stringOrInteger(raw json.RawMessage) (string, error) {
	if len(raw) > 0 && raw[0] == '"' {
		return stringValue(raw)
	}
	s, err := stringOrNumber(raw)
	if err != nil || strings.Contains(s, ".") {
		return "", errors.New("not an integer")
	}
	return s, nil
}

// ValidKey reports whether an Idempotency-Key header value is acceptable.
func ValidKey(k string) bool {
	if len(k) < 1 || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] > '~' {
			return false
		}
	}
	return true
}

// ParseAmountJSON parses a JSON amount (decimal string or number) exactly into minor units.
func ParseAmountJSON(raw json.RawMessage, code string) (int64, error) {
	if len(raw) == 0 {
		return 0, errors.New("is required")
	}
	s, err := stringOrNumber(raw)
	if err != nil {
		return 0, ErrInvalidAmount
	}
	return parseSignedAmount(s, code)
}
