package soak

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/devenv"
)

// paid is one payment or refund as the soak last saw it.
type paid struct {
	id         string
	res        resource
	key        *keyRecord
	viaUnknown bool
}

// refund says whether p is a refund.
func (p *paid) refund() bool { return p.key.Of != nil }

// kind is "payment" or "refund".
func (p *paid) kind() string {
	if p.refund() {
		return "refund"
	}
	return "payment"
}

// what names p in a violation: "payment <id>" or "refund <id>".
func (p *paid) what() string { return p.kind() + " " + p.id }

// path is where the API answers p.
func (p *paid) path() string { return "/v1/" + p.kind() + "s/" + p.id }

// paidMinor is the money p moved once it succeeded (a manual payment's: what it captured), else 0.
func (p *paid) paidMinor() int64 {
	switch {
	case p.res.Status != payment.StatusSucceeded:
		return 0
	case p.key.manual:
		captured, _ := signedAmount(p.res.AmountCaptured, "TRY")
		return captured
	}
	return p.key.Amount
}

// eventType is the type of the event a payment's or refund's state change sends (docs/webhooks.md):
// "payment.<status>" or "refund.<status>", except a manual payment's capture, payment.captured.
func eventType(r resource) string {
	switch {
	case r.PaymentID != "":
		return "refund." + string(r.Status)
	case r.Capture == payment.CaptureManual && r.Status == payment.StatusSucceeded:
		return "payment.captured"
	}
	return "payment." + string(r.Status)
}

// done: p is final (succeeded, failed, or a manual payment canceled).
func (p *paid) done() bool { return p.res.Status.Final() }

// left: p is no longer processing (final, unknown, or a manual payment authorized).
func (p *paid) left() bool { return p.res.Status != payment.StatusProcessing }

// settled is every payment and refund of the soak's keys, by id.
type settled struct {
	payments map[string]*paid
	days     []string      // the UTC days the soak ran on: the settlement files it imports
	live     time.Duration // from the faults' end until none was processing, or liveBound
	stuck    []*paid       // still processing liveBound after the faults' end
	refusals *Check        // settlements sent to payments that were not unknown (probeSettlements)
}

// liveBound is how long after the faults end every payment and refund must have left processing:
// the charge budget (20 s) and its steps' retries, with room for a server that restarted last.
const liveBound = 90 * time.Second

// settle brings every payment and refund to an end: it learns what each key whose client never
// heard back made (a payment's by its key, a refund's by sending it once more), waits until none
// is processing, imports the settlement file for the unknown ones and waits until those settle
// too. Each wait is bounded by Options.Settle.
func (s *stack) settle(ctx context.Context, ld *load, started, healed time.Time, rep *Report) (*settled, error) {
	st := &settled{payments: map[string]*paid{}}
	for d := started.UTC().Truncate(24 * time.Hour); !d.After(time.Now().UTC()); d = d.Add(24 * time.Hour) {
		st.days = append(st.days, d.Format(time.DateOnly))
	}
	var unanswered []*keyRecord // refund keys that learned no refund
	// Liveness counts from the faults' end, or from the last key's start if later (a refund
	// waits for its payment).
	live := healed
	for _, k := range ld.snapshot() {
		if k.command != "" {
			// A capture or cancel, added after its payment's key: its payment went unknown if
			// the command did.
			k.mu.Lock()
			unknown := k.sawUnknown
			k.mu.Unlock()
			if p := st.payments[k.Target.id()]; p != nil && unknown {
				p.viaUnknown = true
			}
			continue
		}
		k.mu.Lock()
		if len(k.history) > 0 && k.history[0].Call.After(live) {
			live = k.history[0].Call
		}
		k.mu.Unlock()
		switch {
		case k.Of != nil && !k.accepted():
			call := time.Now()
			r, err := s.api.replay(k)
			if accepted, _ := k.record(call, r, err); !accepted {
				unanswered = append(unanswered, k)
				continue
			}
		case k.Of == nil && (!k.accepted() || k.expires):
			// An expiring key may have paid again unseen: the lookup finds the newest payment.
			accepted := k.accepted()
			p, ok, err := s.lookup(k)
			if err != nil {
				return nil, err
			}
			if ok && !accepted {
				rep.LearnedByKey++
			}
			if ok {
				k.mu.Lock()
				k.ID, k.ids[p.ID] = cmp.Or(k.ID, p.ID), true
				k.mu.Unlock()
			}
		}
		k.mu.Lock()
		for id := range k.ids {
			st.payments[id] = &paid{id: id, key: k, viaUnknown: k.sawUnknown}
		}
		k.mu.Unlock()
	}
	s.findRefunds(st, unanswered)

	// One bound for the whole settling: a payment still unfinished at its end is a violation.
	deadline := time.Now().Add(s.o.Settle)
	if err := s.poll(ctx, st, earliest(deadline, live.Add(liveBound)), (*paid).left); err != nil {
		return nil, err
	}
	st.live = time.Since(healed)
	st.stuck = slices.DeleteFunc(slices.Collect(maps.Values(st.payments)), (*paid).left)
	if err := s.poll(ctx, st, deadline, (*paid).left); err != nil {
		return nil, err
	}
	// Unknown payments wait for the settlement file; kasa releases an unlisted one only once it is
	// older than the booking window, so the import is repeated. Authorizations expire meanwhile.
	for st.has(payment.StatusUnknown, payment.StatusRequiresCapture) && time.Now().Before(deadline) {
		for _, day := range st.days {
			if !st.has(payment.StatusUnknown) {
				break
			}
			run, err := s.reconcile(ctx, day)
			if err != nil {
				return nil, err
			}
			rep.Reconciles = append(rep.Reconciles, run)
		}
		if err := s.settleAuthorizations(ctx, st); err != nil {
			return nil, err
		}
		if err := s.probeSettlements(ctx, st); err != nil {
			return nil, err
		}
		if err := s.poll(ctx, st, earliest(deadline, time.Now().Add(10*time.Second)), (*paid).done); err != nil {
			return nil, err
		}
	}
	if err := s.poll(ctx, st, deadline, (*paid).done); err != nil {
		return nil, err
	}
	s.finalReads(ld.snapshot())
	return st, nil
}

// lookup is GET /v1/payments?idempotency_key= for a payment key, recorded in its history.
func (s *stack) lookup(k *keyRecord) (resource, bool, error) {
	call := time.Now()
	p, ok, err := s.api.resource(k.Merchant.APIKey, "/v1/payments?idempotency_key="+k.Key)
	if err != nil {
		return p, false, fmt.Errorf("look up key %s: %w", k.Key, err)
	}
	k.add(lookupOf(call, p.Resource, ok))
	return p, ok, nil
}

// finalReads adds to every key's history a read of what it made once everything settled (by key
// for a payment, by id for a refund), against which an earlier answer may show wrong.
func (s *stack) finalReads(keys []*keyRecord) {
	inParallel(keys, func(k *keyRecord) {
		if k.command != "" {
			return // its payment's key reads the payment
		}
		if k.Of == nil {
			_, _, _ = s.lookup(k)
			return
		}
		if id := k.id(); id != "" {
			call := time.Now()
			if r, ok, err := s.api.resource(k.Merchant.APIKey, "/v1/refunds/"+id); err == nil && ok {
				k.add(lookupOf(call, r.Resource, true))
			}
		}
	})
}

// findRefunds finds the refunds of keys whose every answer was lost and whose record then
// expired: one of its payment's refunds of its amount that no other key names. A key left
// without one is checked as never answered.
func (s *stack) findRefunds(st *settled, keys []*keyRecord) {
	for _, k := range keys {
		var page struct{ Data []resource }
		if found, err := s.api.get(k.Merchant.APIKey, s.api.base+"/v1/payments/"+k.Of.id()+"/refunds?limit=100", &page); !found || err != nil {
			continue
		}
		for _, rf := range page.Data {
			if _, named := st.payments[rf.ID]; !named && rf.Amount == payment.FormatAmount(k.Amount, "TRY") {
				k.mu.Lock()
				k.ID, k.ids[rf.ID] = rf.ID, true
				k.mu.Unlock()
				st.payments[rf.ID] = &paid{id: rf.ID, key: k}
				break
			}
		}
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// has says whether a payment or refund has one of statuses.
func (st *settled) has(statuses ...payment.Status) bool {
	for _, p := range st.payments {
		if slices.Contains(statuses, p.res.Status) {
			return true
		}
	}
	return false
}

// poll reads the payments, each at least once and until it satisfies ok, until the deadline.
func (s *stack) poll(ctx context.Context, st *settled, deadline time.Time, ok func(*paid) bool) error {
	for todo := slices.Collect(maps.Values(st.payments)); ; {
		s.refresh(todo)
		if todo = slices.DeleteFunc(todo, ok); len(todo) == 0 || time.Now().After(deadline) {
			return nil
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// refresh reads each payment's current state, eight at a time; a failed read keeps the last one.
func (s *stack) refresh(ps []*paid) {
	inParallel(ps, func(p *paid) {
		if r, found, err := s.api.resource(p.key.Merchant.APIKey, p.path()); err == nil && found {
			p.res = r
			p.viaUnknown = p.viaUnknown || r.Status == payment.StatusUnknown
		}
	})
}

// ReconcileRun is one `kasa reconcile` of a settlement file.
type ReconcileRun struct {
	Day    string `json:"day"`
	Exit   int    `json:"exit"`
	Output string `json:"output"`
}

// reconcile fetches the bank's settlement file of day and imports it with `kasa reconcile`.
func (s *stack) reconcile(ctx context.Context, day string) (ReconcileRun, error) {
	run := ReconcileRun{Day: day}
	r, err := s.api.call("GET", s.api.sim+"/v1/settlements/"+day+".csv", "", nil)
	if err == nil && r.status != 200 {
		err = fmt.Errorf("%d %s", r.status, r.body)
	}
	if err != nil {
		return run, fmt.Errorf("settlement file %s: %w", day, err)
	}
	file := filepath.Join(s.dir, "settlement-"+day+".csv")
	if err := os.WriteFile(file, r.body, 0o644); err != nil {
		return run, err
	}
	out, err := s.tool(ctx, "reconcile", "--date", day, file)
	run.Output = strings.TrimSpace(out)
	if exit, ok := errors.AsType[*exec.ExitError](err); ok {
		run.Exit = exit.ExitCode()
	} else if err != nil {
		return run, err
	}
	return run, nil
}

// settleAuthorizations settles by hand, as docs/reconciliation.md says, each manual payment whose
// authorization went unknown at a bank without inquiry (no settlement file lists authorizations).
func (s *stack) settleAuthorizations(ctx context.Context, st *settled) error {
	if s.o.Capability != "none" { // with inquiry the workflow asks the bank itself
		return nil
	}
	for _, p := range st.payments {
		if p.refund() || p.res.Status != payment.StatusUnknown || p.res.Capture != payment.CaptureManual || p.res.ProviderReference != nil {
			continue
		}
		held, err := s.api.bank().Authorizations(ctx, p.id)
		if err != nil {
			return err
		}
		if held.Pending > 0 {
			continue // the bank books it later: ask again
		}
		input := fmt.Sprintf(`{"outcome":"not_charged","operation_id":%q,"note":"soak: the bank holds no authorization"}`, p.id)
		if len(held.Live) > 0 {
			input = fmt.Sprintf(`{"outcome":"charged","provider_reference":%q,"operation_id":%q,"note":"soak: the bank holds it"}`, held.Live[0], p.id)
		}
		if _, err := s.settleByHand(ctx, p, input, "settled authorization of payment %s by hand"); errors.Is(err, errNoCLI) {
			return err
		}
	}
	return nil
}

// probeSettlements sends, once, a settlement to up to three manual payments left to wait for
// their capture_before: a payment that is not unknown refuses it (docs/reconciliation.md).
func (s *stack) probeSettlements(ctx context.Context, st *settled) error {
	if st.refusals != nil {
		return nil
	}
	c := &Check{Name: refusalsName}
	st.refusals = c
	for _, p := range sortedPayments(st) {
		if c.Checked == 3 {
			break
		}
		before, err := time.Parse(time.RFC3339Nano, p.res.CaptureBefore)
		if p.refund() || !p.key.manual || p.key.next != "" || p.res.Status != payment.StatusRequiresCapture ||
			err != nil || time.Until(before) < 5*time.Second { // its workflow still runs, waiting
			continue
		}
		c.Checked++
		input := fmt.Sprintf(`{"outcome":"not_charged","operation_id":%q,"note":"soak: must be refused"}`, p.id)
		out, err := s.settleByHand(ctx, p, input, "a settlement of payment %s, which waits for its capture")
		if errors.Is(err, errNoCLI) {
			return err
		}
		if err == nil {
			c.fail("payment %s (requires_capture): a not_charged settlement was taken: %s", p.id, out)
		}
	}
	*c = c.done()
	return nil
}

const refusalsName = "a settlement of a payment that is not unknown is refused"

// errNoCLI: the Temporal CLI an operator settles with is not found.
var errNoCLI = errors.New("soak: no Temporal CLI")

// settleByHand sends p's workflow the settle update with input through the Temporal CLI, as
// docs/reconciliation.md tells an operator to, and logs how it went.
func (s *stack) settleByHand(ctx context.Context, p *paid, input, what string) (string, error) {
	cli, err := devenv.FindTemporalCLI()
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoCLI, err)
	}
	out, err := devenv.Command{Dir: s.dir}.Run(ctx, cli, "workflow", "update", "execute", "--address", s.tmpAddr,
		"--workflow-id", "payment/"+p.key.Merchant.ID+"/"+p.key.Key, "--name", "settle", "--input", input)
	out = strings.TrimSpace(out)
	s.log.Printf(what+": %s %v", p.id, out, err)
	return out, err
}
