package soak

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kasa-pay/kasa/payment"
)

// Check is one invariant's result: OK when nothing violated it.
type Check struct {
	Name       string   `json:"name"`
	OK         bool     `json:"ok"`
	Checked    int      `json:"checked"`    // how many things it looked at
	Violations int      `json:"violations"` // how many broke it
	Examples   []string `json:"examples,omitempty"`
}

const maxExamples = 20

func (c *Check) fail(format string, args ...any) {
	c.Violations++
	if len(c.Examples) < maxExamples {
		c.Examples = append(c.Examples, fmt.Sprintf(format, args...))
	}
}

// done is the check with OK set: nothing violated it.
func (c Check) done() Check {
	c.OK = c.Violations == 0
	return c
}

// check runs every invariant over the settled payments and adds the results to rep.
func (s *stack) check(ctx context.Context, ld *load, st *settled, rep *Report) {
	keys := ld.snapshot()
	rep.Checks = append(rep.Checks,
		s.checkKeys(keys, st),
		checkLive(st),
		s.checkSettled(st),
		s.checkBank(st),
		s.checkVerify(ctx),
		s.checkReconcile(ctx, st, rep),
		s.checkHolds(ld.merchants, st),
		checkRefunded(st),
		s.balances.result(),
		s.verifies.result(),
		s.checkWebhooks(ctx, st), // before the expiries': it waits for the events
	)
	captures, above := s.checkManual(keys, st)
	rep.Checks = append(rep.Checks, captures, above, checkExpiries(st, s.hook.byPayment()), s.checkOpen(st))
	// Two checks run only when the run gave them something to look at; when it did not, the
	// report says so rather than leave them out unseen.
	if s.splits.tried > 0 {
		rep.Checks = append(rep.Checks, s.checkSplits())
	} else if slices.ContainsFunc(rep.Plan, func(f Fault) bool { return f.Kind == SettingsSplit }) {
		rep.Unchecked = append(rep.Unchecked, splitsName+": no settings_split fault started its worker")
	}
	if st.refusals != nil && st.refusals.Checked > 0 {
		rep.Checks = append(rep.Checks, *st.refusals)
	} else {
		rep.Unchecked = append(rep.Unchecked, refusalsName+": no manual payment was left waiting for its capture_before while settling")
	}
	for _, c := range rep.Checks {
		rep.Violations += c.Violations
	}
}

// checkKeys: every key has exactly one outcome: one payment answered, never an answer a retry
// must not get, and a replay now answers the same payment with its final status.
func (s *stack) checkKeys(keys []*keyRecord, st *settled) Check {
	c := Check{Name: "every idempotency key has exactly one outcome"}
	var mu sync.Mutex
	inParallel(keys, func(k *keyRecord) {
		problems := replayProblems(s.api, k, st)
		mu.Lock()
		defer mu.Unlock()
		c.Checked++
		for _, p := range problems {
			c.fail("key %s: %s", k.Key, p)
		}
	})
	return c.done()
}

func replayProblems(a *api, k *keyRecord, st *settled) (out []string) {
	k.mu.Lock()
	id, ids, unexpected := k.ID, len(k.ids), slices.Clone(k.unexpected)
	k.mu.Unlock()
	defer func() { // one problem a key: the history is looked at when nothing else is wrong
		k.mu.Lock()
		defer k.mu.Unlock()
		if len(out) == 0 && !linearizable(k.kind(), k.history) {
			small := shrink(k.kind(), k.history)
			out = append(out, fmt.Sprintf("no order of its requests explains the answers (docs/tools.md, \"Chaos soak\"); these %d of its %d contradict:\n%s",
				len(small), len(k.history), describe(small)))
		}
	}()
	for _, u := range unexpected {
		out = append(out, "unexpected answer: "+u)
	}
	if ids > 1 && !k.expires {
		out = append(out, fmt.Sprintf("answered %d different payments", ids))
	}
	if k.command != "" {
		return append(out, commandProblems(a, k, st)...)
	}
	out = append(out, earlierPaymentsFailed(k, st)...)
	if id == "" {
		return append(out, "never answered with a payment, and none exists for it")
	}
	p := st.payments[id]
	if k.expires && !p.refund() && (p.res.Status == payment.StatusFailed || p.res.Status == payment.StatusCanceled) {
		return out // its record may be gone: a replay would be a new payment
	}
	call := time.Now()
	r, err := a.replay(k)
	o := k.note(opOf(call, r, err))
	if err != nil {
		return append(out, "replay: "+err.Error())
	}
	// A payment or refund left unfinished (reported by the settled check) is replayed as 202; a
	// manual payment as it was answered when authorized.
	answered := p.answered()
	want := k.kind().answerStatus(answered)
	if want == 0 {
		want = http.StatusAccepted
	}
	switch {
	case k.expires && p.refund() && o.Code == "idempotency_key_reused",
		k.expires && !p.refund() && o.Code == "duplicate_payment" && o.Payment == id:
		// the record is gone, and the key still names its refund, or the invoice its payment
	case want == http.StatusAccepted && r.status == want:
		if o.Payment != id {
			out = append(out, fmt.Sprintf("replay answered %s, want %s", o.Payment, id))
		}
	case r.status != want:
		out = append(out, fmt.Sprintf("replay answered %d, want %d for a %s %s: %.200s", r.status, want, answered, p.what(), r.body))
	case !o.Replayed:
		out = append(out, "replay without Idempotent-Replayed: true")
	case o.Payment != id || o.Resource != answered:
		out = append(out, fmt.Sprintf("replay answered %s %s, want %s %s", o.Payment, o.Resource, id, answered))
	}
	return out
}

// earlierPaymentsFailed: a key whose record expired pays again only after its payment failed
// (or, a manual one, was canceled), so every payment of a key but the newest ended so.
func earlierPaymentsFailed(k *keyRecord, st *settled) (out []string) {
	k.mu.Lock()
	var ids []string
	for id := range k.ids {
		if st.payments[id] != nil {
			ids = append(ids, id)
		}
	}
	k.mu.Unlock()
	if len(ids) < 2 || k.Of != nil {
		return nil
	}
	slices.SortFunc(ids, func(a, b string) int {
		return strings.Compare(st.payments[a].res.CreatedAt, st.payments[b].res.CreatedAt)
	})
	for _, id := range ids[:len(ids)-1] {
		if p := st.payments[id]; p.res.Status != payment.StatusFailed && p.res.Status != payment.StatusCanceled {
			out = append(out, fmt.Sprintf("paid again while its payment %s was %s", id, p.res.Status))
		}
	}
	return out
}

// checkSettled: no payment or refund is left processing, unknown or (a manual payment)
// requires_capture once everything has settled.
func (s *stack) checkSettled(st *settled) Check {
	c := Check{Name: "every payment and refund reached a final status"}
	for _, p := range sortedPayments(st) {
		c.Checked++
		if !p.done() {
			c.fail("%s (key %s) is %s", p.what(), p.key.Key, p.res.Status)
		}
	}
	return c.done()
}

// checkLive: once the faults are over, every payment and refund leaves processing, for its final
// status or unknown, within liveBound.
func checkLive(st *settled) Check {
	c := Check{Name: fmt.Sprintf("every payment and refund left processing within %s of the faults' end", liveBound), Checked: len(st.payments)}
	for _, p := range st.stuck {
		c.fail("%s (key %s) was still processing", p.what(), p.key.Key)
	}
	return c.done()
}

// checkBank: the bank moved money exactly once for each succeeded automatic payment or refund
// (a late booking to come counts), never for a failed one nor a reference none of theirs.
func (s *stack) checkBank(st *settled) Check {
	c := Check{Name: "the bank moved money once per succeeded payment or refund, never otherwise"}
	var mu sync.Mutex
	automatic := slices.DeleteFunc(sortedPayments(st), func(p *paid) bool { return p.key.manual })
	inParallel(automatic, func(p *paid) {
		moved, err := s.api.bank().Charges(context.Background(), p.id)
		if p.refund() {
			moved, err = s.api.bank().Refunds(context.Background(), p.id)
		}
		n := moved.Count + moved.Pending
		mu.Lock()
		defer mu.Unlock()
		c.Checked++
		switch {
		case err != nil:
			c.fail("%s: %v", p.what(), err)
		case n > 1:
			c.fail("%s (%s): money moved %d times", p.what(), p.res.Status, n)
		case p.res.Status == payment.StatusSucceeded && n != 1:
			c.fail("succeeded %s: money moved %d times", p.what(), n)
		case p.res.Status == payment.StatusSucceeded && len(moved.Succeeded) == 1 && // not a booking still to come
			(p.res.ProviderReference == nil || *p.res.ProviderReference != moved.Succeeded[0]):
			c.fail("succeeded %s names %v at the bank, the bank's is %s", p.what(), deref(p.res.ProviderReference), moved.Succeeded[0])
		case p.res.Status == payment.StatusFailed && n != 0:
			c.fail("failed %s (%s): the bank moved its money", p.what(), deref(p.res.FailureCode))
		}
	})
	// Money moved for a reference of no payment or refund of the soak is money kasa lost track of.
	for _, all := range []struct {
		what string
		list func(context.Context) (map[string][]string, error)
	}{{"payment", s.api.bank().AllCharges}, {"refund", s.api.bank().AllRefunds}} {
		c.Checked++
		moved, err := all.list(context.Background())
		if err != nil {
			c.fail("every %s at the bank: %v", all.what, err)
			continue
		}
		for _, ref := range slices.Sorted(maps.Keys(moved)) {
			if p := st.payments[ref]; p == nil || p.kind() != all.what {
				c.fail("the bank moved money for %s (%v), which is no %s of the soak", ref, moved[ref], all.what)
			}
		}
	}
	return c.done()
}

// checkVerify runs `kasa verify`: the ledger and balance invariants.
func (s *stack) checkVerify(ctx context.Context) Check {
	c := Check{Name: "kasa verify is clean", Checked: 1}
	out, err := s.tool(ctx, "verify")
	if err != nil {
		for line := range strings.Lines(out) {
			if line = strings.TrimSpace(line); line != "" {
				c.fail("%s", line)
			}
		}
		if c.Violations == 0 {
			c.fail("kasa verify: %v", err)
		}
	}
	return c.done()
}

// checkReconcile: neither the imports that settled unknown payments nor one more of each
// settlement file, now that every payment is final, finds a mismatch.
func (s *stack) checkReconcile(ctx context.Context, st *settled, rep *Report) Check {
	c := Check{Name: "kasa reconcile finds no mismatch"}
	for _, run := range rep.Reconciles {
		c.Checked++
		if run.Exit != 0 {
			c.fail("settling unknowns, %s exited %d: %s", run.Day, run.Exit, lastLines(run.Output, 10))
		}
	}
	for _, day := range st.days {
		c.Checked++
		run, err := s.reconcile(ctx, day)
		switch {
		case err != nil:
			c.fail("%s: %v", day, err)
		case run.Exit != 0:
			c.fail("%s: exit %d: %s", day, run.Exit, lastLines(run.Output, 10))
		}
	}
	return c.done()
}

// checkHolds: no account keeps a reserved amount once every payment is final, and each balance
// is its deposit less what its payments paid, plus their succeeded refunds.
func (s *stack) checkHolds(merchants []*merchant, st *settled) Check {
	c := Check{Name: "no hold left; balances are deposits less succeeded payments plus succeeded refunds"}
	spent := map[string]int64{}
	for _, p := range st.payments {
		if p.refund() {
			spent[p.key.Account] -= p.paidMinor()
		} else {
			spent[p.key.Account] += p.paidMinor()
		}
	}
	for _, m := range merchants {
		for _, a := range m.Accounts {
			c.Checked++
			var acct struct{ Balance, Reserved string }
			switch found, err := s.api.get(m.APIKey, s.api.base+"/v1/accounts/"+a.ID, &acct); {
			case err != nil || !found:
				c.fail("account %s: %v", a.ID, cmp.Or(err, errors.New("not found")))
			case acct.Reserved != "0.00":
				c.fail("account %s: %s still reserved", a.ID, acct.Reserved)
			case acct.Balance != formatTRY(a.Deposit-spent[a.ID]):
				c.fail("account %s: balance %s, want %s (deposit %s less succeeded payments plus refunds)", a.ID, acct.Balance,
					formatTRY(a.Deposit-spent[a.ID]), formatTRY(a.Deposit))
			}
		}
	}
	return c.done()
}

// checkRefunded: each payment's amount_refunded is the sum of its succeeded refunds, never more
// than it paid.
func checkRefunded(st *settled) Check {
	c := Check{Name: "each payment's amount_refunded is the sum of its succeeded refunds, never more than it paid"}
	refunded := map[string]int64{}
	for _, p := range st.payments {
		if p.refund() {
			refunded[p.res.PaymentID] += p.paidMinor()
		}
	}
	for _, p := range sortedPayments(st) {
		if p.refund() || p.res.ID == "" { // never read: the settled check reports it
			continue
		}
		c.Checked++
		paid := p.paidMinor() // a failed or canceled one paid nothing: a refund of it is money from nowhere
		switch want := formatTRY(refunded[p.id]); {
		case refunded[p.id] > paid:
			c.fail("%s payment %s of %s paid %s, yet its succeeded refunds sum to %s (amount_refunded %s)", p.res.Status, p.id, p.res.Amount,
				formatTRY(paid), want, p.res.AmountRefunded)
		case p.res.AmountRefunded != want:
			c.fail("payment %s of %s: amount_refunded %s, its succeeded refunds sum to %s", p.id, p.res.Amount, p.res.AmountRefunded, want)
		}
	}
	return c.done()
}

// checkWebhooks waits (bounded) for each finished payment's and refund's final event, then checks
// that each state change's event arrived once, in order, none it never sends, nothing unknown to
// the soak, every delivery signed.
func (s *stack) checkWebhooks(ctx context.Context, st *settled) Check {
	c := Check{Name: "every state change reached the merchant's webhook exactly once"}
	final := func(events []event, p *paid) bool {
		return slices.ContainsFunc(events, func(e event) bool { return e.Type == eventType(p.res) })
	}
	payments := sortedPayments(st)
	for deadline := time.Now().Add(s.o.Settle); time.Now().Before(deadline) && ctx.Err() == nil; {
		got := s.hook.byPayment()
		if !slices.ContainsFunc(payments, func(p *paid) bool { return p.done() && !final(got[p.id], p) }) {
			break
		}
		_ = sleep(ctx, time.Second)
	}
	got := s.hook.byPayment()
	for _, p := range payments {
		c.Checked++
		events := got[p.id]
		types := map[string][]string{}
		for _, e := range events {
			types[change(e)] = append(types[change(e)], e.ID)
		}
		for typ, ids := range types {
			if len(ids) > 1 {
				slices.Sort(ids)
				c.fail("%s: %s arrived as %d different events %v", p.what(), typ, len(ids), ids)
			}
		}
		if !final(events, p) {
			c.fail("%s: its final event %s never arrived (got %v)", p.what(), eventType(p.res), slices.Sorted(maps.Keys(types)))
		} else if order := arrivalOrder(events); !inOrder(order) {
			c.fail("%s: its events arrived out of order: %v", p.what(), order)
		}
		// Each state change the soak saw p go through needs its event: unknown, or authorized.
		seen := func(t string) bool {
			return slices.ContainsFunc(slices.Collect(maps.Keys(types)), func(k string) bool { return strings.HasPrefix(k, t) })
		}
		missed := func(was, event string) {
			c.fail("%s: it was %s, but no %s event arrived (got %v)", p.what(), was, event, slices.Sorted(maps.Keys(types)))
		}
		if p.viaUnknown && !seen(p.kind()+".unknown") {
			missed("unknown", p.kind()+".unknown")
		}
		if p.key.manual && !p.refund() && (p.res.Status == payment.StatusSucceeded || p.res.Status == payment.StatusCanceled) &&
			!seen("payment.requires_capture") {
			missed("authorized", "payment.requires_capture")
		}
		for _, e := range events {
			if !slices.Contains(announced(p), e.Type) {
				c.fail("%s: an event %s, which kasa never sends for it (docs/webhooks.md)", p.what(), e.Type)
			}
			// What a payment moved does not change after its final event.
			if e.Type == eventType(p.res) && (e.Payment.Amount != p.res.Amount || e.Payment.Currency != p.res.Currency ||
				e.Payment.AmountCaptured != p.res.AmountCaptured) {
				c.fail("%s: its %s event says %s %s captured %q; it settled %s %s captured %q", p.what(), e.Type,
					e.Payment.Amount, e.Payment.Currency, e.Payment.AmountCaptured, p.res.Amount, p.res.Currency, p.res.AmountCaptured)
			}
		}
	}
	byInvoice := map[string]*keyRecord{}
	for _, p := range st.payments {
		if !p.refund() {
			byInvoice["inv-"+p.key.Key] = p.key
		}
	}
	for id, events := range got {
		if _, ok := st.payments[id]; ok {
			continue
		}
		// A payment no answer named may be an expired key's earlier attempt whose answers were
		// all lost; it must have failed without moving money (a success answers duplicate_payment).
		k := byInvoice[events[0].Payment.InvoiceID]
		c.Checked++
		switch moved, err := s.api.bank().Charges(ctx, id); {
		case k == nil || !k.expires || events[0].Payment.PaymentID != "":
			c.fail("events for %s, which no key of the soak made", id)
		case err != nil || moved.Count+moved.Pending > 0 || !slices.ContainsFunc(events, func(e event) bool { return e.Type == "payment.failed" }):
			c.fail("payment %s of key %s, which no answer named: want failed and never charged (%v)", id, k.Key, err)
		}
	}
	_, _, bad := s.hook.stats()
	for _, b := range bad {
		c.fail("%s", b)
	}
	return c.done()
}

// announced is the event types p's state changes send (docs/webhooks.md).
func announced(p *paid) []string {
	switch {
	case p.refund():
		return []string{"refund.unknown", "refund.succeeded", "refund.failed"}
	case p.key.manual:
		return []string{"payment.unknown", "payment.requires_capture", "payment.captured", "payment.canceled", "payment.failed"}
	}
	return []string{"payment.unknown", "payment.succeeded", "payment.failed"}
}

// arrivalOrder is a payment's event types in the order the first event of each arrived.
func arrivalOrder(events []event) []string {
	sorted := slices.SortedFunc(slices.Values(events), func(a, b event) int { return a.Arrived - b.Arrived })
	var types []string
	for _, e := range sorted {
		if !slices.Contains(types, e.Type) {
			types = append(types, e.Type)
		}
	}
	return types
}

// inOrder says whether an object's events came in an order its states can take
// (docs/webhooks.md, "Order"): nothing after a final event.
func inOrder(types []string) bool {
	for i, t := range types {
		_, status, _ := strings.Cut(t, ".")
		if (payment.Status(status).Final() || status == "captured") && i != len(types)-1 {
			return false
		}
	}
	return true
}

// change names the state change an event announces: its type, but a manual payment may go
// unknown twice, at its authorization and then at its capture or void.
func change(e event) string {
	if e.Type == "payment.unknown" && e.Payment.Capture == payment.CaptureManual && e.Payment.ProviderReference != nil {
		return "payment.unknown (capture or void)"
	}
	return e.Type
}

func sortedPayments(st *settled) []*paid {
	return slices.SortedFunc(maps.Values(st.payments), func(a, b *paid) int { return strings.Compare(a.id, b.id) })
}

func deref(s *string) string {
	if s == nil {
		return "none"
	}
	return *s
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// inParallel calls f on every item, eight at a time: each call is one request to a kasa
// process or the simulator.
func inParallel[T any](items []T, f func(T)) {
	var g errgroup.Group
	g.SetLimit(8)
	for _, it := range items {
		g.Go(func() error { f(it); return nil })
	}
	_ = g.Wait()
}
