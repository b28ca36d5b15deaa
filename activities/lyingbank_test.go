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
			res, err := tc.step(a, id)
			if tc.want == provider.StatusSucceeded {
				require.NoError(t, err)
				require.True(t, res.Succeeded)
				return
			}
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr, "read as %+v", res)
			require.Equal(t, tc.want, appErr.Type(), fmt.Sprint(err))
		})
	}
}
