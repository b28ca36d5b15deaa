package activities_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/workflows"
)

// lyingBank answers every call with the body answers gives for its method and path, the
// operation's id in place of {id}: 201 to a send, 200 to an inquiry.
func lyingBank(t *testing.T, answers map[string]string, id uuid.UUID) *provider.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := answers[r.Method+" "+r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(map[string]int{http.MethodPost: http.StatusCreated, http.MethodGet: http.StatusOK}[r.Method])
		_, _ = w.Write([]byte(strings.ReplaceAll(body, "{id}", id.String())))
	}))
	t.Cleanup(srv.Close)
	return provider.New(srv.URL, 5*time.Second)
}

// inFlight is the fakes' payment (100 TRY) with a capture of 60 in flight.
type inFlight struct{ *attempts }

func (inFlight) CaptureAmountsInFlight(context.Context, uuid.UUID) ([]int64, error) {
	return []int64{60}, nil
}

// A bank whose answer about a manual payment's authorization does not add up, read by the steps
// that capture it, void it and ask after them: an answer about another payment's authorization
// (an id mistyped in a settlement), or naming more than was asked, decides nothing.
func TestLyingBankOnAuthorizations(t *testing.T) {
	const (
		capture = "POST /v1/authorizations/au_1/capture"
		void    = "POST /v1/authorizations/au_1/void"
		inquiry = "GET /v1/authorizations"
	)
	send := func(name string) func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error) {
		return func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error) {
			in := workflows.BankCallInput{OperationID: id, AuthorizationRef: "au_1", AmountMinor: 60, Send: 1}
			if name == "capture" {
				return a.CaptureAuthorization(context.Background(), in)
			}
			return a.VoidAuthorization(context.Background(), in)
		}
	}
	for _, tc := range []struct {
		name    string
		answers map[string]string
		step    func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error)
		want    string // "succeeded", or the error type
	}{
		{"capture", map[string]string{capture: `{"id":"cp_1","authorization_id":"au_1","reference":"{id}","amount_minor":60,"status":"succeeded"}`},
			send("capture"), "succeeded"},
		{"capture of another payment's authorization", map[string]string{capture: `{"id":"cp_1","authorization_id":"au_1","reference":"` + payment.NewID().String() + `","amount_minor":60,"status":"succeeded"}`},
			send("capture"), workflows.ErrTypeAmbiguous},
		{"capture of more than asked", map[string]string{capture: `{"id":"cp_1","authorization_id":"au_1","reference":"{id}","amount_minor":100,"status":"succeeded"}`},
			send("capture"), workflows.ErrTypeAmbiguous},
		{"void", map[string]string{void: `{"id":"vd_1","authorization_id":"au_1","reference":"{id}","status":"succeeded"}`},
			send("void"), "succeeded"},
		{"void of another payment's authorization", map[string]string{void: `{"id":"vd_1","authorization_id":"au_1","reference":"` + payment.NewID().String() + `","status":"succeeded"}`},
			send("void"), workflows.ErrTypeAmbiguous},
		{"capture inquiry captured for more than asked", map[string]string{inquiry: `{"id":"au_1","reference":"{id}","amount_minor":100,"currency":"TRY","status":"succeeded","state":"captured","captured_minor":100}`},
			func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error) {
				return a.InquireCapture(context.Background(), id)
			},
			workflows.ErrTypeAmbiguous},
		{"capture inquiry captured for more than authorized", map[string]string{inquiry: `{"id":"au_1","reference":"{id}","amount_minor":100,"currency":"TRY","status":"succeeded","state":"captured","captured_minor":500}`},
			func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error) {
				return a.InquireCapture(context.Background(), id)
			},
			workflows.ErrTypeAmbiguous},
		{"capture inquiry in a state kasa does not know", map[string]string{inquiry: `{"id":"au_1","reference":"{id}","status":"succeeded","state":"partially_captured"}`},
			func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error) {
				return a.InquireCapture(context.Background(), id)
			},
			workflows.ErrTypeAmbiguous},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := payment.NewID()
			a := &activities.Activities{Store: inFlight{&attempts{}}, Provider: lyingBank(t, tc.answers, id),
				Policy: workflows.ChargePolicy{Capability: workflows.CapabilityIdempotent}}
			readAs(t, tc.want)(tc.step(a, id))
		})
	}
}

// A bank whose answer to a charge or refund does not add up, read by the step that sends it and
// the one that asks after it: only an answer that says one thing about the operation asked
// decides it; the rest is ambiguous, never a decline that would release the hold.
func TestLyingBankOnChargesAndRefunds(t *testing.T) {
	const (
		charge        = "POST /v1/charges"
		chargeInquiry = "GET /v1/charges"
		refund        = "POST /v1/refunds"
		refundInquiry = "GET /v1/refunds"
	)
	sendCharge := func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error) {
		return a.Charge(context.Background(), workflows.ChargeInput{OperationID: id, AccountID: payer, AmountMinor: 100, Currency: "TRY",
			Capability: workflows.CapabilityIdempotent, Send: 1})
	}
	inquireCharge := func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error) {
		return a.InquireCharge(context.Background(), id)
	}
	sendRefund := func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error) {
		r, err := a.SendRefund(context.Background(), workflows.SendRefundInput{OperationID: id, PaymentID: refunded, AmountMinor: 3000,
			Currency: "TRY", Capability: workflows.CapabilityIdempotent, Send: 1})
		return workflows.ChargeResult(r), err
	}
	inquireRefund := func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error) {
		r, err := a.InquireRefund(context.Background(), id)
		return workflows.ChargeResult(r), err
	}
	for _, tc := range []struct {
		name string
		path string
		body string
		step func(a *activities.Activities, id uuid.UUID) (workflows.ChargeResult, error)
		want string // "succeeded", "declined", or the error type
	}{
		{"charge", charge, `{"id":"ch_1","reference":"{id}","amount_minor":100,"currency":"TRY","status":"succeeded","new_field":{"a":1}}`, sendCharge, "succeeded"},
		{"charge for another amount", charge, `{"id":"ch_1","reference":"{id}","amount_minor":1000,"currency":"TRY","status":"succeeded"}`, sendCharge, workflows.ErrTypeAmbiguous},
		{"charge of zero", charge, `{"id":"ch_1","reference":"{id}","amount_minor":0,"currency":"TRY","status":"succeeded"}`, sendCharge, workflows.ErrTypeAmbiguous},
		{"charge in another currency", charge, `{"id":"ch_1","reference":"{id}","amount_minor":100,"currency":"EUR","status":"succeeded"}`, sendCharge, workflows.ErrTypeAmbiguous},
		{"charge of another reference", charge, `{"id":"ch_1","reference":"` + payment.NewID().String() + `","status":"succeeded"}`, sendCharge, workflows.ErrTypeAmbiguous},
		{"charge succeeded, then declined", charge, `{"id":"ch_1","reference":"{id}","status":"succeeded","status":"declined"}`, sendCharge, workflows.ErrTypeAmbiguous},
		{"charge in an unknown status", charge, `{"id":"ch_1","reference":"{id}","status":"processing"}`, sendCharge, workflows.ErrTypeAmbiguous},
		{"charge inquiry for another amount", chargeInquiry, `{"id":"ch_1","reference":"{id}","amount_minor":-100,"status":"succeeded"}`, inquireCharge, workflows.ErrTypeAmbiguous},
		{"charge inquiry succeeded, then declined", chargeInquiry, `{"id":"ch_1","reference":"{id}","status":"succeeded","Status":"declined"}`, inquireCharge, workflows.ErrTypeAmbiguous},
		{"refund", refund, `{"id":"rf_1","reference":"{id}","amount_minor":3000,"currency":"TRY","status":"declined"}`, sendRefund, workflows.ErrTypeDeclined},
		{"refund of more than asked", refund, `{"id":"rf_1","reference":"{id}","amount_minor":3001,"currency":"TRY","status":"succeeded"}`, sendRefund, workflows.ErrTypeAmbiguous},
		{"refund declined, then succeeded", refund, `{"id":"rf_1","reference":"{id}","status":"declined","status":"succeeded"}`, sendRefund, workflows.ErrTypeAmbiguous},
		{"refund inquiry of more than asked", refundInquiry, `{"id":"rf_1","reference":"{id}","amount_minor":9000,"status":"succeeded"}`, inquireRefund, workflows.ErrTypeAmbiguous},
		{"refund inquiry of zero", refundInquiry, `{"id":"rf_1","reference":"{id}","amount_minor":0,"status":"declined"}`, inquireRefund, workflows.ErrTypeAmbiguous},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := payment.NewID()
			a := &activities.Activities{Store: rows{&attempts{}}, Provider: lyingBank(t, map[string]string{tc.path: tc.body}, id),
				Policy: workflows.ChargePolicy{Capability: workflows.CapabilityIdempotent}}
			readAs(t, tc.want)(tc.step(a, id))
		})
	}
}

// readAs checks a step's result against want: "succeeded", or the type of the error it fails with.
func readAs(t *testing.T, want string) func(workflows.ChargeResult, error) {
	return func(res workflows.ChargeResult, err error) {
		t.Helper()
		if want == provider.StatusSucceeded {
			require.NoError(t, err)
			require.True(t, res.Succeeded)
			return
		}
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, err, &appErr, "read as %+v", res)
		require.Equal(t, want, appErr.Type(), fmt.Sprint(err))
	}
}
