package soak

import (
	"encoding/json"
	"os"
	"path/filepath"
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
		return op{Call: c, Return: r, Status: status, Payment: id, Resource: res, Body: string(rune('a' + body))}
	}
	problem := func(from, to, status int, code string) op {
		c, r := at(from, to)
		return op{Call: c, Return: r, Status: status, Code: code}
	}
	none := func(from, to int) op { c, r := at(from, to); return op{Call: c, Return: r, Info: true} }
	lookup := func(from, to int, id string, res payment.Status) op {
		c, r := at(from, to)
		if id == "" {
			return op{Lookup: true, Call: c, Return: r, Status: 404}
		}
		return op{Lookup: true, Call: c, Return: r, Status: 200, Payment: id, Resource: res}
	}
	replayed := func(o op) op { o.Replayed = true; return o }
	req := func(o op, hash string) op { o.Request = hash; return o }
	dup := func(from, to int, id string) op {
		c, r := at(from, to)
		return op{Call: c, Return: r, Status: 409, Code: "duplicate_payment", Payment: id}
	}
	const p1, p2 = "pay-1", "pay-2"
	refund, expiring, expiringRefund := keyKind{refund: true}, keyKind{expires: true}, keyKind{refund: true, expires: true}
	ok, processing, unknown, failed := payment.StatusSucceeded, payment.StatusProcessing, payment.StatusUnknown, payment.StatusFailed
	held, canceled := payment.StatusRequiresCapture, payment.StatusCanceled
	manual, manualExpiring := keyKind{manual: true}, keyKind{manual: true, expires: true}
	capture, cancel := keyKind{command: payment.CommandCapture}, keyKind{command: payment.CommandCancel}
	for _, tc := range []struct {
		name    string
		history []op
		want    bool
		kind    keyKind
	}{
		{"accepted, then final, then replayed", []op{ans(0, 10, 202, p1, processing, 1), ans(20, 30, 201, p1, ok, 2), ans(40, 50, 201, p1, ok, 2)}, true, keyKind{}},
		{"unknown, then settled failed", []op{ans(0, 10, 202, p1, unknown, 1), ans(20, 30, 402, p1, failed, 3)}, true, keyKind{}},
		{"no answer, then the payment", []op{none(0, 10), ans(20, 30, 201, p1, ok, 2)}, true, keyKind{}},
		{"in use while in flight, concurrent with the final answer", []op{ans(0, 30, 201, p1, ok, 2), problem(10, 40, 409, "idempotency_key_in_use")}, true, keyKind{}},
		{"asked to wait, then answered", []op{problem(0, 10, 429, ""), problem(20, 30, 503, ""), ans(40, 50, 201, p1, ok, 2)}, true, keyKind{}},
		{"two payments for one key", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 201, p2, ok, 2)}, false, keyKind{}},
		{"in use after the final answer", []op{ans(0, 10, 201, p1, ok, 2), problem(20, 30, 409, "idempotency_key_in_use")}, false, keyKind{}},
		{"in flight after the final answer", []op{ans(0, 10, 402, p1, failed, 3), ans(20, 30, 202, p1, processing, 1)}, false, keyKind{}},
		{"a replay that is not the final answer's bytes", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 201, p1, ok, 9)}, false, keyKind{}},
		{"a final answer that changes", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 402, p1, failed, 3)}, false, keyKind{}},
		{"another request under the key", []op{req(ans(0, 10, 201, p1, ok, 2), "a"), req(problem(20, 30, 422, "idempotency_key_reused"), "b"), req(ans(40, 50, 201, p1, ok, 2), "a")}, true, keyKind{request: "a"}},
		{"another request under the key, answered as the key's", []op{req(ans(0, 10, 201, p1, ok, 2), "a"), req(ans(20, 30, 201, p1, ok, 2), "b")}, false, keyKind{request: "a"}},
		{"202 with a final resource (a race kasa had at the sync wait's end)", []op{ans(0, 10, 202, p1, ok, 2), ans(20, 30, 201, p1, ok, 2)}, false, keyKind{}},
		{"201 for a failed payment", []op{ans(0, 10, 201, p1, failed, 2)}, false, keyKind{}},
		{"another request under the key", []op{problem(0, 10, 422, "idempotency_key_reused")}, false, keyKind{}},
		{"a duplicate business key", []op{problem(0, 10, 409, "duplicate_payment")}, false, keyKind{}},
		{"not found, then paid", []op{lookup(0, 10, "", ""), ans(20, 30, 201, p1, ok, 2)}, true, keyKind{}},
		{"no answer, found unknown, then settled", []op{none(0, 10), lookup(20, 30, p1, unknown), ans(40, 50, 201, p1, ok, 2)}, true, keyKind{}},
		{"found succeeded while the answer is on its way", []op{ans(0, 40, 201, p1, ok, 2), lookup(10, 20, p1, ok)}, true, keyKind{}},
		{"not found after its answer", []op{ans(0, 10, 201, p1, ok, 2), lookup(20, 30, "", "")}, false, keyKind{}},
		{"in flight after a lookup showed it succeeded", []op{lookup(0, 10, p1, ok), ans(20, 30, 202, p1, processing, 1)}, false, keyKind{}},
		{"a lookup finds another payment", []op{ans(0, 10, 202, p1, processing, 1), lookup(20, 30, p2, processing)}, false, keyKind{}},
		{"a refund's answers", []op{ans(0, 10, 202, p1, unknown, 1), ans(20, 30, 201, p1, ok, 2), ans(40, 50, 201, p1, ok, 2)}, true, refund},
		{"a refund's key reused, never expiring", []op{ans(0, 10, 201, p1, ok, 2), problem(20, 30, 422, "idempotency_key_reused")}, false, refund},
		{"a refund's expired key names it for good", []op{ans(0, 10, 201, p1, ok, 2), problem(20, 30, 422, "idempotency_key_reused"), problem(40, 50, 422, "idempotency_key_reused")}, true, expiringRefund},
		{"a refund's expired key, though no answer showed it finished", []op{ans(0, 10, 202, p1, processing, 1), problem(20, 30, 422, "idempotency_key_reused")}, true, expiringRefund},
		{"a refund in flight after its key expired", []op{problem(0, 10, 422, "idempotency_key_reused"), ans(20, 30, 202, p1, processing, 1)}, false, expiringRefund},
		{"a refund replayed after its key expired", []op{ans(0, 10, 201, p1, ok, 2), problem(20, 30, 422, "idempotency_key_reused"), ans(40, 50, 201, p1, ok, 2)}, false, expiringRefund},
		{"a second refund under an expired key", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 201, p2, ok, 2)}, false, expiringRefund},
		{"an expired key: the invoice names its payment", []op{ans(0, 10, 201, p1, ok, 2), dup(20, 30, p1), dup(40, 50, p1)}, true, expiring},
		{"an expired key: the invoice names another payment", []op{ans(0, 10, 201, p1, ok, 2), dup(20, 30, p2)}, false, expiring},
		{"an expired key pays again after a failure", []op{ans(0, 10, 402, p1, failed, 3), ans(20, 30, 201, p2, ok, 2), ans(40, 50, 201, p2, ok, 2)}, true, expiring},
		{"an expired key's second payment, whose first answer was lost", []op{ans(0, 10, 402, p1, failed, 3), none(20, 30), replayed(ans(40, 50, 201, p2, ok, 2))}, true, expiring},
		{"the invoice names an expired key's second payment", []op{ans(0, 10, 402, p1, failed, 3), none(20, 30), dup(40, 50, p2)}, true, expiring},
		{"the invoice names a payment, which then ends failed", []op{ans(0, 10, 202, p1, processing, 1), dup(20, 30, p1), lookup(40, 50, p1, failed)}, false, expiring},
		{"an expired key pays again after a success", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 201, p2, ok, 2)}, false, expiring},
		{"an expired key, though no answer showed the payment finished", []op{ans(0, 10, 202, p1, processing, 1), dup(20, 30, p1)}, true, expiring},
		{"a failed payment named by its invoice", []op{ans(0, 10, 402, p1, failed, 3), dup(20, 30, p1)}, false, expiring},
		{"in flight after its key expired", []op{ans(0, 10, 202, p1, processing, 1), dup(20, 30, p1), ans(40, 50, 202, p1, processing, 1)}, false, expiring},
		// A manual payment's key: answered when authorized; lookups show it captured or canceled later.
		{"manual: authorized, replayed, found captured", []op{ans(0, 10, 201, p1, held, 4), ans(20, 30, 201, p1, held, 4), lookup(40, 50, p1, ok)}, true, manual},
		{"manual: in flight, authorized, its capture unknown, then canceled", []op{ans(0, 10, 202, p1, processing, 1), ans(20, 30, 201, p1, held, 4),
			lookup(40, 50, p1, unknown), lookup(60, 70, p1, canceled), ans(80, 90, 201, p1, held, 4)}, true, manual},
		{"manual: found canceled, then replayed as authorized", []op{none(0, 10), lookup(20, 30, p1, canceled), ans(40, 50, 201, p1, held, 4)}, true, manual},
		{"manual: declined", []op{ans(0, 10, 402, p1, failed, 3), lookup(20, 30, p1, failed)}, true, manual},
		{"manual: a replay shows the capture", []op{ans(0, 10, 201, p1, held, 4), ans(20, 30, 201, p1, ok, 2)}, false, manual},
		{"manual: captured, then canceled", []op{ans(0, 10, 201, p1, held, 4), lookup(20, 30, p1, ok), lookup(40, 50, p1, canceled)}, false, manual},
		{"manual: waiting again after its capture", []op{lookup(0, 10, p1, ok), lookup(20, 30, p1, held)}, false, manual},
		{"manual: authorized after it failed", []op{ans(0, 10, 402, p1, failed, 3), lookup(20, 30, p1, held)}, false, manual},
		{"manual: in flight after it was authorized", []op{ans(0, 10, 201, p1, held, 4), ans(20, 30, 202, p1, processing, 1)}, false, manual},
		{"manual, expiring: the invoice names the authorized payment", []op{ans(0, 10, 201, p1, held, 4), dup(20, 30, p1), lookup(40, 50, p1, ok)}, true, manualExpiring},
		{"manual, expiring: pays again once canceled", []op{ans(0, 10, 201, p1, held, 4), lookup(20, 30, p1, canceled), ans(40, 50, 201, p2, held, 4)}, true, manualExpiring},
		{"manual, expiring: pays again once captured", []op{ans(0, 10, 201, p1, held, 4), lookup(20, 30, p1, ok), ans(40, 50, 201, p2, held, 4)}, false, manualExpiring},
		// A capture's and a cancel's keys.
		{"capture: in flight, unknown, then captured and replayed", []op{ans(0, 10, 202, p1, held, 4), ans(20, 30, 202, p1, unknown, 1),
			ans(40, 50, 201, p1, ok, 2), replayed(ans(60, 70, 201, p1, ok, 2))}, true, capture},
		{"capture: the bank refused it", []op{ans(0, 10, 402, p1, canceled, 5), ans(20, 30, 402, p1, canceled, 5)}, true, capture},
		{"capture: refused, the payment no longer waiting, twice", []op{problem(0, 10, 409, "payment_not_capturable"), problem(20, 30, 409, "payment_not_capturable")}, true, capture},
		{"capture: in use while a duplicate runs", []op{ans(0, 30, 201, p1, ok, 2), problem(10, 20, 409, "idempotency_key_in_use")}, true, capture},
		{"capture: refused after it was taken", []op{ans(0, 10, 202, p1, held, 4), problem(20, 30, 409, "payment_not_capturable")}, false, capture},
		{"capture: refused after it succeeded", []op{ans(0, 10, 201, p1, ok, 2), problem(20, 30, 409, "payment_not_capturable")}, false, capture},
		{"capture: succeeded, then declined", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 402, p1, canceled, 5)}, false, capture},
		{"capture: 201 for a canceled payment", []op{ans(0, 10, 201, p1, canceled, 5)}, false, capture},
		{"capture: a replay of other bytes", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 201, p1, ok, 9)}, false, capture},
		{"capture: answered for another payment", []op{ans(0, 10, 202, p1, held, 4), ans(20, 30, 201, p2, ok, 2)}, false, capture},
		{"capture: the cancel's refusal", []op{problem(0, 10, 409, "payment_not_cancelable")}, false, capture},
		{"cancel: canceled, replayed", []op{none(0, 10), ans(20, 30, 200, p1, canceled, 5), replayed(ans(40, 50, 200, p1, canceled, 5))}, true, cancel},
		{"cancel: refused, the payment had expired", []op{problem(0, 10, 409, "payment_not_cancelable")}, true, cancel},
		{"cancel: 201", []op{ans(0, 10, 201, p1, canceled, 5)}, false, cancel},
		{"cancel: another request under the key", []op{req(ans(0, 10, 200, p1, canceled, 5), "a"), req(problem(20, 30, 422, "idempotency_key_reused"), "b")}, true,
			keyKind{command: payment.CommandCancel, request: "a"}},
		// What a real bug answers, one row each: none may be explained.
		{"201 after the key's first answer was 402", []op{ans(0, 10, 402, p1, failed, 3), ans(20, 30, 201, p1, ok, 2)}, false, keyKind{}},
		{"a retry answered another payment while the first was in flight", []op{ans(0, 10, 202, p1, processing, 1), ans(20, 30, 201, p2, ok, 2)}, false, keyKind{}},
		{"a retry after no answer answered another payment than a lookup found", []op{none(0, 10), lookup(20, 30, p1, processing), ans(40, 50, 201, p2, ok, 2)}, false, keyKind{}},
		{"found failed after its 201", []op{ans(0, 10, 201, p1, ok, 2), lookup(20, 30, p1, failed)}, false, keyKind{}},
		{"unknown again after its final answer", []op{ans(0, 10, 202, p1, unknown, 1), ans(20, 30, 402, p1, failed, 3), lookup(40, 50, p1, unknown)}, false, keyKind{}},
		{"422 for the key's own request", []op{req(ans(0, 10, 201, p1, ok, 2), "a"), req(problem(20, 30, 422, "idempotency_key_reused"), "a")}, false, keyKind{request: "a"}},
		{"an expired key pays again, its first payment answered succeeded in between", []op{ans(0, 10, 202, p1, processing, 1), lookup(20, 30, p1, ok), ans(40, 50, 201, p2, ok, 2)}, false, expiring},
		{"an expired key answered a failed payment after its success", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 402, p2, failed, 3)}, false, expiring},
		{"a refund key's second refund", []op{ans(0, 10, 201, p1, ok, 2), ans(20, 30, 201, p2, ok, 2)}, false, refund},
		{"a refund that failed, then succeeded", []op{ans(0, 10, 402, p1, failed, 3), ans(20, 30, 201, p1, ok, 2)}, false, refund},
		{"manual: canceled, then captured", []op{ans(0, 10, 201, p1, held, 4), lookup(20, 30, p1, canceled), lookup(40, 50, p1, ok)}, false, manual},
		{"manual: declined, then found captured", []op{ans(0, 10, 402, p1, failed, 3), lookup(20, 30, p1, ok)}, false, manual},
		{"capture: refused by the bank, then captured", []op{ans(0, 10, 402, p1, canceled, 5), ans(20, 30, 201, p1, ok, 2)}, false, capture},
		{"cancel: canceled, then refused", []op{ans(0, 10, 200, p1, canceled, 5), problem(20, 30, 409, "payment_not_cancelable")}, false, cancel},
		{"cancel: answered for another payment", []op{ans(0, 10, 200, p1, canceled, 5), ans(20, 30, 200, p2, canceled, 5)}, false, cancel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, linearizable(tc.kind, tc.history), "\n%s", describe(tc.history))
		})
	}
}

// A violation shows the fewest requests that contradict each other: here the in-use answer after
// the final one, not the lookups and replays around them.
func TestShrink(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	final := op{Call: at(0), Return: at(10), Status: 201, Payment: "p1", Resource: payment.StatusSucceeded, Body: "b"}
	replay := final
	replay.Call, replay.Return, replay.Replayed = at(20), at(30), true
	found := op{Lookup: true, Call: at(40), Return: at(50), Status: 200, Payment: "p1", Resource: payment.StatusSucceeded}
	inUse := op{Call: at(60), Return: at(70), Status: 409, Code: "idempotency_key_in_use"}
	late := replay
	late.Call, late.Return = at(80), at(90)
	h := []op{final, replay, found, inUse, late}
	require.False(t, linearizable(keyKind{}, h))
	small := shrink(keyKind{}, h)
	require.Len(t, small, 2, "\n%s", describe(small))
	require.False(t, linearizable(keyKind{}, small))
	require.Equal(t, inUse, small[1])
}

// A failed run writes every key's requests, the verdict and the command that replays it beside
// its report; a clean one writes no history.
func TestFailedReportWritesItsHistory(t *testing.T) {
	dir := t.TempDir()
	o := Options{Seed: 42, Duration: 3 * time.Minute, Rate: 5, Shape: ShapeDev, Capability: "none", Kinds: []Kind{KillWorker, BankFault}}
	clean := &Report{Started: time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC), Shape: ShapeDev, Replay: o.replay()}
	require.NoError(t, clean.write(dir))
	require.NoFileExists(t, clean.HistoryFile(dir))

	failed := &Report{Started: time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC), Shape: ShapeDev, Replay: o.replay(), Violations: 1,
		Checks:    []Check{{Name: "every idempotency key has exactly one outcome", Violations: 1}},
		histories: map[string][]op{"k-1": {{Status: 409, Code: "idempotency_key_in_use", Body: "ab"}}}}
	require.NoError(t, failed.write(dir))
	require.Equal(t, filepath.Join(dir, "soak-2026-12-05-dev-history.json"), failed.HistoryFile(dir))
	b, err := os.ReadFile(failed.HistoryFile(dir))
	require.NoError(t, err)
	var got struct {
		Replay  string
		Verdict []Check
		Keys    map[string][]op
	}
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, "kasa soak --seed 42 --duration 3m0s --rate 5 --shape dev --capability none --retention 0s --faults kill_worker,bank_fault", got.Replay)
	require.Equal(t, failed.Checks, got.Verdict)
	require.Equal(t, "idempotency_key_in_use", got.Keys["k-1"][0].Code)
}

// A split worker that polled is a violation; refused ones are fine.
func TestCheckSplits(t *testing.T) {
	s := &stack{}
	s.splits.tried = 2
	s.splits.polled = []string{"at 0:12.1: a worker with capability idempotent polled beside none ones"}
	c := s.checkSplits()
	require.False(t, c.OK)
	require.Equal(t, 2, c.Checked)
	require.Equal(t, 1, c.Violations)
	require.Equal(t, "none", otherCapability("idempotent"))
	require.Equal(t, "idempotent", otherCapability("none"))
}

// A second run on the same day and shape keeps the first's report: it writes beside it, as
// -2, and says where.
func TestReportKeepsAnEarlierOne(t *testing.T) {
	dir := t.TempDir()
	day := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	first := &Report{Started: day, Shape: ShapeCluster, Seed: 1}
	require.NoError(t, first.write(dir))
	second := &Report{Started: day, Shape: ShapeCluster, Seed: 2, Violations: 1,
		histories: map[string][]op{"k-1": {{Status: 409}}}}
	require.NoError(t, second.write(dir))
	b, err := os.ReadFile(filepath.Join(dir, "soak-2026-12-05-cluster.json"))
	require.NoError(t, err)
	require.Contains(t, string(b), `"seed": 1`, "the first report is kept")
	b, err = os.ReadFile(filepath.Join(dir, "soak-2026-12-05-cluster-2.json"))
	require.NoError(t, err)
	require.Contains(t, string(b), `"seed": 2`)
	require.FileExists(t, filepath.Join(dir, "soak-2026-12-05-cluster-2.md"))
	require.Equal(t, filepath.Join(dir, "soak-2026-12-05-cluster-2-history.json"), second.HistoryFile(dir))
	require.FileExists(t, second.HistoryFile(dir))
}
