package soak

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/kasa-pay/kasa/payment"
)

// The checks of manual payments (docs/api.md, "Authorize now, capture later"), beside those every
// payment gets.

// answered is the status p's key was answered with once p was decided: p's own, but a manual
// payment's requires_capture once the bank authorized it (whatever became of it since).
func (p *paid) answered() payment.Status {
	if p.key.manual && p.res.Status != payment.StatusFailed &&
		(p.res.Status.Answered() || p.res.ProviderReference != nil) {
		return payment.StatusRequiresCapture
	}
	return p.res.Status
}

// commandProblems replays a capture's or cancel's key once its payment is final: it answers the
// command's outcome, replayed once a final answer was given, or 409 for a command never taken.
// The key's history (the replay included) says whether that agrees with its earlier answers.
func commandProblems(a *api, k *keyRecord, st *settled) []string {
	p := st.payments[k.Target.id()]
	if p == nil {
		return []string{"its payment is not known"}
	}
	call := time.Now()
	r, err := a.replay(k)
	k.mu.Lock()
	decided := k.decided
	k.mu.Unlock()
	o := k.note(opOf(call, r, err))
	if problem := notItsOwn(k, p); problem != "" {
		return []string{problem}
	}
	want := k.kind().answerStatus(p.res.Status)
	switch {
	case err != nil:
		return []string{"replay: " + err.Error()}
	case r.status == http.StatusConflict && o.Code == refusalCode(k.command):
	case !p.done() && r.status == http.StatusAccepted: // the settled check reports the payment
	case r.status != want:
		return []string{fmt.Sprintf("replay answered %d, want %d (or 409 %s) for a %s payment: %.200s",
			r.status, want, refusalCode(k.command), p.res.Status, r.body)}
	case o.Payment != p.id || o.Resource != p.res.Status:
		return []string{fmt.Sprintf("replay answered %s %s, want %s %s", o.Payment, o.Resource, p.id, p.res.Status)}
	case decided != "" && !o.Replayed:
		return []string{"replay without Idempotent-Replayed: true"}
	}
	return nil
}

// notItsOwn says how a command's key was answered with an outcome that is not the command's own
// (docs/api.md): a capture's 402 is the bank's refusal (failure_code declined), a cancel's 200 its
// cancel (canceled). An authorization that expired first makes the command 409, never taken; one
// that expired after the command was answered 202 (taken, the hold kept for it) lost it.
func notItsOwn(k *keyRecord, p *paid) string {
	own := map[payment.Command]string{payment.CommandCapture: payment.FailureDeclined, payment.CommandCancel: payment.FailureCanceled}[k.command]
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, o := range k.history {
		if o.Info || o.Resource != payment.StatusCanceled || o.Failure == own || k.kind().answerStatus(o.Resource) != o.Status {
			continue
		}
		before, err := time.Parse(time.RFC3339Nano, p.res.CaptureBefore)
		sent := "its first request"
		if first := k.history[0].Call; err == nil && first.Before(before) {
			sent += fmt.Sprintf(" came %s before capture_before", before.Sub(first).Round(100*time.Millisecond))
		} else {
			sent += " came after capture_before"
		}
		taken := slices.ContainsFunc(k.history, func(o op) bool { return o.Status == http.StatusAccepted })
		return fmt.Sprintf("answered %d %s (%s), not the %s's own outcome (%s); %s; answered 202 before: %t",
			o.Status, o.Resource, o.Failure, k.command, own, sent, taken)
	}
	return ""
}

// checkManual checks each manual payment at the bank. captures: at most one authorization, no
// charge, none held once the payment failed or was canceled (unless its void went unknown), and
// captured what kasa says. above: no capture took more than its authorization, a succeeded one
// what its capture asked, and an outcome needing a command only if a key sent that command.
func (s *stack) checkManual(keys []*keyRecord, st *settled) (captures, above Check) {
	captures = Check{Name: "manual payments: one authorization, no charge, the bank captured what kasa says"}
	above = Check{Name: "no capture above its authorization, nor other than it asked; no capture or cancel nobody sent"}
	sent := map[*keyRecord][]payment.Command{}
	for _, k := range keys {
		if k.command != "" {
			sent[k.Target] = append(sent[k.Target], k.command)
		}
	}
	events := s.hook.byPayment()
	var mu sync.Mutex
	manual := slices.DeleteFunc(sortedPayments(st), func(p *paid) bool { return !p.key.manual })
	inParallel(manual, func(p *paid) {
		held, err := s.api.bank().Authorizations(context.Background(), p.id)
		charged, cerr := s.api.bank().Charges(context.Background(), p.id)
		captured, aerr := signedAmount(p.res.AmountCaptured, "TRY")
		mu.Lock()
		defer mu.Unlock()
		captures.Checked++
		above.Checked++
		switch {
		case cmp.Or(err, cerr, aerr) != nil:
			captures.fail("%s: %v", p.what(), cmp.Or(err, cerr, aerr))
			return
		case charged.Count+charged.Pending > 0:
			captures.fail("manual %s (%s): charged %d times", p.what(), p.res.Status, charged.Count+charged.Pending)
		case held.Count+held.Pending > 1:
			captures.fail("%s (%s): %d authorizations at the bank", p.what(), p.res.Status, held.Count+held.Pending)
		case p.res.Status == payment.StatusFailed && len(held.Live) > 0: // kasa lost track of it: nobody can void it
			captures.fail("%s (failed, %s): its authorization %s is held at the bank", p.what(), deref(p.res.FailureCode), held.Live[0])
		case p.res.Status == payment.StatusCanceled && len(held.Live) > 0 && !wentUnknown(p, events[p.id]):
			// Canceled without an ambiguous void: kasa released its hold, yet the payer's bank
			// still blocks the money until the authorization's own lifetime ends.
			captures.fail("%s (canceled, %s): its authorization %s is still held at the bank, never voided", p.what(), deref(p.res.FailureCode), held.Live[0])
		case p.res.Status == payment.StatusSucceeded && held.CapturedMinor != captured:
			captures.fail("%s (captured): amount_captured %s, the bank captured %s", p.what(), p.res.AmountCaptured, formatTRY(held.CapturedMinor))
		case p.res.Status != payment.StatusSucceeded && held.CapturedMinor != 0:
			captures.fail("%s (%s, %s): the bank captured %s", p.what(), p.res.Status, deref(p.res.FailureCode), formatTRY(held.CapturedMinor))
		}
		// The command an outcome needs: a capture (taken, or refused by the bank), or a cancel.
		var needs payment.Command
		switch code := deref(p.res.FailureCode); {
		case p.res.Status == payment.StatusSucceeded, p.res.Status == payment.StatusCanceled && code == payment.FailureDeclined:
			needs = payment.CommandCapture
		case p.res.Status == payment.StatusCanceled && code == payment.FailureCanceled:
			needs = payment.CommandCancel
		}
		switch asked := cmp.Or(p.key.capture, p.key.Amount); {
		case captured > p.key.Amount || held.CapturedMinor > p.key.Amount:
			above.fail("%s (%s, authorized %s): amount_captured %s, the bank captured %s", p.what(), p.res.Status, formatTRY(p.key.Amount), p.res.AmountCaptured, formatTRY(held.CapturedMinor))
		case needs != "" && !slices.Contains(sent[p.key], needs):
			above.fail("%s (%s, %s): no %s was sent for it", p.what(), p.res.Status, deref(p.res.FailureCode), needs)
		case p.res.Status == payment.StatusSucceeded && captured != asked:
			above.fail("%s (captured): amount_captured %s, its capture asked %s", p.what(), p.res.AmountCaptured, formatTRY(asked))
		}
	})
	return captures.done(), above.done()
}

// expiryBound is how soon after its capture_before an authorization nobody captured or canceled
// must have been let go (docs/operations.md, "Overdue authorizations").
const expiryBound = time.Minute

// checkExpiries: each manual payment that expired was released (its updated_at) within
// expiryBound of its capture_before, never before; one whose void went unknown settles later.
func checkExpiries(st *settled, events map[string][]event) Check {
	c := Check{Name: fmt.Sprintf("every expired authorization was released within %s of its capture_before", expiryBound)}
	for _, p := range sortedPayments(st) {
		if !p.key.manual || p.res.Status != payment.StatusCanceled || deref(p.res.FailureCode) != payment.FailureAuthorizationExpired {
			continue
		}
		c.Checked++
		before, err := time.Parse(time.RFC3339Nano, p.res.CaptureBefore)
		updated, uerr := time.Parse(time.RFC3339Nano, p.res.UpdatedAt)
		unknown := wentUnknown(p, events[p.id])
		switch {
		case err != nil || uerr != nil:
			c.fail("payment %s: capture_before %q, updated_at %q", p.id, p.res.CaptureBefore, p.res.UpdatedAt)
		case updated.Before(before.Add(-time.Second)):
			c.fail("payment %s expired at %s, before its capture_before %s", p.id, p.res.UpdatedAt, p.res.CaptureBefore)
		case !unknown && updated.After(before.Add(expiryBound)):
			c.fail("payment %s released %s after its capture_before", p.id, updated.Sub(before).Round(time.Second))
		}
	}
	return c.done()
}

// wentUnknown says whether an answer, a read or one of its events showed p unknown.
func wentUnknown(p *paid, events []event) bool {
	return p.viaUnknown || slices.ContainsFunc(events, func(e event) bool { return e.Type == "payment.unknown" })
}

// checkOpen: no manual payment is left requires_capture or unknown, and kasa's gauges count no
// authorization open or overdue.
func (s *stack) checkOpen(st *settled) Check {
	c := Check{Name: "no authorization left open after settling"}
	for _, p := range sortedPayments(st) {
		if p.key.manual {
			c.Checked++
			if p.res.Status == payment.StatusRequiresCapture || p.res.Status == payment.StatusUnknown {
				c.fail("payment %s is %s", p.id, p.res.Status)
			}
		}
	}
	c.Checked++
	gauges, err := s.api.gauges("kasa_authorizations_open", "kasa_authorizations_overdue")
	switch {
	case err != nil:
		c.fail("%v", err)
	case gauges[0]+gauges[1] > 0:
		c.fail("kasa_authorizations_open %g, kasa_authorizations_overdue %g", gauges[0], gauges[1])
	}
	return c.done()
}
