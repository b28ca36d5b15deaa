package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"

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

// complete is file with a trailer declaring it complete for day as of asOf, in place of the
// simulator's own: the bank's file as it would have been made at asOf.
func complete(t *testing.T, file, day string, asOf time.Time) string {
	t.Helper()
	f, err := reconcile.ParseFile(strings.NewReader(file))
	require.NoError(t, err)
	var b strings.Builder
	require.NoError(t, reconcile.Write(&b, f.Lines, reconcile.Trailer{Day: reconcile.Day(day), Lines: len(f.Lines), AsOf: asOf}))
	return b.String()
}

// linesOnly is file without its trailers: a file that does not prove itself complete.
func linesOnly(t *testing.T, file string) string {
	t.Helper()
	f, err := reconcile.ParseFile(strings.NewReader(file))
	require.NoError(t, err)
	var b strings.Builder
	require.NoError(t, reconcile.Write(&b, f.Lines))
	return b.String()
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

// waitingForSettlement reports whether the payment's workflow is still running (parked until a
// settlement arrives).
func waitingForSettlement(t *testing.T, m merchant, key string) bool {
	t.Helper()
	d, err := tc.DescribeWorkflow(context.Background(), workflows.PaymentWorkflowID(mustUUID(t, m.ID), key), "")
	require.NoError(t, err)
	return d.Status == enums.WORKFLOW_EXECUTION_STATUS_RUNNING
}

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

	time.Sleep(bookingWindow)         // the bank could still book it until then
	file := s.settlementFile(today()) // the bank's file, complete (a trailer) as of now
	require.NotContains(t, file, unknown.ID.String())
	rep, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok, "%+v", rep.Mismatches)
	require.Equal(t, reconcile.Counts{Matched: 1, ResolvedNotCharged: 1}, rep.Counts)
	require.Equal(t, []reconcile.Resolution{{Outcome: workflows.OutcomeNotCharged, Reference: unknown.ID.String(), PaymentID: unknown.ID.String(),
		MerchantID: m.ID, WorkflowID: workflows.PaymentWorkflowID(mustUUID(t, m.ID), "timeout")}}, rep.Resolved)

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

// A file with no lines covers no day unless it declares one: ?date= makes it cover the day, but
// only a trailer proves it complete and releases that day's unknown payments.
func TestReconcileEmptyFileWithDeclaredDay(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	unknown := s.payUnknown(m, "timeout", payBody("inv-1", "40.00", "TRY", acct), "error_500")
	time.Sleep(bookingWindow)
	file := linesOnly(t, s.settlementFile(today()))
	require.Equal(t, strings.Join(reconcile.Header, ",")+"\n", file, "nothing settled today")

	rep, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok)
	require.Empty(t, rep.Days)
	require.Equal(t, reconcile.Counts{}, rep.Counts)
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "timeout").Status, "no covered day: nothing decided")

	r := s.do("POST", "/admin/v1/settlements?merchant_id="+m.ID+"&date="+today(), adminToken, file, "Content-Type", "text/csv")
	rep, ok = decodeReport(t, r)
	require.True(t, ok)
	require.Equal(t, reconcile.Counts{Pending: 1}, rep.Counts)
	require.Equal(t, reconcile.ReasonFileNotComplete, rep.Pending[0].Reason)
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "timeout").Status, "no trailer: the file may be cut short")
	require.Equal(t, "40.00", s.account(m, acct)["reserved"])

	rep, ok = decodeReport(t, s.importSettlements(m, complete(t, file, today(), time.Now())))
	require.True(t, ok)
	require.Equal(t, []reconcile.Day{reconcile.Day(today())}, rep.Days)
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
	time.Sleep(bookingWindow) // a missing charge is reported once the bank cannot book it any more
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

// A reference the bank lists twice is a charged_twice mismatch, and its unknown payment keeps its
// hold for a person to decide; the rest of the file still applies.
func TestReconcileListedTwiceKeepsThatHoldAndAppliesTheRest(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	twice := s.payUnknown(m, "twice", payBody("inv-twice", "10.00", "TRY", acct), "drop_response")
	once := s.payUnknown(m, "once", payBody("inv-once", "20.00", "TRY", acct), "drop_response")
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s.settlementFile(today())), "\n") {
		if strings.Contains(l, twice.ID.String()) {
			lines = append(lines, l, l)
		} else if strings.Contains(l, once.ID.String()) || strings.HasPrefix(l, reconcile.Header[0]) {
			lines = append(lines, l)
		}
	}

	rep, ok := decodeReport(t, s.importSettlements(m, strings.Join(lines, "\n")+"\n"))
	require.False(t, ok)
	require.Equal(t, reconcile.Counts{ResolvedCharged: 1, Mismatches: 1}, rep.Counts)
	require.Len(t, rep.Mismatches, 1)
	require.Equal(t, reconcile.KindChargedTwice, rep.Mismatches[0].Kind)
	require.Equal(t, twice.ID.String(), rep.Mismatches[0].Reference)
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "twice").Status, "a person decides")
	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "once").Status)
	a := s.account(m, acct)
	require.Equal(t, "80.00", a["balance"], "the listed-once payment is posted")
	require.Equal(t, "10.00", a["reserved"], "the listed-twice payment keeps its hold")
	requireVerified(t)
}

// A reference a later file lists on another day than an earlier import did is the bank saying it
// moved the money twice, across days: a charged_twice mismatch naming the earlier day, the
// payment left as it is. Importing a day's file again, or a dry run, is no second listing.
func TestReconcileListedOnTwoDaysIsChargedTwice(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	require.Equal(t, http.StatusCreated, s.pay(m, "paid", payBody("inv-paid", "30.00", "TRY", acct)).Status)
	lost := s.payUnknown(m, "lost", payBody("inv-lost", "10.00", "TRY", acct), "drop_response")
	paid := paymentByKey(t, m, "paid")
	yesterday := time.Now().UTC().AddDate(0, 0, -1).Format(time.DateOnly)
	file := func(day string) string {
		return strings.Join(reconcile.Header, ",") + "\n" +
			fmt.Sprintf("%s,%s,%s,30.00,TRY,settled\n", day, paid.ProviderReference, paid.ID) +
			fmt.Sprintf("%s,ch_lost,%s,10.00,TRY,settled\n", day, lost.ID)
	}

	rep, ok := decodeReport(t, s.importSettlements(m, file(yesterday)))
	require.True(t, ok, "%+v", rep.Mismatches)
	require.Equal(t, reconcile.Counts{Matched: 1, ResolvedCharged: 1}, rep.Counts)
	rep, ok = decodeReport(t, s.importSettlements(m, file(yesterday)))
	require.True(t, ok, "the same day again: %+v", rep.Mismatches)
	require.Equal(t, reconcile.Counts{Matched: 2}, rep.Counts)
	rep, ok = decodeReport(t, s.do("POST", "/admin/v1/settlements?dry_run=true&merchant_id="+m.ID, adminToken, file(today()),
		"Content-Type", "text/csv"))
	require.False(t, ok)
	require.Equal(t, 2, rep.Counts.Mismatches, "a dry run finds it too")

	before := s.account(m, acct)
	rep, ok = decodeReport(t, s.importSettlements(m, file(today())))
	require.False(t, ok)
	require.Equal(t, reconcile.Counts{Mismatches: 2}, rep.Counts)
	for _, mm := range rep.Mismatches {
		require.Equal(t, reconcile.KindChargedTwice, mm.Kind, "%+v", mm)
		require.Contains(t, mm.Found, yesterday, "names the earlier day")
	}
	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "lost").Status)
	require.Equal(t, before, s.account(m, acct), "nothing moved")
	rep, ok = decodeReport(t, s.importSettlements(m, file(yesterday)))
	require.False(t, ok, "the earlier day's file now says the same")
	require.Equal(t, reconcile.Counts{Mismatches: 2}, rep.Counts)
	require.Contains(t, rep.Mismatches[0].Found, today())
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

// An unknown payment the file does not list is released only once the bank can no longer book
// it: the payment is older than the booking window, and the file was made after that.
func TestReconcileWaitsForTheBookingWindow(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	unknown := s.payUnknown(m, "late", payBody("inv-1", "40.00", "TRY", acct), "error_500")
	stillWaiting := func() {
		t.Helper()
		require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "late").Status)
		require.Equal(t, "40.00", s.account(m, acct)["reserved"], "the hold stays")
		require.True(t, waitingForSettlement(t, m, "late"), "the workflow still waits for a settlement")
	}

	// Younger than the window (an hour here, less near midnight: a window reaching into tomorrow
	// is another reason, a file that does not cover that day): the bank may still book it.
	midnight := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	window := min(time.Hour, time.Until(midnight)/2)
	young := &reconcile.Reconciler{Store: db, Settler: workflows.Starter{Client: tc, TaskQueue: s.queue}, BookingWindow: window}
	first, err := young.Import(context.Background(), strings.NewReader(complete(t, s.settlementFile(today()), today(), time.Now())),
		reconcile.Options{Merchants: []uuid.UUID{mustUUID(t, m.ID)}})
	require.NoError(t, err)
	require.Equal(t, reconcile.Counts{Pending: 1}, first.Counts)
	require.Equal(t, reconcile.ReasonBookingWindow, first.Pending[0].Reason, first.Pending[0].Detail)
	require.Equal(t, unknown.ID.String(), first.Pending[0].PaymentID)
	stillWaiting()

	// Past the window, but the file was made within it (a late booking would be missing from it).
	time.Sleep(bookingWindow)
	stale := complete(t, s.settlementFile(today()), today(), unknown.UpdatedAt.Add(bookingWindow/2))
	rep, ok := decodeReport(t, s.importSettlements(m, stale))
	require.True(t, ok)
	require.Equal(t, reconcile.Counts{Pending: 1}, rep.Counts)
	require.Equal(t, reconcile.ReasonBookingWindow, rep.Pending[0].Reason, rep.Pending[0].Detail)
	stillWaiting()

	// A file made after the window: released.
	rep, ok = decodeReport(t, s.importSettlements(m, complete(t, s.settlementFile(today()), today(), time.Now())))
	require.True(t, ok, "%+v", rep.Mismatches)
	require.Equal(t, reconcile.Counts{ResolvedNotCharged: 1}, rep.Counts)
	require.Equal(t, payment.StatusFailed, paymentByKey(t, m, "late").Status)
	require.Equal(t, "0.00", s.account(m, acct)["reserved"])
	require.False(t, waitingForSettlement(t, m, "late"))
	requireVerified(t)
}

// A dry run reports what the import would do, and does nothing: no payment, hold or workflow
// changes. The import that follows does exactly what it said.
func TestReconcileDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	require.Equal(t, http.StatusCreated, s.pay(m, "paid", payBody("inv-0", "10.00", "TRY", acct)).Status)
	charged := s.payUnknown(m, "lost", payBody("inv-1", "20.00", "TRY", acct), "drop_response")
	notCharged := s.payUnknown(m, "timeout", payBody("inv-2", "30.00", "TRY", acct), "error_500")
	time.Sleep(bookingWindow)
	file := complete(t, s.settlementFile(today()), today(), time.Now())
	payments := func() []payment.Payment {
		return []payment.Payment{paymentByKey(t, m, "paid"), paymentByKey(t, m, "lost"), paymentByKey(t, m, "timeout")}
	}
	before, account := payments(), s.account(m, acct)
	require.Equal(t, "50.00", account["reserved"])

	r := s.do("POST", "/admin/v1/settlements?dry_run=true&merchant_id="+m.ID, adminToken, file, "Content-Type", "text/csv")
	dry, ok := decodeReport(t, r)
	require.True(t, ok, "%+v", dry.Mismatches)
	require.True(t, dry.DryRun, "the report says it was a dry run")
	require.Equal(t, reconcile.Counts{Matched: 1, ResolvedCharged: 1, ResolvedNotCharged: 1}, dry.Counts)
	require.Len(t, dry.Resolved, 2)
	require.Equal(t, charged.ID.String(), dry.Resolved[0].PaymentID)
	require.Equal(t, workflows.OutcomeCharged, dry.Resolved[0].Outcome)
	require.Equal(t, notCharged.ID.String(), dry.Resolved[1].PaymentID)
	require.Equal(t, workflows.OutcomeNotCharged, dry.Resolved[1].Outcome)

	require.Equal(t, before, payments(), "no payment changed")
	require.Equal(t, account, s.account(m, acct), "no hold released or captured")
	require.True(t, waitingForSettlement(t, m, "lost"))
	require.True(t, waitingForSettlement(t, m, "timeout"))
	require.Equal(t, 1, s.simCount(charged.ID.String()))

	done, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok, "%+v", done.Mismatches)
	require.False(t, done.DryRun)
	dry.DryRun = false
	require.Equal(t, dry, done, "the import did what the dry run said")
	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "lost").Status)
	require.Equal(t, payment.StatusFailed, paymentByKey(t, m, "timeout").Status)
	require.Equal(t, "0.00", s.account(m, acct)["reserved"])
	requireVerified(t)
}

// A file cut short at a line boundary still parses, but has lost its trailer: it settles what
// it lists as charged and releases nothing, so a charge it lost never frees a hold. A file whose
// trailer disagrees with its lines is refused whole.
func TestReconcileTruncatedFileReleasesNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	first := s.payUnknown(m, "first", payBody("inv-1", "10.00", "TRY", acct), "drop_response")
	second := s.payUnknown(m, "second", payBody("inv-2", "20.00", "TRY", acct), "drop_response")
	s.payUnknown(m, "never", payBody("inv-3", "30.00", "TRY", acct), "error_500")
	time.Sleep(bookingWindow)
	full := complete(t, s.settlementFile(today()), today(), time.Now())
	rows := strings.SplitAfter(full, "\n")
	require.Len(t, rows, 5, "header, two charges, the trailer and the empty rest:\n%s", full)
	require.Contains(t, rows[1], first.ID.String())
	require.Contains(t, rows[2], second.ID.String())

	// A line lost in the middle, trailer kept: refused, nothing changed.
	r := s.importSettlements(m, rows[0]+rows[1]+rows[3])
	require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
	require.Contains(t, string(r.Body), "declares 2 line(s)")
	require.Equal(t, "60.00", s.account(m, acct)["reserved"])

	// Cut after the first charge.
	rep, ok := decodeReport(t, s.importSettlements(m, rows[0]+rows[1]))
	require.True(t, ok, "%+v", rep.Mismatches)
	require.Empty(t, rep.Complete)
	require.Equal(t, reconcile.Counts{ResolvedCharged: 1, Pending: 2}, rep.Counts)
	for _, p := range rep.Pending {
		require.Equal(t, reconcile.ReasonFileNotComplete, p.Reason)
	}
	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "first").Status)
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "second").Status, "charged by the bank: never released")
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "never").Status)
	a := s.account(m, acct)
	require.Equal(t, "50.00", a["reserved"], "both holds stay")
	require.True(t, waitingForSettlement(t, m, "second"))
	require.True(t, waitingForSettlement(t, m, "never"))

	// The whole file settles the rest.
	rep, ok = decodeReport(t, s.importSettlements(m, full))
	require.True(t, ok, "%+v", rep.Mismatches)
	require.Equal(t, reconcile.Counts{Matched: 1, ResolvedCharged: 1, ResolvedNotCharged: 1}, rep.Counts)
	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "second").Status)
	require.Equal(t, payment.StatusFailed, paymentByKey(t, m, "never").Status)
	require.Equal(t, "0.00", s.account(m, acct)["reserved"])
	require.Equal(t, 1, s.simCount(second.ID.String()))
	requireVerified(t)
}

// A file for another day releases nothing of a day it does not cover: yesterday's complete
// file, today's lines declared (or trailed) as yesterday's.
func TestReconcileWrongDayFileReleasesNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	require.Equal(t, http.StatusCreated, s.pay(m, "paid", payBody("inv-0", "10.00", "TRY", acct)).Status)
	s.payUnknown(m, "timeout", payBody("inv-1", "40.00", "TRY", acct), "error_500")
	time.Sleep(bookingWindow)
	yesterday := time.Now().UTC().AddDate(0, 0, -1).Format(time.DateOnly)
	todays := linesOnly(t, s.settlementFile(today()))
	unchanged := func() {
		t.Helper()
		require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, "timeout").Status)
		require.Equal(t, "40.00", s.account(m, acct)["reserved"])
		require.True(t, waitingForSettlement(t, m, "timeout"))
	}

	rep, ok := decodeReport(t, s.importSettlements(m, complete(t, s.settlementFile(yesterday), yesterday, time.Now())))
	require.True(t, ok)
	require.Equal(t, []reconcile.Day{reconcile.Day(yesterday)}, rep.Days)
	require.Equal(t, reconcile.Counts{}, rep.Counts)
	unchanged()

	r := s.do("POST", "/admin/v1/settlements?merchant_id="+m.ID+"&date="+yesterday, adminToken,
		complete(t, todays, today(), time.Now()), "Content-Type", "text/csv")
	require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
	require.Contains(t, string(r.Body), "not one of the declared days")
	unchanged()

	r = s.importSettlements(m, todays+"trailer,"+yesterday+",0,"+time.Now().UTC().Format(time.RFC3339)+",,\n")
	require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
	require.Contains(t, string(r.Body), "has no trailer")
	unchanged()

	rep, ok = decodeReport(t, s.importSettlements(m, complete(t, todays, today(), time.Now())))
	require.True(t, ok, "%+v", rep.Mismatches)
	require.Equal(t, reconcile.Counts{Matched: 1, ResolvedNotCharged: 1}, rep.Counts, "the right file releases it")
	requireVerified(t)
}

// A one-merchant file imported without a scope (no merchant_id, no scope=all, no scope row)
// settles what it lists and releases nothing else: every unlisted unknown payment stays unknown,
// pending for lack of a scope. merchant_id releases that merchant's only; scope=all the rest.
func TestReconcileOneMerchantFileWithoutScope(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	mA, mB := s.newMerchant(), s.newMerchant()
	acctA, acctB := s.newAccount(mA, "TRY", "100.00"), s.newAccount(mB, "TRY", "100.00")
	require.Equal(t, http.StatusCreated, s.pay(mA, "paid", payBody("inv-0", "10.00", "TRY", acctA)).Status)
	unknownA := s.payUnknown(mA, "timeout", payBody("inv-1", "20.00", "TRY", acctA), "error_500")
	unknownB := s.payUnknown(mB, "timeout", payBody("inv-1", "30.00", "TRY", acctB), "error_500")
	time.Sleep(bookingWindow)

	// Merchant A's file as a per-merchant bank sends it: A's lines, a trailer, no scope row.
	f, err := reconcile.ParseFile(strings.NewReader(s.settlementFile(today())))
	require.NoError(t, err)
	var linesA []reconcile.Line
	for _, l := range f.Lines {
		if p, err := db.Payment(context.Background(), l.Reference); err == nil && p.MerchantID.String() == mA.ID {
			linesA = append(linesA, l)
		}
	}
	require.Len(t, linesA, 1)
	var file strings.Builder
	require.NoError(t, reconcile.Write(&file, linesA, reconcile.Trailer{Day: reconcile.Day(today()), Lines: 1, AsOf: time.Now()}))

	post := func(query string) reconcile.Report {
		t.Helper()
		rep, ok := decodeReport(t, s.do("POST", "/admin/v1/settlements"+query, adminToken, file.String(), "Content-Type", "text/csv"))
		require.True(t, ok, "%+v", rep.Mismatches)
		return rep
	}
	// Other tests share the database: their merchants' unknown payments of today are pending too.
	pendingOf := func(rep reconcile.Report) map[string]string {
		out := map[string]string{}
		for _, p := range rep.Pending {
			if p.MerchantID == mA.ID || p.MerchantID == mB.ID {
				out[p.PaymentID] = p.Reason
			}
		}
		return out
	}
	rep := post("")
	require.Equal(t, reconcile.ScopeNone, rep.Scope)
	require.Equal(t, 1, rep.Counts.Matched)
	require.Zero(t, rep.Counts.ResolvedNotCharged, "nothing unlisted is released without a scope")
	require.Empty(t, rep.Resolved)
	require.Equal(t, map[string]string{unknownA.ID.String(): reconcile.ReasonScopeNotDeclared, unknownB.ID.String(): reconcile.ReasonScopeNotDeclared},
		pendingOf(rep))
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, mA, "timeout").Status)
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, mB, "timeout").Status, "another merchant's hold is never released by A's file")
	require.Equal(t, "30.00", s.account(mB, acctB)["reserved"])

	rep = post("?merchant_id=" + mA.ID)
	require.Equal(t, reconcile.ScopeMerchants, rep.Scope)
	require.Equal(t, reconcile.Counts{Matched: 1, ResolvedNotCharged: 1}, rep.Counts)
	require.Equal(t, unknownA.ID.String(), rep.Resolved[0].PaymentID)
	require.Equal(t, payment.StatusFailed, paymentByKey(t, mA, "timeout").Status)
	require.Equal(t, payment.StatusUnknown, paymentByKey(t, mB, "timeout").Status)

	r := s.do("POST", "/admin/v1/settlements?scope=all&merchant_id="+mA.ID, adminToken, file.String(), "Content-Type", "text/csv")
	require.Equal(t, http.StatusBadRequest, r.Status, "a scope is merchants or all, not both")

	// scope=all with a file that names its merchants itself (a scope row): the merchants both
	// declare, A and B here, and no other test's.
	withRow := &reconcile.File{Lines: linesA, Scope: &reconcile.Scope{Merchants: []uuid.UUID{mustUUID(t, mA.ID), mustUUID(t, mB.ID)}, Charges: true},
		Trailers: []reconcile.Trailer{{Day: reconcile.Day(today()), Lines: 1, AsOf: time.Now()}}}
	file.Reset()
	require.NoError(t, reconcile.WriteFile(&file, withRow))
	rep = post("?scope=all")
	require.Equal(t, reconcile.ScopeMerchants, rep.Scope)
	require.ElementsMatch(t, []string{mA.ID, mB.ID}, rep.Merchants)
	require.Equal(t, reconcile.Counts{Matched: 1, ResolvedNotCharged: 1}, rep.Counts)
	require.Equal(t, unknownB.ID.String(), rep.Resolved[0].PaymentID)
	require.Equal(t, "0.00", s.account(mB, acctB)["reserved"])
	requireVerified(t)
}

// beforeFirstSettle runs fn once, just before an import's first settle reaches Temporal: what
// can happen between the import's read of a payment and its settlement.
type beforeFirstSettle struct {
	reconcile.Settler
	once sync.Once
	fn   func()
}

func (b *beforeFirstSettle) Settle(ctx context.Context, id string, st workflows.Settlement) (string, error) {
	b.once.Do(b.fn)
	return b.Settler.Settle(ctx, id, st)
}

// reuseKeyBeforeTheSettle imports f with the workflows' settle update, but before its first
// settlement arrives the payment under key is settled by hand (outcome), its record expires and
// the key makes a new payment whose bank answer is lost. It returns the new payment.
func (s *stack) reuseKeyBeforeTheSettle(m merchant, key string, hand workflows.Settlement, body string, f *reconcile.File) payment.Payment {
	t := s.t
	mid := mustUUID(t, m.ID)
	ctx := context.Background()
	starter := workflows.Starter{Client: tc, TaskQueue: s.queue}
	var p2 payment.Payment
	settler := &beforeFirstSettle{Settler: starter, fn: func() {
		_, err := starter.Settle(ctx, workflows.PaymentWorkflowID(mid, key), hand)
		require.NoError(t, err)
		require.NoError(t, tc.GetWorkflow(ctx, workflows.PaymentWorkflowID(mid, key), "").Get(ctx, nil))
		expire(t, m.ID, key)
		p2 = s.payUnknown(m, key, body, "drop_response")
		require.Equal(t, 1, s.simCount(p2.ID.String()), "the bank charged the new payment")
	}}
	r := &reconcile.Reconciler{Store: db, Settler: settler, SettleTimeout: 30 * time.Second, BookingWindow: bookingWindow}
	_, err := r.Reconcile(ctx, f, reconcile.Options{Merchants: []uuid.UUID{mid}})
	require.NoError(t, err)
	return p2
}

// A settlement is for the payment the import read: a key reused meanwhile (its record expired)
// names another payment, which the file does not list and which keeps its hold.
func TestReconcileSettlesOnlyThePaymentItRead(t *testing.T) {
	t.Parallel()
	t.Run("charged", func(t *testing.T) {
		t.Parallel()
		s := newStack(t, workflows.CapabilityNone)
		m := s.newMerchant()
		acct := s.newAccount(m, "TRY", "100.00")
		p1 := s.payUnknown(m, "k", payBody("inv-1", "10.00", "TRY", acct), "drop_response")
		f, err := reconcile.ParseFile(strings.NewReader(s.settlementFile(today())))
		require.NoError(t, err)
		var listed []reconcile.Line
		for _, l := range f.Lines {
			if l.Reference == p1.ID {
				listed = append(listed, l)
			}
		}
		require.Len(t, listed, 1)
		hand := workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: listed[0].ProviderChargeID}
		p2 := s.reuseKeyBeforeTheSettle(m, "k", hand, payBody("inv-2", "10.00", "TRY", acct), &reconcile.File{Lines: listed})
		got, err := db.Payment(context.Background(), p2.ID)
		require.NoError(t, err)
		require.Equal(t, payment.StatusUnknown, got.Status, "the new payment took the file's charge %q", got.ProviderReference)
	})
	t.Run("not charged", func(t *testing.T) {
		t.Parallel()
		s := newStack(t, workflows.CapabilityNone)
		m := s.newMerchant()
		acct := s.newAccount(m, "TRY", "100.00")
		p1 := s.payUnknown(m, "k", payBody("inv-1", "10.00", "TRY", acct), "error_500")
		require.Equal(t, 0, s.simCount(p1.ID.String()))
		time.Sleep(bookingWindow)
		f, err := reconcile.ParseFile(strings.NewReader(s.settlementFile(today())))
		require.NoError(t, err)
		require.NotEmpty(t, f.Trailers)
		hand := workflows.Settlement{Outcome: workflows.OutcomeNotCharged}
		p2 := s.reuseKeyBeforeTheSettle(m, "k", hand, payBody("inv-2", "25.00", "TRY", acct), f)
		got, err := db.Payment(context.Background(), p2.ID)
		require.NoError(t, err)
		require.Equal(t, payment.StatusUnknown, got.Status, "the bank charged the new payment: the release was for the one before")
		require.Equal(t, "25.00", s.account(m, acct)["reserved"], "the new payment's hold is kept")
	})
}

// A settlement the workflow took but is still applying when the import stops waiting (here a
// manual payment's void, sent again at a slow bank) is pending, not a failure: importing again
// meanwhile says the same, and once applied the next import finds the payment settled.
func TestReconcileSettlementStillBeingApplied(t *testing.T) {
	t.Parallel()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityInquiry, temporal: tc, bookingWindow: 100 * time.Millisecond})
	m := s.newMerchant()
	id, payer, _ := s.authorize(m, "auth-slow-void", "70.00", "100.00")
	s.setFaults(`{"rules":[{"on":"void","action":"error_500","count":3}]}`)
	r := s.command(m, id, "cancel", "slow-void", "")
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.Eventually(t, func() bool { return paymentByKey(t, m, "auth-slow-void").Status == payment.StatusUnknown },
		30*time.Second, 100*time.Millisecond)
	time.Sleep(bookingWindow)
	s.setFaults(`{"rules":[{"on":"void","action":"delay","delay_ms":3500,"count":1}]}`)

	f, err := reconcile.ParseFile(strings.NewReader(s.settlementFile(today())))
	require.NoError(t, err)
	rc := &reconcile.Reconciler{Store: db, Settler: workflows.Starter{Client: tc, TaskQueue: s.queue},
		SettleTimeout: 1500 * time.Millisecond, BookingWindow: bookingWindow}
	scope := reconcile.Options{Merchants: []uuid.UUID{mustUUID(t, m.ID)}}
	for i := range 2 { // the second import while the void is still on its way to the bank
		rep, err := rc.Reconcile(context.Background(), f, scope)
		require.NoError(t, err)
		require.Empty(t, rep.Mismatches, "import %d", i+1)
		require.Len(t, rep.Pending, 1, "import %d", i+1)
		require.Equal(t, reconcile.ReasonSettling, rep.Pending[0].Reason)
		require.Equal(t, id, rep.Pending[0].PaymentID)
	}
	require.Eventually(t, func() bool { return paymentByKey(t, m, "auth-slow-void").Status == payment.StatusCanceled },
		30*time.Second, 100*time.Millisecond)
	require.True(t, s.held(id).Voided, "voided at the bank")
	require.Zero(t, reserved(t, payer))
	rep, err := rc.Reconcile(context.Background(), f, scope)
	require.NoError(t, err)
	require.Empty(t, rep.Mismatches)
	require.Empty(t, rep.Pending)
	requireVerified(t)
}

// Daily files settle an unknown payment whose charge window runs over midnight: day 1's complete
// file, imported first for a scope covering the payment, proves day 1; day 2's complete file then
// covers the whole window and releases it, with no file covering both days. It stays unknown when
// day 1 was proved for another merchant only, has no trailer, was complete only until before
// midnight, or listed it. The import's clock is the morning after day 2 began, and its booking
// window stretches the window of a payment made today over midnight.
func TestReconcileDailyFilesSettleAWindowOverMidnight(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	ctx := context.Background()
	tests := []struct {
		name     string
		day1     func(t *testing.T, p payment.Payment, d1, d2 reconcile.Day) (string, reconcile.Options)
		released bool
	}{
		{"day 1 complete for its merchant", func(t *testing.T, p payment.Payment, d1, d2 reconcile.Day) (string, reconcile.Options) {
			return complete(t, s.settlementFile(string(d1)), string(d1), d2.Start().Add(5*time.Minute)), reconcile.Options{Merchants: []uuid.UUID{p.MerchantID}}
		}, true},
		{"day 1 complete for another merchant only", func(t *testing.T, p payment.Payment, d1, d2 reconcile.Day) (string, reconcile.Options) {
			return complete(t, s.settlementFile(string(d1)), string(d1), d2.Start().Add(5*time.Minute)), reconcile.Options{Merchants: []uuid.UUID{payment.NewID()}}
		}, false},
		{"day 1 without a trailer", func(t *testing.T, p payment.Payment, d1, d2 reconcile.Day) (string, reconcile.Options) {
			return linesOnly(t, s.settlementFile(string(d1))), reconcile.Options{Days: []reconcile.Day{d1}, Merchants: []uuid.UUID{p.MerchantID}}
		}, false},
		{"day 1 complete until a second before midnight", func(t *testing.T, p payment.Payment, d1, d2 reconcile.Day) (string, reconcile.Options) {
			return complete(t, s.settlementFile(string(d1)), string(d1), d2.Start().Add(-time.Second)), reconcile.Options{Merchants: []uuid.UUID{p.MerchantID}}
		}, false},
		{"day 1 listed it (with another amount: left unknown)", func(t *testing.T, p payment.Payment, d1, d2 reconcile.Day) (string, reconcile.Options) {
			var b strings.Builder
			l := reconcile.Line{SettlementDate: d1, ProviderChargeID: "ch_day1", Reference: p.ID, AmountMinor: p.AmountMinor + 1, Currency: p.Currency,
				Status: reconcile.StatusSettled}
			require.NoError(t, reconcile.Write(&b, []reconcile.Line{l}, reconcile.Trailer{Day: d1, Lines: 1, AsOf: d2.Start().Add(5 * time.Minute)}))
			return b.String(), reconcile.Options{Merchants: []uuid.UUID{p.MerchantID}}
		}, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := s.newMerchant()
			acct := s.newAccount(m, "TRY", "100.00")
			key := fmt.Sprintf("midnight-%d", i)
			p := s.payUnknown(m, key, payBody("inv-1", "40.00", "TRY", acct), "error_500")
			d1 := reconcile.DayOf(p.CreatedAt)
			d2 := d1.Next()
			// The bank may book it until 5 s after midnight; the imports run at 01:00 on day 2.
			r := &reconcile.Reconciler{Store: db, Settler: workflows.Starter{Client: tc, TaskQueue: s.queue}, SettleTimeout: 30 * time.Second,
				BookingWindow: d2.Start().Add(5 * time.Second).Sub(p.UpdatedAt), Now: func() time.Time { return d2.Start().Add(time.Hour) }}

			file1, opts := tt.day1(t, p, d1, d2)
			rep, err := r.Import(ctx, strings.NewReader(file1), opts)
			require.NoError(t, err)
			require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, key).Status, "day 1 alone never covers the window: %+v", rep)

			var b strings.Builder // the bank's file of day 2, made at 00:30: nothing settled
			require.NoError(t, reconcile.Write(&b, nil, reconcile.Trailer{Day: d2, AsOf: d2.Start().Add(30 * time.Minute)}))
			file2 := b.String()
			rep, err = r.Import(ctx, strings.NewReader(file2), reconcile.Options{Merchants: []uuid.UUID{p.MerchantID}})
			require.NoError(t, err)
			require.True(t, rep.OK(), "%+v", rep.Mismatches)
			if !tt.released {
				require.Equal(t, reconcile.Counts{Pending: 1}, rep.Counts)
				require.Equal(t, reconcile.ReasonWindowNotCovered, rep.Pending[0].Reason, rep.Pending[0].Detail)
				require.Contains(t, rep.Pending[0].Detail, string(d1))
				require.Equal(t, payment.StatusUnknown, paymentByKey(t, m, key).Status)
				require.Equal(t, "40.00", s.account(m, acct)["reserved"], "its hold kept")
				require.True(t, waitingForSettlement(t, m, key))
				return
			}
			require.Equal(t, reconcile.Counts{ResolvedNotCharged: 1}, rep.Counts, "%+v", rep.Pending)
			require.Equal(t, []reconcile.Resolution{{Outcome: workflows.OutcomeNotCharged, Reference: p.ID.String(), PaymentID: p.ID.String(),
				MerchantID: m.ID, WorkflowID: workflows.PaymentWorkflowID(p.MerchantID, key)}}, rep.Resolved)
			got := paymentByKey(t, m, key)
			require.Equal(t, payment.StatusFailed, got.Status)
			require.Equal(t, payment.FailureDeclined, got.FailureCode)
			a := s.account(m, acct)
			require.Equal(t, "100.00", a["balance"], "nothing was captured")
			require.Equal(t, "0.00", a["reserved"], "the hold was released")
			require.Equal(t, 0, s.simCount(p.ID.String()), "nothing was charged at the bank")
			requireVerified(t)

			// Day 2's file again: the payment is settled, nothing moves twice.
			rep, err = r.Import(ctx, strings.NewReader(file2), reconcile.Options{Merchants: []uuid.UUID{p.MerchantID}})
			require.NoError(t, err)
			require.Equal(t, reconcile.Counts{}, rep.Counts)
			require.Equal(t, got, paymentByKey(t, m, key))
			require.Equal(t, "0.00", s.account(m, acct)["reserved"])
			requireVerified(t)
		})
	}
}
