package soak

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/kasa-pay/kasa/payment"
)

// op is one request a client sent under a key: when it was sent and answered, and the answer,
// or Info when none came (it may or may not have taken effect).
type op struct {
	Lookup   bool           `json:"lookup,omitempty"`         // GET /v1/payments?idempotency_key=, not the POST
	API      string         `json:"api,omitempty"`            // the API instance it was sent to, host:port
	Request  string         `json:"request_sha256,omitempty"` // of the POST's body, hex
	Call     time.Time      `json:"call"`
	Return   time.Time      `json:"return"`
	Info     bool           `json:"info,omitempty"`
	Status   int            `json:"status,omitempty"`
	Replayed bool           `json:"replayed,omitempty"`
	Payment  string         `json:"payment,omitempty"`      // the payment or refund the answer names, if any
	Resource payment.Status `json:"resource,omitempty"`     // that payment's status in the answer
	Failure  string         `json:"failure_code,omitempty"` // and its failure_code
	Code     string         `json:"code,omitempty"`         // a problem's code
	Body     string         `json:"body_sha256"`            // of the body, hex
}

func opOf(call time.Time, r answer, err error) op {
	o := op{Call: call, Return: time.Now(), API: r.via, Info: err != nil, Status: r.status, Body: sha256Hex(r.body)}
	if err != nil {
		return o
	}
	o.Replayed = r.header.Get("Idempotent-Replayed") == "true"
	var v struct {
		ID          string
		Status      json.RawMessage // a string in a payment, a number in a problem
		Code        string
		PaymentID   string  `json:"payment_id"` // a duplicate_payment's
		FailureCode *string `json:"failure_code"`
	}
	if json.Unmarshal(r.body, &v) == nil {
		o.Code = v.Code
		if v.Code == "duplicate_payment" {
			o.Payment = v.PaymentID
		}
		var s string
		if v.Code == "" && json.Unmarshal(v.Status, &s) == nil {
			o.Payment, o.Resource = v.ID, payment.Status(s)
			if v.FailureCode != nil {
				o.Failure = *v.FailureCode
			}
		}
	}
	return o
}

// lookupOf is a lookup of the key's payment that found p (ok) or answered 404.
func lookupOf(call time.Time, p payment.Resource, ok bool) op {
	o := op{Lookup: true, Call: call, Return: time.Now(), Status: http.StatusNotFound}
	if ok {
		o.Status, o.Payment, o.Resource = http.StatusOK, p.ID, p.Status
	}
	return o
}

func (o op) String() string {
	span := fmt.Sprintf("[%s, %s]", o.Call.Format(time.TimeOnly+".000"), o.Return.Format(time.TimeOnly+".000"))
	switch {
	case o.Lookup:
		return fmt.Sprintf("%s lookup %d %s %s", span, o.Status, o.Payment, o.Resource)
	case o.Info:
		return span + " no answer"
	}
	return fmt.Sprintf("%s %d %s %s %s %s replayed=%t body=%.8s", span, o.Status, o.Payment, o.Resource, o.Failure, o.Code, o.Replayed, o.Body)
}

// keyState is the sequential model of one key (docs/api.md, idempotency), as its answers showed it.
type keyState struct {
	payment string         // the payment or refund the key made (a command's payment)
	decided payment.Status // the status its answer stands for (final; a manual one's requires_capture)
	body    string         // the final answer's bytes
	expired bool           // the key's record expired
	later   payment.Status // a manual payment's final status a lookup showed after its authorization
	taken   bool           // a command's: answered 202
}

// paid: an answer showed the key's payment succeeded (captured, for a manual one): it holds
// its invoice for good.
func (s keyState) paid() bool {
	return s.decided == payment.StatusSucceeded || s.later == payment.StatusSucceeded
}

// freed: an answer showed the key's payment failed or canceled: its invoice is free again.
func (s keyState) freed() bool {
	return s.decided == payment.StatusFailed || s.later == payment.StatusCanceled
}

// keyKind is what the model knows of a key beside its history.
type keyKind struct {
	refund, expires bool            // expires: records may expire during the run
	manual          bool            // a manual payment's: answered requires_capture, captured or canceled later
	command         payment.Command // a capture's or a cancel's
	request         string          // the hash of the key's request: another one answers 422
}

// answerStatus is the HTTP status of the key's final answer when its resource has status st, or
// 0 when st is no final answer of the key.
func (k keyKind) answerStatus(st payment.Status) int {
	var answers map[payment.Status]int
	switch {
	case k.command == payment.CommandCapture:
		answers = map[payment.Status]int{payment.StatusSucceeded: http.StatusCreated, payment.StatusCanceled: http.StatusPaymentRequired}
	case k.command == payment.CommandCancel:
		answers = map[payment.Status]int{payment.StatusCanceled: http.StatusOK}
	case k.manual:
		answers = map[payment.Status]int{payment.StatusRequiresCapture: http.StatusCreated, payment.StatusFailed: http.StatusPaymentRequired}
	default:
		answers = map[payment.Status]int{payment.StatusSucceeded: http.StatusCreated, payment.StatusFailed: http.StatusPaymentRequired}
	}
	return answers[st]
}

// stepKey says whether the model of one key, in state s, may give o's answer, and the state after.
// 422 is right for another request under the key, and for a refund's expired key.
func stepKey(k keyKind, s keyState, o op) (bool, keyState) {
	if o.Request != "" && k.request != "" && o.Request != k.request {
		// Another request under the key changes nothing, and says so.
		return o.Info || o.Status == http.StatusTooManyRequests || o.Status >= 500 ||
			o.Status == http.StatusUnprocessableEntity && o.Code == "idempotency_key_reused", s
	}
	if k.expires && !o.Info {
		// A finished operation's record may be gone (docs/api.md, KASA_IDEMPOTENCY_RETENTION): a
		// refund's key then answers 422 for good; a payment's key is a new request, which the
		// invoice answers with its live payment, or which pays again after a failed one.
		switch {
		case k.refund && o.Status == http.StatusUnprocessableEntity && o.Code == "idempotency_key_reused":
			s.expired = true
			return true, s
		case !k.refund && o.Status == http.StatusConflict && o.Code == "duplicate_payment":
			// The invoice's live payment: the key's, or after its failed one, a later attempt's.
			ok := o.Payment != "" && (s.payment == "" || s.payment == o.Payment && !s.freed() ||
				s.payment != o.Payment && !s.paid())
			next := keyState{payment: o.Payment, decided: payment.StatusSucceeded, expired: true}
			if k.manual {
				next.decided = payment.StatusRequiresCapture
				if s.payment == o.Payment {
					next.later = s.later
				}
			}
			return ok, next
		case !k.refund && !s.paid() && o.Payment != "" && s.payment != "" && o.Payment != s.payment:
			// A new payment under a new record: the key's earlier one must have failed, which
			// the check of the key's payments says.
			s = keyState{}
		case !k.refund && s.freed() && o.Status == http.StatusConflict && o.Code == "idempotency_key_in_use":
			return true, s // a new payment in flight, whose first answer was lost
		}
	}
	switch {
	case s.expired && !o.Lookup:
		return o.Info || o.Status == http.StatusTooManyRequests || o.Status >= 500, s // the record is gone for good
	case o.Info:
		return true, s // no answer: whatever it did, a later answer says
	case o.Status == http.StatusTooManyRequests || o.Status >= 500:
		return true, s // asked to wait, or failed: nothing a retry must not see
	case o.Lookup && o.Status == http.StatusNotFound:
		return s.payment == "", s // once a payment was answered, the key finds it
	case !o.Lookup && o.Status == http.StatusConflict && k.command != "" && o.Code == refusalCode(k.command):
		// The payment no longer waits for a command, and the key keeps nothing: only before the
		// command was taken.
		return s.decided == "" && !s.taken, s
	case !o.Lookup && o.Status == http.StatusConflict:
		return o.Code == "idempotency_key_in_use" && s.decided == "", s // only while in flight
	case o.Lookup && o.Status != http.StatusOK,
		!o.Lookup && o.Status != http.StatusCreated && o.Status != http.StatusPaymentRequired && o.Status != http.StatusAccepted &&
			o.Status != http.StatusOK:
		return false, s
	}
	if o.Payment == "" || s.payment != "" && s.payment != o.Payment {
		return false, s // one payment per key
	}
	s.payment = o.Payment
	if o.Lookup && k.manual {
		return stepManualLookup(s, o.Resource)
	}
	want := k.answerStatus(o.Resource)
	switch {
	case want == 0 && k.command != "":
		// In flight at the bank, or unknown: the payment as it waits, before the command's outcome.
		s.taken = true
		return s.decided == "" && !o.Lookup && o.Status == http.StatusAccepted &&
			(o.Resource == payment.StatusRequiresCapture || o.Resource == payment.StatusUnknown), s
	case want == 0:
		// In flight or unknown: never once the outcome was shown.
		return s.decided == "" && (o.Resource == payment.StatusProcessing || o.Resource == payment.StatusUnknown) &&
			(o.Lookup || o.Status == http.StatusAccepted), s
	case s.decided != "" && s.decided != o.Resource, !o.Lookup && o.Status != want:
		return false, s
	}
	s.decided = o.Resource
	if o.Lookup {
		return true, s
	}
	if s.body != "" && s.body != o.Body {
		return false, s // a replay is the final answer, byte for byte
	}
	s.body = o.Body
	return true, s
}

// stepManualLookup is a lookup of a manual payment, which shows its status now: processing, then
// requires_capture or failed; once authorized, unknown, then succeeded or canceled for good.
func stepManualLookup(s keyState, st payment.Status) (bool, keyState) {
	authorized := s.decided == "" || s.decided == payment.StatusRequiresCapture
	switch st {
	case payment.StatusProcessing:
		return s.decided == "", s
	case payment.StatusUnknown: // its authorization, or once authorized its capture or void
		return s.decided != payment.StatusFailed && s.later == "", s
	case payment.StatusFailed:
		ok := s.decided == "" || s.decided == payment.StatusFailed
		s.decided = st
		return ok, s
	case payment.StatusRequiresCapture:
		ok := authorized && s.later == ""
		s.decided = st
		return ok, s
	case payment.StatusSucceeded, payment.StatusCanceled:
		ok := authorized && (s.later == "" || s.later == st)
		s.decided, s.later = payment.StatusRequiresCapture, st
		return ok, s
	}
	return false, s
}

// linearizable says whether some order of a key's requests, each taking effect between its call
// and its answer, explains every answer.
func linearizable(k keyKind, history []op) bool {
	ops := make([]porcupine.Operation, len(history))
	for i, o := range history {
		ret := o.Return.UnixNano()
		if o.Info {
			ret = 1<<63 - 1 // it may take effect at any time after its call
		}
		ops[i] = porcupine.Operation{ClientId: i, Call: o.Call.UnixNano(), Output: o, Return: ret}
	}
	return porcupine.CheckOperations(porcupine.Model{
		Init: func() any { return keyState{} },
		Step: func(state, _, output any) (bool, any) { return stepKey(k, state.(keyState), output.(op)) },
	}, ops)
}

// shrink is a smallest sub-history of h that no order explains, so that a violation shows only
// what contradicts.
func shrink(k keyKind, h []op) []op {
	h = slices.Clone(h)
	for i := 0; i < len(h); {
		if without := slices.Delete(slices.Clone(h), i, i+1); !linearizable(k, without) {
			h = without
		} else {
			i++
		}
	}
	return h
}

// describe lists a history, one request a line, for a violation.
func describe(history []op) string {
	lines := make([]string, len(history))
	for i, o := range history {
		lines[i] = "  " + o.String()
	}
	return strings.Join(lines, "\n")
}
