package soak

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/kasa-pay/kasa/payment"
)

// legalHistory draws one key's history as kasa answers it: requests (POSTs and lookups) at random
// times, each taking effect at a random point between its call and its answer, answered from the
// key's true state at that point; some answers lost (Info) or refused with 503. The first POST to
// take effect makes the payment, which may be final in its own answer (the sync wait), may pass
// through unknown, and ends succeeded or failed. With expiring, its record may then expire: a
// later POST meets the invoice's live payment (duplicate_payment) after a success, or pays again
// after a failure, in a payment final in its own answer. A manual payment (never expiring here) is
// answered requires_capture or failed; once authorized, lookups show it as it goes on: perhaps
// unknown (its capture or void), then captured or canceled.
func legalHistory(t *rapid.T, expiring, manual bool) []op {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	n := rapid.IntRange(1, 8).Draw(t, "requests")
	outcome := rapid.SampledFrom([]payment.Status{payment.StatusSucceeded, payment.StatusFailed}).Draw(t, "outcome")
	answerStatus := map[payment.Status]int{payment.StatusSucceeded: 201, payment.StatusFailed: 402}
	laterUnknownAt, laterAt, later := -1, -1, payment.Status("")
	if manual {
		outcome = rapid.SampledFrom([]payment.Status{payment.StatusRequiresCapture, payment.StatusFailed}).Draw(t, "outcome")
		answerStatus = map[payment.Status]int{payment.StatusRequiresCapture: 201, payment.StatusFailed: 402}
		later = rapid.SampledFrom([]payment.Status{payment.StatusSucceeded, payment.StatusCanceled}).Draw(t, "later")
	}
	type req struct {
		call, at, ret int
		lookup        bool
		fate          string // "answer", "lost", "503"
	}
	reqs := make([]req, n)
	for i := range reqs {
		call := rapid.IntRange(0, 1000).Draw(t, "call")
		ret := call + rapid.IntRange(1, 300).Draw(t, "duration")
		reqs[i] = req{call: call, at: rapid.IntRange(call, ret).Draw(t, "effect"), ret: ret,
			lookup: rapid.IntRange(0, 4).Draw(t, "lookup") == 0, fate: rapid.SampledFrom([]string{"answer", "answer", "answer", "lost", "503"}).Draw(t, "fate")}
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return reqs[a].at - reqs[b].at })
	created, unknownAt, finalAt, expiredAt, again := -1, -1, -1, -1, -1
	againOutcome := rapid.SampledFrom([]payment.Status{payment.StatusSucceeded, payment.StatusFailed}).Draw(t, "second outcome")
	ops := make([]op, n)
	for _, i := range order {
		r := reqs[i]
		if !r.lookup && created < 0 && r.fate != "503" { // the first POST to take effect makes the payment
			created = r.at
			if rapid.Bool().Draw(t, "final within the sync wait") {
				finalAt = r.at
			} else {
				finalAt = r.at + rapid.IntRange(1, 600).Draw(t, "final after")
				if rapid.Bool().Draw(t, "via unknown") {
					unknownAt = rapid.IntRange(r.at, finalAt-1).Draw(t, "unknown at")
				}
			}
			if expiring {
				expiredAt = finalAt + rapid.IntRange(1, 400).Draw(t, "expires after")
			}
			if manual && outcome == payment.StatusRequiresCapture {
				laterAt = finalAt + rapid.IntRange(1, 600).Draw(t, "command after")
				if rapid.Bool().Draw(t, "command via unknown") {
					laterUnknownAt = rapid.IntRange(finalAt, laterAt-1).Draw(t, "command unknown at")
				}
			}
		}
		if !r.lookup && expiredAt >= 0 && r.at >= expiredAt && outcome == payment.StatusFailed && again < 0 && r.fate != "503" {
			again = r.at // a new request: the second payment
		}
		o := op{Lookup: r.lookup, Call: ms(r.call), Return: ms(r.ret), Body: fmt.Sprintf("p%d", i)}
		status := payment.StatusProcessing
		if unknownAt >= 0 && r.at >= unknownAt {
			status = payment.StatusUnknown
		}
		if finalAt >= 0 && r.at >= finalAt {
			status = outcome
		}
		expired := expiredAt >= 0 && r.at >= expiredAt
		switch {
		case r.fate == "lost":
			o = op{Call: o.Call, Return: o.Return, Info: true}
		case r.fate == "503":
			o.Status, o.Code = 503, "unavailable"
		case r.lookup && created < 0:
			o.Status = 404
		case again >= 0 && r.at >= again: // the second payment, final in its first answer
			o.Status, o.Payment, o.Resource, o.Body = map[payment.Status]int{payment.StatusSucceeded: 201, payment.StatusFailed: 402}[againOutcome], "pay-2", againOutcome, "final-2"
			o.Replayed = !r.lookup && r.at != again
			if r.lookup {
				o.Status = 200
			}
		case expired && !r.lookup && outcome == payment.StatusSucceeded:
			o.Status, o.Code, o.Payment = 409, "duplicate_payment", "pay-1"
		case r.lookup:
			o.Status, o.Payment, o.Resource = 200, "pay-1", status
			switch {
			case laterAt >= 0 && r.at >= laterAt:
				o.Resource = later
			case laterUnknownAt >= 0 && r.at >= laterUnknownAt:
				o.Resource = payment.StatusUnknown
			}
		case answerStatus[status] != 0:
			o.Status, o.Payment, o.Resource, o.Body = answerStatus[status], "pay-1", status, "final"
			o.Replayed = r.at != created
		case r.at == created || status == payment.StatusUnknown:
			o.Status, o.Payment, o.Resource = 202, "pay-1", status
		default:
			o.Status, o.Code = 409, "idempotency_key_in_use"
		}
		ops[i] = o
	}
	return ops
}

// Every history kasa may give, with records that expire or not, is explained by the model: the
// checker raises no false alarm.
func TestLegalHistoriesAreLinearizable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		manual := rapid.Bool().Draw(t, "manual")
		expiring := !manual && rapid.Bool().Draw(t, "expiring")
		h := legalHistory(t, expiring, manual)
		require.True(t, linearizable(keyKind{expires: expiring, manual: manual}, h), "\n%s", describe(h))
	})
}

// A legal history with one answer naming another payment is not: the checker misses no second
// payment under a key.
func TestSecondPaymentIsCaught(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		manual := rapid.Bool().Draw(t, "manual")
		h := legalHistory(t, false, manual)
		var naming []int
		for i, o := range h {
			if o.Payment != "" {
				naming = append(naming, i)
			}
		}
		if len(naming) < 2 {
			t.Skip("fewer than two answers name the payment")
		}
		h[rapid.SampledFrom(naming).Draw(t, "changed")].Payment = "pay-2"
		require.False(t, linearizable(keyKind{manual: manual}, h), "\n%s", describe(h))
	})
}
