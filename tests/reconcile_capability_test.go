package tests

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/workflows"
)

// lostAnswer is the simulator's rules for a send (on: charge or refund) whose answer is lost
// (drop_response: the money moved; error_500: it did not) as the capability sees it: none parks
// it at once; idempotent re-sends with the same key until its budget runs out, every answer
// lost; inquiry asks the bank, which never answers, until its budget runs out.
func lostAnswer(c workflows.Capability, on, action string) string {
	switch c {
	case workflows.CapabilityIdempotent:
		return fmt.Sprintf(`{"rules":[{"on":%q,"action":%q}]}`, on, action)
	case workflows.CapabilityInquiry:
		return fmt.Sprintf(`{"rules":[{"on":%q,"action":%q,"count":1},{"on":"inquiry","action":"error_500"}]}`, on, action)
	}
	return fmt.Sprintf(`{"rules":[{"on":%q,"action":%q,"count":1}]}`, on, action)
}

// Whatever the capability, a payment or refund whose bank answer kasa could not learn is parked
// unknown, its hold kept, and the bank's own settlement file settles it: the listed one is
// posted once, the unlisted one released, with their events, and nothing moves twice at the bank.
func TestReconcileUnknownOfEveryCapability(t *testing.T) {
	t.Parallel()
	for _, c := range []workflows.Capability{workflows.CapabilityNone, workflows.CapabilityIdempotent, workflows.CapabilityInquiry} {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := newStackWith(t, stackOptions{capability: c, temporal: tc, bookingWindow: bookingWindow})
			m := s.newMerchant()
			acct := s.newAccount(m, "TRY", "100.00")
			r := s.pay(m, "paid", payBody("inv-paid", "50.00", "TRY", acct))
			require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
			paid := paymentByKey(t, m, "paid")

			unknownPayment := func(key, action string) payment.Payment {
				t.Helper()
				s.setFaults(lostAnswer(c, "charge", action))
				r := s.pay(m, key, payBody(key, "20.00", "TRY", acct))
				require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
				require.Eventually(t, func() bool { return paymentByKey(t, m, key).Status == payment.StatusUnknown },
					45*time.Second, 100*time.Millisecond)
				return paymentByKey(t, m, key)
			}
			unknownRefund := func(key, action string) payment.Refund {
				t.Helper()
				s.setFaults(lostAnswer(c, "refund", action))
				r := s.refund(m, paid.ID.String(), key, `{"amount":"5.00"}`)
				require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
				id := mustUUID(t, r.json(t)["id"].(string))
				var rf payment.Refund
				require.Eventually(t, func() bool {
					var err error
					rf, err = db.Refund(ctx, id)
					return err == nil && rf.Status == payment.StatusUnknown
				}, 45*time.Second, 100*time.Millisecond)
				return rf
			}
			charged, notCharged := unknownPayment("charged", "drop_response"), unknownPayment("not-charged", "error_500")
			refunded, notRefunded := unknownRefund("refunded", "drop_response"), unknownRefund("not-refunded", "error_500")
			// The bank still never answers an inquiry: only the file can say what it did.
			s.setFaults(`{"rules":[{"on":"inquiry","action":"error_500"}]}`)
			require.Equal(t, 1, s.simCount(charged.ID.String()))
			require.Zero(t, s.simCount(notCharged.ID.String()))
			require.Equal(t, 1, s.simRefunds(refunded.ID.String()))
			require.Zero(t, s.simRefunds(notRefunded.ID.String()))
			a := s.account(m, acct)
			require.Equal(t, []any{"50.00", "40.00"}, []any{a["balance"], a["reserved"]}, "both unknown payments keep their holds")
			require.Zero(t, paymentByKey(t, m, "paid").AmountRefunded, "no refund counted yet")

			time.Sleep(bookingWindow + 100*time.Millisecond)
			rep, ok := decodeReport(t, s.importSettlements(m, s.settlementFile(today())))
			require.True(t, ok, "%+v %+v", rep.Mismatches, rep.RefundMismatches)
			require.Equal(t, reconcile.Counts{Matched: 1, ResolvedCharged: 1, ResolvedNotCharged: 1,
				RefundResolvedCharged: 1, RefundResolvedNotCharged: 1}, rep.Counts, "%+v %+v", rep.Pending, rep.RefundPending)

			require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "charged").Status)
			require.Equal(t, payment.StatusFailed, paymentByKey(t, m, "not-charged").Status)
			for id, want := range map[string]payment.Status{refunded.ID.String(): payment.StatusSucceeded, notRefunded.ID.String(): payment.StatusFailed} {
				got, err := db.Refund(ctx, mustUUID(t, id))
				require.NoError(t, err)
				require.Equal(t, want, got.Status)
			}
			a = s.account(m, acct)
			require.Equal(t, []any{"35.00", "0.00"}, []any{a["balance"], a["reserved"]}, "100 - 50 - 20 + 5: every hold gone")
			require.Equal(t, int64(500), paymentByKey(t, m, "paid").AmountRefunded)
			require.Equal(t, 1, postingsOf(t, "payment", charged.ID.String()))
			require.Zero(t, postingsOf(t, "payment", notCharged.ID.String()))
			require.Equal(t, 1, postingsOf(t, "refund", refunded.ID.String()))
			require.Zero(t, postingsOf(t, "refund", notRefunded.ID.String()))
			require.Equal(t, []string{"payment.unknown", "payment.succeeded"}, outboxOf(t, env.DatabaseURL, charged.ID.String()))
			require.Equal(t, []string{"payment.unknown", "payment.failed"}, outboxOf(t, env.DatabaseURL, notCharged.ID.String()))
			require.Equal(t, []string{"refund.unknown", "refund.succeeded"}, outboxOf(t, env.DatabaseURL, refunded.ID.String()))
			require.Equal(t, []string{"refund.unknown", "refund.failed"}, outboxOf(t, env.DatabaseURL, notRefunded.ID.String()))
			require.Equal(t, 1, s.simCount(charged.ID.String()), "settling never charges again")
			require.Zero(t, s.simCount(notCharged.ID.String()))
			require.Equal(t, 1, s.simRefunds(refunded.ID.String()))
			require.Zero(t, s.simRefunds(notRefunded.ID.String()))
			requireVerified(t)

			again, ok := decodeReport(t, s.importSettlements(m, s.settlementFile(today())))
			require.True(t, ok, "%+v %+v", again.Mismatches, again.RefundMismatches)
			require.Equal(t, reconcile.Counts{Matched: 2, RefundMatched: 1}, again.Counts, "the same day again moves nothing")
			require.Equal(t, a, s.account(m, acct))
		})
	}
}
