package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/workflows"
)

// The end-to-end tests of reconciliation share the package's database with tests running in
// parallel, so every import is scoped to the test's own merchant (?merchant_id=): coverage
// then never touches another test's payments.

// settlementFile is the simulator's own settlement file for a day.
func (s *stack) settlementFile(day string) string {
	s.t.Helper()
	resp, err := http.Get(s.sim.URL + "/v1/settlements/" + day + ".csv")
	require.NoError(s.t, err)
	defer resp.Body.Close()
	require.Equal(s.t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return string(b)
}

// importSettlements posts a settlement file to the admin endpoint.
func (s *stack) importSettlements(m merchant, csv string) response {
	s.t.Helper()
	return s.do("POST", "/admin/v1/settlements?merchant_id="+m.ID, adminToken, csv, "Content-Type", "text/csv")
}

func decodeReport(t *testing.T, r response) (reconcile.Report, bool) {
	t.Helper()
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var out struct {
		OK bool `json:"ok"`
		reconcile.Report
	}
	require.NoError(t, json.Unmarshal(r.Body, &out), "%s", r.Body)
	return out.Report, out.OK
}

// payUnknown makes a payment whose charge outcome is ambiguous (the simulator applies fault)
// and waits until it is parked as unknown.
func (s *stack) payUnknown(m merchant, key, body, fault string) payment.Payment {
	s.t.Helper()
	s.setFaults(`{"rules":[{"on":"charge","action":"` + fault + `","count":1}]}`)
	r := s.pay(m, key, body)
	require.Equal(s.t, http.StatusAccepted, r.Status, "%s", r.Body)
	var p payment.Payment
	require.Eventually(s.t, func() bool {
		var err error
		p, err = db.PaymentByKey(context.Background(), mustUUID(s.t, m.ID), key)
		return err == nil && p.Status == payment.StatusUnknown
	}, 20*time.Second, 50*time.Millisecond)
	return p
}

func paymentByKey(t *testing.T, m merchant, key string) payment.Payment {
	t.Helper()
	p, err := db.PaymentByKey(context.Background(), mustUUID(t, m.ID), key)
	require.NoError(t, err)
	return p
}

func today() string { return time.Now().UTC().Format(time.DateOnly) }

// A charge the bank made but whose answer was lost: the bank's own settlement file resolves it
// as charged, exactly once, and a second import of the same file changes nothing.
func TestReconcileResolvesUnknownFromTheBanksFile(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")

	require.Equal(t, http.StatusCreated, s.pay(m, "paid", payBody("inv-0", "10.00", "TRY", acct)).Status)
	unknown := s.payUnknown(m, "lost", payBody("inv-1", "40.00", "TRY", acct), "drop_response")
	require.Equal(t, 1, s.simCount(unknown.ID.String()), "the bank moved the money")
	a := s.account(m, acct)
	require.Equal(t, "90.00", a["balance"])
	require.Equal(t, "40.00", a["reserved"], "an unknown payment keeps its reservation")

	file := s.settlementFile(today())
	require.Contains(t, file, unknown.ID.String())
	lines, err := reconcile.Parse(strings.NewReader(file))
	require.NoError(t, err, "the simulator's file parses")
	var chargeID string
	for _, l := range lines {
		if l.Reference == unknown.ID {
			chargeID = l.ProviderChargeID
		}
	}

	rep, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok, "%+v", rep.Mismatches)
	require.Equal(t, reconcile.Counts{Matched: 1, ResolvedCharged: 1}, rep.Counts)
	require.Equal(t, []reconcile.Day{reconcile.Day(today())}, rep.Days)

	p := paymentByKey(t, m, "lost")
	require.Equal(t, payment.StatusSucceeded, p.Status)
	require.Equal(t, chargeID, p.ProviderReference, "the bank's charge id is recorded")
	a = s.account(m, acct)
	require.Equal(t, "50.00", a["balance"], "the reservation was finalized: 10.00 + 40.00 captured")
	require.Equal(t, "0.00", a["reserved"])
	require.Equal(t, 1, s.simCount(unknown.ID.String()), "resolving never charges again")
	var res workflows.PaymentResult
	require.NoError(t, tc.GetWorkflow(context.Background(), workflows.PaymentWorkflowID(mustUUID(t, m.ID), "lost"), "").Get(context.Background(), &res))
	require.Equal(t, "succeeded", res.Status)
	final := s.pay(m, "lost", payBody("inv-1", "40.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, final.Status, "the merchant's retry now learns the outcome: %s", final.Body)
	requireVerified(t)

	// The same file again: everything simply matches, nothing moves.
	rep, ok = decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok)
	require.Equal(t, reconcile.Counts{Matched: 2}, rep.Counts)
	a = s.account(m, acct)
	require.Equal(t, "50.00", a["balance"])
	require.Equal(t, "0.00", a["reserved"])
	require.Equal(t, p, paymentByKey(t, m, "lost"))
	requireVerified(t)
}

// An unknown payment the bank never charged: a file covering its day that does not list it
// releases it (not charged), and the payer gets the reserved amount back.
func TestReconcileReleasesUnknownMissingFromCoveredDay(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")

	require.Equal(t, http.StatusCreated, s.pay(m, "paid", payBody("inv-0", "10.00", "TRY", acct)).Status)
	unknown := s.payUnknown(m, "timeout", payBody("inv-1", "40.00", "TRY", acct), "error_500")
	require.Equal(t, 0, s.simCount(unknown.ID.String()), "the bank answered 500 without moving money")
	require.Equal(t, "40.00", s.account(m, acct)["reserved"])

	file := s.settlementFile(today())
	require.NotContains(t, file, unknown.ID.String())
	rep, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok, "%+v", rep.Mismatches)
	require.Equal(t, reconcile.Counts{Matched: 1, ResolvedNotCharged: 1}, rep.Counts)

	p := paymentByKey(t, m, "timeout")
	require.Equal(t, payment.StatusFailed, p.Status)
	require.Equal(t, payment.FailureDeclined, p.FailureCode)
	a := s.account(m, acct)
	require.Equal(t, "90.00", a["balance"], "only the first payment moved money")
	require.Equal(t, "0.00", a["reserved"], "the reservation was released")
	require.Equal(t, 0, s.simCount(unknown.ID.String()))
	requireVerified(t)

	rep, ok = decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok)
	require.Equal(t, reconcile.Counts{Matched: 1}, rep.Counts, "a released payment is not touched again")
	require.Equal(t, p, paymentByKey(t, m, "timeout"))
}

// A file with no lines covers no day unless the day is declared (?date=): then it releases
// that day's unknown payments.
func TestReconcileEmptyFileWithDeclaredDay(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	unknown := s.payUnknown(m, "timeout", payBody("inv-1", "40.00", "TRY", acct), "error_500")
	file := s.settlementFile(today())
	require.Equal(t, strings.Join(reconcile.Header, ",")+"\n", file, "nothing settled today")

	rep, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok)
	require.Empty(t, rep.Days)
	require.Equal(t, reconcile.Counts{}, rep.Counts)
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "timeout").Status, "no covered day: nothing decided")

	r := s.do("POST", "/admin/v1/settlements?merchant_id="+m.ID+"&date="+today(), adminToken, file, "Content-Type", "text/csv")
	rep, ok = decodeReport(t, r)
	require.True(t, ok)
	require.Equal(t, reconcile.Counts{ResolvedNotCharged: 1}, rep.Counts)
	require.Equal(t, payment.StatusFailed, paymentByKey(t, m, "timeout").Status)
	require.Equal(t, "0.00", s.account(m, acct)["reserved"])
	require.Equal(t, 0, s.simCount(unknown.ID.String()))
	requireVerified(t)
}

// Disagreements are reported and never change a payment: a charge for a payment kasa
// recorded as failed, another amount, a succeeded payment missing from the file, a reference
// kasa does not know.
func TestReconcileReportsMismatchesWithoutChangingAnything(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")

	require.Equal(t, http.StatusCreated, s.pay(m, "a", payBody("inv-a", "10.00", "TRY", acct)).Status)
	s.setFaults(`{"rules":[{"on":"charge","action":"decline","count":1}]}`)
	require.Equal(t, http.StatusPaymentRequired, s.pay(m, "b", payBody("inv-b", "20.00", "TRY", acct)).Status)
	require.Equal(t, http.StatusCreated, s.pay(m, "c", payBody("inv-c", "30.00", "TRY", acct)).Status)
	pa, pb, pc := paymentByKey(t, m, "a"), paymentByKey(t, m, "b"), paymentByKey(t, m, "c")
	ghost := uuid.Must(uuid.NewV7())

	file := strings.Join(reconcile.Header, ",") + "\n" +
		fmt.Sprintf("%s,ch_b,%s,20.00,TRY,settled\n", today(), pb.ID) +
		fmt.Sprintf("%s,%s,%s,31.00,TRY,settled\n", today(), pc.ProviderReference, pc.ID) +
		fmt.Sprintf("%s,ch_ghost,%s,5.00,TRY,settled\n", today(), ghost)
	before := s.account(m, acct)
	totals, err := db.ReconcileTotals(context.Background())
	require.NoError(t, err)

	rep, ok := decodeReport(t, s.importSettlements(m, file))
	require.False(t, ok)
	// The run is kept (other tests import in parallel: at least this run's counts were added).
	after, err := db.ReconcileTotals(context.Background())
	require.NoError(t, err)
	require.GreaterOrEqual(t, after.Runs-totals.Runs, int64(1))
	require.GreaterOrEqual(t, after.Mismatches-totals.Mismatches, int64(4))
	require.False(t, after.LastRun.Before(totals.LastRun))
	metrics := string(s.do("GET", "/metrics", "", "").Body)
	require.Regexp(t, `kasa_reconcile_outcomes_total\{outcome="mismatch"\} [1-9]`, metrics)
	require.Contains(t, metrics, "kasa_reconcile_last_run_timestamp_seconds ")
	got := map[string]string{}
	for _, mm := range rep.Mismatches {
		got[mm.Reference] = mm.Kind
	}
	require.Equal(t, map[string]string{
		pb.ID.String(): reconcile.KindChargedButFailed,
		pc.ID.String(): reconcile.KindAmountDiffers,
		ghost.String(): reconcile.KindUnknownReference,
		pa.ID.String(): reconcile.KindSucceededButMissing,
	}, got)
	require.Equal(t, 4, rep.Counts.Mismatches)
	for _, mm := range rep.Mismatches {
		if mm.Kind == reconcile.KindAmountDiffers {
			require.Equal(t, 3, mm.Line)
			require.Contains(t, mm.Expected, "30.00 TRY")
			require.Contains(t, mm.Found, "31.00 TRY")
			require.Equal(t, workflows.PaymentWorkflowID(mustUUID(t, m.ID), "c"), mm.WorkflowID)
		}
	}

	require.Equal(t, pa, paymentByKey(t, m, "a"))
	require.Equal(t, pb, paymentByKey(t, m, "b"))
	require.Equal(t, pc, paymentByKey(t, m, "c"))
	require.Equal(t, before, s.account(m, acct))
	require.Equal(t, "60.00", before["balance"])
	require.Equal(t, 1, s.simCount(pa.ID.String()))
	require.Equal(t, 0, s.simCount(pb.ID.String()))
	require.Equal(t, 1, s.simCount(pc.ID.String()))
	requireVerified(t)
}

// A file that does not parse changes nothing and says what is wrong, line by line.
func TestReconcileRejectsInvalidFiles(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	unknown := s.payUnknown(m, "lost", payBody("inv-1", "40.00", "TRY", acct), "drop_response")

	file := strings.Join(reconcile.Header, ",") + "\n" +
		fmt.Sprintf("%s,ch_1,%s,40.00,TRY,settled\n", today(), unknown.ID) +
		fmt.Sprintf("%s,ch_2,%s,40.001,TRY,settled\n", today(), uuid.Must(uuid.NewV7()))
	r := s.importSettlements(m, file)
	require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
	require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"))
	body := r.json(t)
	require.Equal(t, "invalid_settlement_file", body["code"])
	require.Equal(t, []any{map[string]any{"field": "line 3", "message": `amount: "40.001": ` + payment.ErrTooManyDecimals.Error()}}, body["errors"])
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "lost").Status, "a rejected file settles nothing")

	r = s.do("POST", "/admin/v1/settlements", adminToken, file, "Content-Type", "application/json")
	require.Equal(t, http.StatusUnsupportedMediaType, r.Status)
	r = s.do("POST", "/admin/v1/settlements", m.APIKey, file, "Content-Type", "text/csv")
	require.Equal(t, http.StatusUnauthorized, r.Status, "merchants cannot import settlements")
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "lost").Status)
	require.Equal(t, "40.00", s.account(m, acct)["reserved"])
}
