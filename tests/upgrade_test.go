package tests

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/tools/banksim"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// previousRelease is the release a rolling upgrade starts from (docs/deployment.md, "Upgrades"):
// the last release before this one's newest migration and workflow Revision (82ba560: Revision 11,
// before migration 39). Move it when a release brings either: TestNewAPIBeforeTheNewWorkers needs
// an older Revision than CurrentRevision.
const previousRelease = "82ba560"

// previousBuild is held while the previous release is built: the tests that use it run in parallel.
var previousBuild sync.Mutex

// previousKasa builds the previous release's kasa from the git history, once per machine (the Go
// build cache does the rest), and links it under dir as bin/kasa-old. A build has a directory of
// its own and is renamed into the cache when done: test processes of two clones at once never
// build in each other's tree.
func previousKasa(t *testing.T, dir string) string {
	t.Helper()
	previousBuild.Lock()
	defer previousBuild.Unlock()
	cache := filepath.Join(os.TempDir(), "kasa-release-"+previousRelease)
	built := filepath.Join(cache, "kasa")
	if _, err := os.Stat(built); err != nil {
		require.NoError(t, os.MkdirAll(cache, 0o755))
		work, err := os.MkdirTemp(cache, "build-")
		require.NoError(t, err)
		defer os.RemoveAll(work)
		ctx, src, tarball := context.Background(), filepath.Join(work, "src"), filepath.Join(work, "src.tar")
		// From the repository's root: in tests/ git archive would take only that folder.
		if _, err := (devenv.Command{Dir: ".."}).Run(ctx, "git", "archive", "--format=tar", "-o", tarball, previousRelease); err != nil {
			t.Fatalf("%v\nthe upgrade tests build the previous release from the git history: run them in a full clone of kasa (git fetch --unshallow)", err)
		}
		require.NoError(t, os.Mkdir(src, 0o755))
		_, err = devenv.Command{}.Run(ctx, "tar", "-xf", tarball, "-C", src)
		require.NoError(t, err)
		_, err = devenv.Command{Dir: src}.Run(ctx, "go", "build", "-o", filepath.Join(work, "kasa"), "./cmd/kasa")
		require.NoError(t, err, "go build of release %s", previousRelease)
		require.NoError(t, os.Rename(filepath.Join(work, "kasa"), built))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	bin := filepath.Join(dir, "bin", "kasa-old")
	if err := os.Link(built, bin); err != nil {
		b, err := os.ReadFile(built)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(bin, b, 0o755))
	}
	return bin
}

// A rolling upgrade from the previous release, as docs/deployment.md "Upgrades" has an operator
// run it while a client pays all along: the new release's kasa migrate (as the owner, granting the
// application role the processes connect as) while the old processes
// serve, then the workers one at a time (the old one stopped while a charge is at the bank), then
// the APIs, then the relays (the old one stopped while a webhook is at the merchant). Whatever
// the old release began the new one finishes, once: manual payments the old release authorized
// are captured through the old API and voided through the new one, run by the new worker, as is a
// refund sent to the old API; every key is answered by the new API byte for byte as the old one
// answered it, and every event reaches the merchant. No process logs an error on the other
// release's schema or rows, no hold is left, and the ledger verifies.
func TestRollingUpgradeFromThePreviousRelease(t *testing.T) {
	t.Parallel()
	// As deployed: the processes connect as the application role, kasa migrate as the owner.
	roles := newRoleDB(t)
	s := roleStack(t, roles, true)
	s.syncWait = "1s"
	natsURL, stopBroker, err := outbox.StartEmbedded(filepath.Join(t.TempDir(), "nats"))
	require.NoError(t, err)
	t.Cleanup(stopBroker)
	var hold atomic.Bool // the merchant holds each webhook while set, until the request ends
	var held atomic.Int32
	hook := testkit.NewHook(t, testkit.HookOptions{EventIDHeader: outbox.HeaderEventID, SignatureHeader: outbox.HeaderSignature,
		Respond: func(_ int, _ http.ResponseWriter, r *http.Request) {
			if hold.Load() {
				held.Add(1)
				<-r.Context().Done()
			}
		}})

	// The previous release serves.
	s.startBanksim()
	oldWorker := startProc(t, s.dir, s.old, "worker-old", s.env(), "worker")
	oldAddr := s.apiAddr
	oldAPI := startProc(t, s.dir, s.old, "api-old", s.env(), "api")
	oldAPI.waitHTTP("http://" + oldAddr + "/readyz")
	oldRelay, _, _ := s.startRelayOf(s.old, "relay-old", "KASA_NATS_URL", natsURL)
	merchantBody := fmt.Sprintf(`{"name":"Upgrade","webhook_url":%q}`, hook.URL)
	created := s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, merchantBody, "Idempotency-Key", "merchant")
	require.Equal(t, http.StatusCreated, created.Status, "%s", created.Body)
	m := merchant{ID: created.json(t)["id"].(string), APIKey: created.json(t)["api_key"].(string)}
	acct := s.account(m, "TRY", "1000.00")
	paid, err := s.pay(m, "paid", payBody("inv-paid", "10.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, paid.Status, "%s", paid.Body)
	paidID := paid.json(t)["id"].(string)
	manual := map[string]string{} // key -> id: authorized by the old release, captured or voided by the new
	for _, key := range []string{"to-capture", "to-void"} {
		r, err := s.pay(m, key, manualBody("inv-"+key, "50.00", acct))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Equal(t, "requires_capture", r.json(t)["status"])
		manual[key] = r.json(t)["id"].(string)
	}

	// A client pays all along, a payment every 150 ms, through whichever API serves.
	var (
		api     atomic.Pointer[string]
		mu      sync.Mutex
		answers = map[string][]response{} // key -> every answer, in order
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		turn    sync.Mutex // held through each of the client's payments; the test takes it to pay alone
	)
	api.Store(&oldAddr)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(150 * time.Millisecond):
			}
			key := fmt.Sprintf("client-%03d", i)
			turn.Lock()
			r, err := httpCall("POST", "http://"+*api.Load()+"/v1/payments", m.APIKey, payBody("inv-"+key, "1.00", "TRY", acct), "Idempotency-Key", key)
			turn.Unlock()
			if err == nil {
				mu.Lock()
				answers[key] = append(answers[key], r)
				mu.Unlock()
			}
		}
	})

	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(answers) >= 3 }, 30*time.Second, 50*time.Millisecond,
		"the client pays with the previous release")

	// 1. The new release's migrations, the old release serving.
	migrateAsOwner(t, s.dir, s.bin, roles)

	// 2. The workers, one at a time: the old one is stopped while a charge is at the bank. The
	// bank delays the next charge it gets: the client waits until that charge is there, none of
	// its own payments charging, so that it is this payment's.
	turn.Lock()
	conn := connect(t, s.dbURL)
	require.Eventually(t, func() bool {
		var n int
		err := conn.QueryRow(context.Background(), `SELECT count(*) FROM payments WHERE status = 'processing'`).Scan(&n)
		return err == nil && n == 0
	}, 30*time.Second, 50*time.Millisecond, "the client's payments finished")
	s.setFaults(`{"rules":[{"on":"charge","action":"delay","delay_ms":3000,"count":1}]}`)
	var (
		atBank     response
		atBankErr  error
		atBankDone = make(chan struct{})
	)
	go func() {
		defer close(atBankDone)
		atBank, atBankErr = s.pay(m, "at-the-bank", payBody("inv-at-the-bank", "3.00", "TRY", acct))
	}()
	s.waitFaultsUsed()
	turn.Unlock()
	<-atBankDone
	require.NoError(t, atBankErr)
	require.Equal(t, http.StatusAccepted, atBank.Status, "%s", atBank.Body)
	newWorker := startProc(t, s.dir, s.bin, "worker-new", s.env(), "worker")
	oldWorker.stopCleanly(30 * time.Second)
	capture := s.mustCall("POST", s.apiURL()+"/v1/payments/"+manual["to-capture"]+"/capture", m.APIKey, `{"amount":"30.00"}`, "Idempotency-Key", "capture", "Content-Type", "application/json")
	require.Equal(t, http.StatusCreated, capture.Status, "sent to the old API, run by the new worker: %s", capture.Body)
	refundBody := `{"amount":"4.00"}`
	refund := s.mustCall("POST", s.apiURL()+"/v1/payments/"+paidID+"/refunds", m.APIKey, refundBody, "Idempotency-Key", "refund", "Content-Type", "application/json")
	require.Equal(t, http.StatusCreated, refund.Status, "sent to the old API, run by the new worker: %s", refund.Body)

	// 3. The APIs.
	newAddr := testkit.FreeAddr(t)
	newAPI := startProc(t, s.dir, s.bin, "api-new", s.env("KASA_API_ADDR", newAddr), "api")
	newAPI.waitHTTP("http://" + newAddr + "/readyz")
	api.Store(&newAddr)
	s.apiAddr = newAddr
	oldAPI.stopCleanly(30 * time.Second)
	void := s.mustCall("POST", s.apiURL()+"/v1/payments/"+manual["to-void"]+"/cancel", m.APIKey, "", "Idempotency-Key", "void")
	require.Equal(t, http.StatusOK, void.Status, "%s", void.Body)
	for _, again := range []struct {
		name  string
		first response
		then  response
	}{
		{"a merchant's creation", created, s.mustCall("POST", s.apiURL()+"/admin/v1/merchants", adminToken, merchantBody, "Idempotency-Key", "merchant")},
		{"a payment", paid, s.mustCall("POST", s.apiURL()+"/v1/payments", m.APIKey, payBody("inv-paid", "10.00", "TRY", acct), "Idempotency-Key", "paid")},
		{"a capture", capture, s.mustCall("POST", s.apiURL()+"/v1/payments/"+manual["to-capture"]+"/capture", m.APIKey, `{"amount":"30.00"}`, "Idempotency-Key", "capture", "Content-Type", "application/json")},
		{"a refund", refund, s.mustCall("POST", s.apiURL()+"/v1/payments/"+paidID+"/refunds", m.APIKey, refundBody, "Idempotency-Key", "refund", "Content-Type", "application/json")},
	} {
		require.Equal(t, again.first.Status, again.then.Status, "%s, answered by the old API, then the new: %s", again.name, again.then.Body)
		require.Equal(t, string(again.first.Body), string(again.then.Body), again.name)
		require.Equal(t, "true", again.then.Header.Get("Idempotent-Replayed"), again.name)
	}

	// 4. The relays: the old one is stopped while the merchant holds its webhook.
	hold.Store(true)
	heldPay, err := s.pay(m, "webhook-held", payBody("inv-webhook-held", "2.00", "TRY", acct))
	require.NoError(t, err)
	require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, heldPay.Status, "%s", heldPay.Body)
	require.Eventually(t, func() bool { return held.Load() > 0 }, 30*time.Second, 10*time.Millisecond, "the old relay sends the webhook")
	newRelay, _, _ := s.startRelayOf(s.bin, "relay-new", "KASA_NATS_URL", natsURL)
	oldRelay.stopCleanly(30 * time.Second)
	hold.Store(false)
	close(stop)
	wg.Wait()

	// Everything either release began is done, once.
	p := s.waitPayment(m, atBank.json(t)["id"].(string), time.Now().Add(30*time.Second))
	require.Equal(t, "succeeded", p["status"], "the payment at the bank while the old worker stopped: %v", p)
	require.Equal(t, 1, s.simCount(p["id"].(string)), "charged once")
	require.Equal(t, 1, s.simRefundCount(refund.json(t)["id"].(string)), "refunded once")
	captured, err := banksim.Control{URL: s.simURL()}.Authorizations(context.Background(), manual["to-capture"])
	require.NoError(t, err)
	require.Equal(t, int64(3000), captured.CapturedMinor, "%+v", captured)
	voided, err := banksim.Control{URL: s.simURL()}.Authorizations(context.Background(), manual["to-void"])
	require.NoError(t, err)
	require.True(t, voided.Voided, "%+v", voided)
	require.Zero(t, voided.CapturedMinor, "%+v", voided)
	mu.Lock()
	defer mu.Unlock()
	require.Greater(t, len(answers), 5, "the client paid through the upgrade")
	spent := 10_00 - 4_00 + 3_00 + 30_00 + 2_00 // paid, refunded, at the bank, captured, webhook held
	for key, as := range answers {
		var final response
		for range 120 { // a careful client: the same key until the answer is final
			final = s.mustCall("POST", s.apiURL()+"/v1/payments", m.APIKey, payBody("inv-"+key, "1.00", "TRY", acct), "Idempotency-Key", key)
			if final.Status != http.StatusAccepted {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		require.Equal(t, http.StatusCreated, final.Status, "%s: %s", key, final.Body)
		for _, a := range as {
			require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, a.Status, "%s: %s", key, a.Body)
			if a.Status == http.StatusCreated {
				require.Equal(t, string(a.Body), string(final.Body), "%s: answered again by the new API", key)
			}
		}
		require.Equal(t, 1, s.simCount(final.json(t)["id"].(string)), "%s charged once", key)
		spent += 1_00
	}
	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{fmt.Sprintf("%d.%02d", (100000-spent)/100, (100000-spent)%100), "0.00"}, []string{balance, reserved},
		"the payer's balance, and no hold left")

	// Every event reaches the merchant, the one the old relay was sending when it stopped too.
	events := map[string]bool{}
	rows, err := conn.Query(context.Background(), `SELECT id::text FROM outbox`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		events[id] = true
	}
	require.NoError(t, rows.Err())
	missing := func() []string {
		got := map[string]bool{}
		for _, req := range hook.Requests() {
			got[req.EventID] = true
		}
		var ids []string
		for id := range events {
			if !got[id] {
				ids = append(ids, id)
			}
		}
		return ids
	}
	require.Eventually(t, func() bool { return len(missing()) == 0 }, 60*time.Second, 100*time.Millisecond,
		"events not delivered: %v\n%s", missing(), testkit.Tail(newRelay.log, 20))
	newWorker.requireRunning(t, "after the upgrade")
	newAPI.requireRunning(t, "after the upgrade")
	for _, p := range []*proc{oldWorker, oldAPI, oldRelay, newWorker, newAPI, newRelay} {
		logged, err := os.ReadFile(p.log)
		require.NoError(t, err)
		require.NotContains(t, string(logged), "level=ERROR", "%s logged an error on the other release's schema or rows", p.name)
	}
	s.verify()
}

// A new API that starts before the workers are upgraded (docs/deployment.md, "Upgrades": as
// docker compose may do): its payment waits processing, the old worker refusing its newer
// revision, holding no money and charging nothing; the old API beside it goes on paying. Once a
// worker of the new release polls, the payment runs, and is charged once.
func TestNewAPIBeforeTheNewWorkers(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "idempotent", previous: true})
	s.startBanksim()
	oldWorker := startProc(t, s.dir, s.old, "worker-old", s.env(), "worker")
	oldAddr := s.apiAddr
	oldAPI := startProc(t, s.dir, s.old, "api-old", s.env(), "api")
	oldAPI.waitHTTP("http://" + oldAddr + "/readyz")
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	out, code := runKasa(t, s.dir, s.bin, s.env(), "migrate")
	require.Zero(t, code, "kasa migrate of the new release:\n%s", out)

	newAddr := testkit.FreeAddr(t)
	newAPI := startProc(t, s.dir, s.bin, "api-new", s.env("KASA_API_ADDR", newAddr), "api")
	newAPI.waitHTTP("http://" + newAddr + "/readyz")
	s.apiAddr = newAddr
	r, err := s.pay(m, "early", payBody("inv-early", "5.00", "TRY", acct))
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	id := r.json(t)["id"].(string)
	require.Eventually(t, func() bool { return strings.Contains(testkit.Tail(oldWorker.log, 100), "is newer than this worker's") },
		30*time.Second, 100*time.Millisecond, "the old worker refuses the payment's revision")
	s.apiAddr = oldAddr
	s.paySucceeds(m, "old-api", acct) // 10.00, run by the old worker
	s.apiAddr = newAddr
	time.Sleep(10 * time.Second)
	require.Equal(t, "processing", s.payment(m, id)["status"])
	require.Zero(t, s.simCount(id), "charged nothing")
	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{"90.00", "0.00"}, []string{balance, reserved}, "no hold yet")

	began := time.Now()
	startProc(t, s.dir, s.bin, "worker-new", s.env(), "worker")
	oldWorker.stopCleanly(30 * time.Second)
	p := s.waitPayment(m, id, time.Now().Add(3*time.Minute))
	require.Equal(t, "succeeded", p["status"], "%v", p)
	t.Logf("the payment ran %s after the new worker started", time.Since(began).Round(time.Second))
	require.Equal(t, 1, s.simCount(id), "charged once")
	balance, reserved = s.balances(m, acct)
	require.Equal(t, []string{"85.00", "0.00"}, []string{balance, reserved})
	s.verify()
}

// Payments the previous release parked unknown (the bank's answer lost, or an error), their
// holds kept, are settled after the upgrade by a settlement file imported through the new API and
// run by the new worker, which takes over the old one's histories: with inquiry too, whose old
// runs were asking the bank again when the old worker stopped. The charge is booked once, the
// other released, and no hold is left.
func TestUnknownPaymentsOfThePreviousReleaseSettledAfterTheUpgrade(t *testing.T) {
	t.Parallel()
	for _, capability := range []string{"none", "inquiry"} {
		t.Run(capability, func(t *testing.T) {
			t.Parallel()
			s := newCrashStack(t, crashConfig{capability: capability, syncWait: "300ms", previous: true})
			settings := []string{"KASA_PROVIDER_BOOKING_WINDOW", "1s", "KASA_PROVIDER_CHARGE_BUDGET", "6s"}
			s.startBanksim()
			oldWorker := startProc(t, s.dir, s.old, "worker-old", s.env(settings...), "worker")
			oldAddr := s.apiAddr
			oldAPI := startProc(t, s.dir, s.old, "api-old", s.env(settings...), "api")
			oldAPI.waitHTTP("http://" + oldAddr + "/readyz")
			m := s.merchant()
			acct := s.account(m, "TRY", "100.00")
			unknown := func(key, fault string) string {
				rules := `{"on":"charge","action":"` + fault + `","count":1}`
				if capability == "inquiry" { // the bank does not answer inquiries until the upgrade is done
					rules += `,{"on":"inquiry","action":"error_503"}`
				}
				s.setFaults(`{"rules":[` + rules + `]}`)
				r, err := s.pay(m, key, payBody(key, "10.00", "TRY", acct))
				require.NoError(t, err)
				id := r.json(t)["id"].(string)
				require.Equal(t, "unknown", s.waitPayment(m, id, time.Now().Add(60*time.Second))["status"])
				return id
			}
			charged, notCharged := unknown("charged", "drop_response"), unknown("not-charged", "error_500")

			out, code := runKasa(t, s.dir, s.bin, s.env(), "migrate")
			require.Zero(t, code, "kasa migrate of the new release:\n%s", out)
			newWorker := startProc(t, s.dir, s.bin, "worker-new", s.env(settings...), "worker")
			oldWorker.stopCleanly(30 * time.Second)
			newAddr := testkit.FreeAddr(t)
			newAPI := startProc(t, s.dir, s.bin, "api-new", s.env(append(settings, "KASA_API_ADDR", newAddr)...), "api")
			newAPI.waitHTTP("http://" + newAddr + "/readyz")
			s.apiAddr = newAddr
			oldAPI.stopCleanly(30 * time.Second)
			balance, reserved := s.balances(m, acct)
			require.Equal(t, []string{"100.00", "20.00"}, []string{balance, reserved}, "both holds kept through the upgrade")

			s.setFaults(`{"rules":[]}`)
			time.Sleep(1500 * time.Millisecond) // past the booking window
			csv := s.mustCall("GET", s.simURL()+"/v1/settlements/"+time.Now().UTC().Format(time.DateOnly)+".csv", "", "")
			require.Equal(t, http.StatusOK, csv.Status)
			r := s.mustCall("POST", s.apiURL()+"/admin/v1/settlements?scope=all", adminToken, string(csv.Body), "Content-Type", "text/csv")
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			require.Equal(t, true, r.json(t)["ok"], "%s", r.Body)
			require.Equal(t, "succeeded", s.waitPayment(m, charged, time.Now().Add(30*time.Second))["status"])
			require.Equal(t, "failed", s.waitPayment(m, notCharged, time.Now().Add(30*time.Second))["status"])
			require.Equal(t, 1, s.simCount(charged), "charged once")
			require.Zero(t, s.simCount(notCharged))
			balance, reserved = s.balances(m, acct)
			require.Equal(t, []string{"90.00", "0.00"}, []string{balance, reserved})
			newWorker.requireRunning(t, "after the import")
			s.verify()
		})
	}
}
