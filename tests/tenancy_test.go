package tests

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/workflows"
)

// Merchant B's key sent to every merchant route with merchant A's ids (docs/api.md,
// "Authentication"): A's payments, refunds and accounts answer 404 as ones that do not exist, a
// payment from A's account is refused, and nothing of A's moves: balances, holds, the bank's
// refunds, captures and voids, A's payment list; B is left with no payment and no record.
func TestAnotherMerchantsIdsReachNothingOnAnyRoute(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	a, b := s.newMerchant(), s.newMerchant()
	paid, payer := s.paidFor(a, "a-paid", "20.00", "100.00")
	r := s.refund(a, paid, "a-refund", `{"amount":"5.00"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	refund := r.json(t)["id"].(string)
	manual, manualPayer, _ := s.authorize(a, "a-manual", "30.00", "100.00")
	bPayer := s.newAccount(b, "TRY", "100.00")

	type state struct {
		balance, reserved, manualBalance, manualReserved int64
		refunds                                          int
		captured                                         int64
		voided                                           bool
	}
	now := func() state {
		h := s.held(manual)
		return state{balance(t, payer), reserved(t, payer), balance(t, manualPayer), reserved(t, manualPayer),
			s.simRefunds(paid), h.CapturedMinor, h.Voided}
	}
	before := now()

	cases := []struct {
		name, method, path, body, key string
		status                        int
		code                          string
	}{
		{"payment", "GET", "/v1/payments/" + paid, "", "", 404, "not_found"},
		{"payment, HEAD", "HEAD", "/v1/payments/" + paid, "", "", 404, ""},
		{"payment by A's key", "GET", "/v1/payments?idempotency_key=a-paid", "", "", 404, "not_found"},
		{"list after A's payment", "GET", "/v1/payments?starting_after=" + paid, "", "", 400, "invalid_request"},
		{"refund", "GET", "/v1/refunds/" + refund, "", "", 404, "not_found"},
		{"payment's refunds", "GET", "/v1/payments/" + paid + "/refunds", "", "", 404, "not_found"},
		{"refund A's payment", "POST", "/v1/payments/" + paid + "/refunds", `{"amount":"1.00"}`, "b-refund", 404, "not_found"},
		{"refund A's payment under A's key", "POST", "/v1/payments/" + paid + "/refunds", `{"amount":"5.00"}`, "a-refund", 404, "not_found"},
		{"capture", "POST", "/v1/payments/" + manual + "/capture", `{"amount":"10.00"}`, "b-capture", 404, "not_found"},
		{"cancel", "POST", "/v1/payments/" + manual + "/cancel", "", "b-cancel", 404, "not_found"},
		{"account", "GET", "/v1/accounts/" + payer, "", "", 404, "not_found"},
		{"account, HEAD", "HEAD", "/v1/accounts/" + payer, "", "", 404, ""},
		{"pay from A's account", "POST", "/v1/payments", payBody("inv-b", "10.00", "TRY", payer), "b-pay", 400, "invalid_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var headers []string
			if c.key != "" {
				headers = append(headers, "Idempotency-Key", c.key)
			}
			r := s.do(c.method, c.path, b.APIKey, c.body, headers...)
			require.Equal(t, c.status, r.Status, "%s", r.Body)
			if c.code != "" {
				requireProblem(t, r, c.status, c.code)
			}
			require.NotContains(t, string(r.Body), a.ID, "A's id in B's answer")
			require.NotContains(t, string(r.Body), payer, "A's account in B's answer")
		})
	}

	require.Equal(t, before, now(), "nothing of A's moved")
	list := s.do("GET", "/v1/payments", b.APIKey, "")
	require.Equal(t, http.StatusOK, list.Status, "%s", list.Body)
	require.Empty(t, list.json(t)["data"], "B has no payment")
	for _, key := range []string{"b-pay", "b-refund", "b-capture", "b-cancel", "a-refund"} {
		_, err := db.PaymentByKey(context.Background(), mustUUID(t, b.ID), key)
		require.Error(t, err, "B has no payment under %s", key)
	}
	require.Equal(t, int64(10000), balance(t, bPayer))
	// B's own key space is untouched by the refusals: its keys still pay.
	r = s.pay(b, "b-pay", payBody("inv-b", "10.00", "TRY", bPayer))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	requireVerified(t)
}
