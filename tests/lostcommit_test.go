package tests

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// cutStack is a stack whose worker reaches PostgreSQL through a CommitCutter: its steps' commits
// can lose their answers.
func cutStack(t *testing.T, capability workflows.Capability) (*stack, *testkit.CommitCutter) {
	t.Helper()
	cutter := testkit.NewCommitCutter(t, env.DatabaseURL)
	steps, err := store.Open(context.Background(), store.Options{URL: cutter.URL, SecretKey: testkit.SecretKey})
	require.NoError(t, err)
	t.Cleanup(steps.Close)
	s := newStackWith(t, stackOptions{capability: capability, temporal: tc,
		steps: func(activities.Store) activities.Store { return steps }})
	return s, cutter
}

// With a bank that cannot be asked, a send is recorded before it goes out, and a repeated one
// never goes. When the record commits but its answer is lost on the way back, the worker has
// sent nothing: the send goes out once, and the operation ends by the bank's answer, never
// parked unknown with no money moved.
func TestLostCommitOfASendRecord(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		capability workflows.Capability
	}{
		{"none", workflows.CapabilityNone},
		{"inquiry", workflows.CapabilityInquiry},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			t.Run("charge", func(t *testing.T) {
				s, cutter := cutStack(t, c.capability)
				m := s.newMerchant()
				payer := s.newAccount(m, "TRY", "100.00")
				cutter.LoseCommitOf("-- name: BeginChargeSend")
				r := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", payer))
				require.Equal(t, 1, cutter.Cut(), "the send record's answer was lost")
				require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
				p := r.json(t)
				require.Equal(t, "succeeded", p["status"])
				require.Equal(t, 1, s.simCount(p["id"].(string)), "times the bank moved the money")
				a := s.account(m, payer)
				require.Equal(t, "60.00", a["balance"])
				require.Equal(t, "0.00", a["reserved"])
				requireVerified(t)
			})
			t.Run("refund", func(t *testing.T) {
				s, cutter := cutStack(t, c.capability)
				m := s.newMerchant()
				paymentID, payer := s.paidFor(m, "pay-1", "40.00", "100.00")
				cutter.LoseCommitOf("-- name: BeginRefundSend")
				r := s.refund(m, paymentID, "refund-1", `{"amount":"15.00"}`)
				require.Equal(t, 1, cutter.Cut(), "the send record's answer was lost")
				require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
				rf := r.json(t)
				require.Equal(t, "succeeded", rf["status"])
				require.Equal(t, 1, s.simRefunds(rf["id"].(string)), "times the bank paid back")
				require.Equal(t, int64(7500), balance(t, payer))
				requireVerified(t)
			})
		})
	}
}

// Every step of a workflow commits once: when its commit's answer is lost, the step runs again
// and finds its work done. The money moves once, one posting, one event of each change.
func TestLostCommitOfAStep(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		step, sql string
	}{
		{"reserve", "-- name: ReserveFunds"},
		{"finalize", "-- name: SetPaymentStatusSettlement"},
		{"release", "-- name: LockPaymentRow"},
	} {
		t.Run(c.step, func(t *testing.T) {
			t.Parallel()
			s, cutter := cutStack(t, workflows.CapabilityIdempotent)
			m := s.newMerchant()
			payer := s.newAccount(m, "TRY", "100.00")
			want, status, balance := "succeeded", http.StatusCreated, "60.00"
			if c.step == "release" {
				s.setFaults(`{"rules":[{"on":"charge","action":"decline","count":1}]}`)
				want, status, balance = "failed", http.StatusPaymentRequired, "100.00"
			}
			cutter.LoseCommitOf(c.sql)
			r := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", payer))
			require.Equal(t, 1, cutter.Cut(), "the step's answer was lost")
			require.Equal(t, status, r.Status, "%s", r.Body)
			p := r.json(t)
			require.Equal(t, want, p["status"])
			id := p["id"].(string)
			a := s.account(m, payer)
			require.Equal(t, balance, a["balance"])
			require.Equal(t, "0.00", a["reserved"])
			require.Equal(t, []string{"payment." + want}, outboxOf(t, env.DatabaseURL, id))
			if want == "succeeded" {
				require.Equal(t, 1, postingsOf(t, "payment", id))
			}
			again := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", payer))
			require.Equal(t, status, again.Status)
			require.Equal(t, string(r.Body), string(again.Body), "the key answers as it did")
			requireVerified(t)
		})
	}
}
