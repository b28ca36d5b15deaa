package soak

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// The key model against short histories: what the contract allows in some order, and what no
// order explains.
func TestLinearizableKeyHistories(t *testing.T) {
	at := func(from, to int) (time.Time, time.Time) {
		t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
		return t0.Add(time.Duration(from) * time.Millisecond), t0.Add(time.Duration(to) * time.Millisecond)
	}
	ans := func(from, to, status int, id string, res payment.Status, body byte) op {
		c, r := at(from, to)
		return op{Call: c, Return: r, Status: status, Payment: id, Resource: res, Body: [32]byte{body}}
	}
	problem := func(from, to, status int, code string) op {
		c, r := at(from, to)
		return op{Call: c, Return: r, Status: status, Code: code}
	}
	none := func(from, to int) op { c, r := at(from, to); return op{Call: c, Return: r, Info: true} }
	const p1, p2 = "pay-1", "pay-2"
	ok, processing, unknown, failed := payment.StatusSucceeded, payment.StatusProcessing, payment.StatusUnknown, payment.StatusFailed
	for _, tc := range []struct {
		name    string
		history []op
		want    bool
	}{
		{"accepted, then final, then replayed", []op{ans(0, 10, 202, p1, processing, 1), ans(20, 30, 201, p1, ok, 2), ans(40, 50, 201, p1, ok, 2)}, true},
		{"unknown, then settled failed", []op{ans(0, 10, 202, p1, unknown, 1), ans(20, 30, 402, p1, failed, 3)}, true},
		{"no answer, then the payment", []op{none(0, 10), ans(20, 30, 201, p1, ok, 2)}, true},
		{"in use while in flight, concurrent with the final answer", []op{ans(0, 30, 201, p1, ok, 2), problem(10, 40, 409, "idempotency_key_in_use")}, true},
		{"asked to wait, then answered", []op{problem(0, 10, 429, ""), problem(20, 30, 503, ""), ans(40, 50, 201, p1, ok, 2)}, true},
		{"two payments for one key", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 201, p2, ok, 2)}, false},
		{"in use after the final answer", []op{ans(0, 10, 201, p1, ok, 2), problem(20, 30, 409, "idempotency_key_in_use")}, false},
		{"in flight after the final answer", []op{ans(0, 10, 402, p1, failed, 3), ans(20, 30, 202, p1, processing, 1)}, false},
		{"a replay that is not the final answer's bytes", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 201, p1, ok, 9)}, false},
		{"a final answer that changes", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 402, p1, failed, 3)}, false},
		{"201 for a failed payment", []op{ans(0, 10, 201, p1, failed, 2)}, false},
		{"another request under the key", []op{problem(0, 10, 422, "idempotency_key_reused")}, false},
		{"a duplicate business key", []op{problem(0, 10, 409, "duplicate_payment")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, linearizable(tc.history), "\n%s", describe(tc.history))
		})
	}
}
