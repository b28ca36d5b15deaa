package outbox

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Headers of a webhook request (docs/webhooks.md).
const (
	HeaderEventID   = "Kasa-Event-Id"
	HeaderSignature = "Kasa-Signature"
)

// Signature verification errors.
var (
	ErrSignatureHeader   = errors.New("malformed Kasa-Signature header")
	ErrSignatureMismatch = errors.New("webhook signature does not match the body")
	ErrSignatureExpired  = errors.New("webhook signature timestamp outside the tolerance")
)

// Sign returns the Kasa-Signature header value for body sent at t:
// "t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>", followed by one more v1 per
// non-empty previous secret: while a rotated secret is still honoured, a receiver that has only
// the old one or already the new one can verify.
func Sign(secret string, t time.Time, body []byte, previous ...string) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	out := "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
	for _, p := range previous {
		if p != "" {
			out += ",v1=" + hex.EncodeToString(mac(p, ts, body))
		}
	}
	return out
}

func mac(secret, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify checks a Kasa-Signature header against body with the merchant's webhook secret: one of
// its v1 signatures must match (several may be present while a secret is rotated), compared in
// constant time, and its timestamp must be within tolerance of now (replay protection).
func Verify(secret, header string, body []byte, tolerance time.Duration) error {
	return verifyAt(secret, header, body, tolerance, time.Now())
}

func verifyAt(secret, header string, body []byte, tolerance time.Duration, now time.Time) error {
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return ErrSignatureHeader
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			sig, err := hex.DecodeString(v)
			if err != nil {
				return ErrSignatureHeader
			}
			sigs = append(sigs, sig)
		}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrSignatureHeader
	}
	want := mac(secret, ts, body)
	matched := false
	for _, sig := range sigs {
		matched = hmac.Equal(sig, want) || matched
	}
	if !matched {
		return ErrSignatureMismatch
	}
	if age := now.Sub(time.Unix(unix, 0)); age > tolerance || age < -tolerance {
		return ErrSignatureExpired
	}
	return nil
}
