package tests

// A payday burst (docs/operations.md, "Payday"): more payments at once than the cluster runs.
// The APIs queue what their running limit cannot take and answer 202 at once; the backlog's
// drainer starts them, merchants in turn; past the backlog's bound a payment is refused before
// anything is written. One API is SIGKILLed while the backlog drains: the other takes the lead,
// and every payment ends charged exactly once.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

func TestPaydayBurstDrainsThroughTheBacklog(t *testing.T) {
	t.Parallel()
	s := newMultiStack(t, crashConfig{capability: "idempotent", syncWait: "5s"})
	s.startBanksim()
	s.startWorker()
	s.startAPIs(2, "KASA_BACKLOG_API_RUNNING", "2", "KASA_BACKLOG_DRAIN_RUNNING", "3")
	a, b := s.merchant(), s.merchant()
	acctA, acctB := s.account(a, "TRY", "1000.00"), s.account(b, "TRY", "1000.00")
	// Every charge takes 300 ms at the bank: the drainer's three slots start ~10 payments a second.
	s.setFaults(`{"rules":[{"on":"charge","action":"delay","delay_ms":300}]}`)

	type sent struct {
		m         merchant
		key, body string
		first     response
		firstErr  error
	}
	var all []*sent
	burst := func(m merchant, acct, prefix string, n int) {
		var wg sync.WaitGroup
		for i := range n {
			p := &sent{m: m, key: fmt.Sprintf("%s-%02d", prefix, i)}
			p.body = payBody("inv-"+p.key, fmt.Sprintf("%d.00", 1+i%5), "TRY", acct)
			all = append(all, p)
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.first, p.firstErr = s.payAt(i%2, m, p.key, p.body)
			}()
			time.Sleep(5 * time.Millisecond) // in this order: the merchant's arrival order
		}
		wg.Wait()
	}
	burst(a, acctA, "a", 40)
	burst(b, acctB, "b", 4)

	for _, p := range all {
		require.NoError(t, p.firstErr, p.key)
		switch p.first.Status {
		case http.StatusAccepted:
			body := p.first.json(t)
			require.Equal(t, "processing", body["status"], p.key)
			require.NotEmpty(t, p.first.Header.Get("Retry-After"), p.key)
		case http.StatusCreated:
		default:
			t.Fatalf("%s: first answer %d: %s", p.key, p.first.Status, p.first.Body)
		}
	}
	queued := 0
	for i := range 2 {
		queued += scrapeCounter(t, "http://"+s.apiAddrs[i]+"/metrics", `kasa_idempotency_requests_total{outcome="queued"}`)
	}
	t.Logf("%d of %d payments queued in the backlog", queued, len(all))
	require.Greater(t, queued, len(all)/2, "the burst went through the backlog")

	// Kill the API that leads the drain while the backlog drains: the other takes the lead.
	leader := -1
	for i, p := range s.apis {
		if strings.Contains(testkit.Tail(p.log, 1000), "backlog drainer leads") {
			leader = i
		}
	}
	require.NotEqual(t, -1, leader, "an API leads the drain")
	n, _, err := s.st.QueuedBacklog(context.Background())
	require.NoError(t, err)
	require.Positive(t, n, "the backlog still drains when its drainer dies")
	s.apis[leader].kill()

	// Clients retry every key on the API that is left until it is final.
	s.apiAddr = s.apiAddrs[1-leader]
	total := map[merchant]int64{}
	for _, p := range all {
		total[p.m] += s.payUntilFinal(p.m, p.key, p.body, time.Now().Add(3*time.Minute))
	}
	for m, acct := range map[merchant]string{a: acctA, b: acctB} {
		balance, reserved := s.balances(m, acct)
		require.Equal(t, []string{payment.FormatAmount(100000-total[m], "TRY"), "0.00"}, []string{balance, reserved})
	}
	s.verify()

	// B's four, sent after A's forty, did not wait for all of A's to start.
	started := func(m merchant, key string) time.Time {
		d, err := s.tc.DescribeWorkflow(context.Background(), workflows.PaymentWorkflowID(mustUUID(t, m.ID), key), "")
		require.NoError(t, err, key)
		return d.WorkflowStartTime
	}
	var lastB, lastA time.Time
	for _, p := range all {
		at := started(p.m, p.key)
		if p.m == b && at.After(lastB) {
			lastB = at
		}
		if p.m == a && at.After(lastA) {
			lastA = at
		}
	}
	t.Logf("B's last started %v before A's last", lastA.Sub(lastB).Round(time.Millisecond))
	require.True(t, lastB.Before(lastA), "B's payments started before A's backlog emptied")
}

// Past the backlog's bound a new payment is answered 503 with Retry-After before anything is
// written; retried later with the same key it is taken, and charged once.
func TestPaydayBacklogBoundRefusesBeforeWriting(t *testing.T) {
	t.Parallel()
	s := newMultiStack(t, crashConfig{capability: "idempotent", syncWait: "5s"})
	s.startBanksim()
	s.startWorker()
	s.startAPIs(1, "KASA_BACKLOG_API_RUNNING", "1", "KASA_BACKLOG_DRAIN_RUNNING", "1", "KASA_BACKLOG_MAX_QUEUED", "5")
	m := s.merchant()
	acct := s.account(m, "TRY", "1000.00")
	s.setFaults(`{"rules":[{"on":"charge","action":"delay","delay_ms":300}]}`)

	keys := make([]string, 15)
	body := func(key string) string { return payBody("inv-"+key, "1.00", "TRY", acct) }
	for i := range keys {
		keys[i] = fmt.Sprintf("bound-%02d", i)
	}
	go func() { _, _ = s.pay(m, keys[0], body(keys[0])) }() // takes the API's one running slot
	time.Sleep(100 * time.Millisecond)
	refused := 0
	for _, key := range keys[1:] { // one after another: each queued one is answered at once
		r, err := s.pay(m, key, body(key))
		require.NoError(t, err)
		switch r.Status {
		case http.StatusAccepted:
		case http.StatusServiceUnavailable:
			refused++
			require.Equal(t, "unavailable", r.json(t)["code"], key)
			require.NotEmpty(t, r.Header.Get("Retry-After"), key)
			g := s.mustCall("GET", s.apiURL()+"/v1/payments?idempotency_key="+key, m.APIKey, "")
			require.Equal(t, http.StatusNotFound, g.Status, "%s: nothing was written for a refused payment", key)
		default:
			t.Fatalf("%s: %d %s", key, r.Status, r.Body)
		}
	}
	t.Logf("%d of %d refused past a bound of 5 queued", refused, len(keys)-1)
	require.Positive(t, refused, "the bound refused payments")

	var total int64
	for _, key := range keys {
		total += s.payUntilFinal(m, key, body(key), time.Now().Add(2*time.Minute))
	}
	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{payment.FormatAmount(100000-total, "TRY"), "0.00"}, []string{balance, reserved})
	s.verify()
}

// The longest keys the API takes (255 characters) start on the real Temporal Server, whose
// workflow ids are at most 255 characters: a payment started at once, one queued in the backlog
// and started by the drainer, and a refund. Refused, such a payment would stay processing for
// good, its invoice blocked, its retries answered 503.
func TestPaydayLongestKeysStart(t *testing.T) {
	t.Parallel()
	s := newMultiStack(t, crashConfig{capability: "idempotent", syncWait: "5s"})
	s.startBanksim()
	s.startWorker()
	s.startAPIs(1, "KASA_BACKLOG_API_RUNNING", "1")
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")
	long := func(c string) string { return strings.Repeat(c, 255) }
	body := func(key string) string { return payBody("inv-"+key[:1], "10.00", "TRY", acct) }
	deadline := time.Now().Add(2 * time.Minute)

	// Queued: a slow payment holds the API's one running slot.
	s.setFaults(`{"rules":[{"on":"charge","action":"delay","delay_ms":1500,"count":1}]}`)
	slot := make(chan struct{})
	go func() { defer close(slot); _, _ = s.pay(m, "slot", body("slot")) }()
	time.Sleep(300 * time.Millisecond)
	r, err := s.pay(m, long("q"), body(long("q")))
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, r.Status, "queued: %s", r.Body)
	<-slot
	total := s.payUntilFinal(m, "slot", body("slot"), deadline)
	total += s.payUntilFinal(m, long("q"), body(long("q")), deadline)

	// Started at once.
	r, err = s.pay(m, long("d"), body(long("d")))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	total += s.payUntilFinal(m, long("d"), body(long("d")), deadline)

	rf := s.mustCall("POST", s.apiURL()+"/v1/payments/"+r.json(t)["id"].(string)+"/refunds", m.APIKey, `{"amount":"4.00"}`,
		"Idempotency-Key", long("r"))
	require.Equal(t, http.StatusCreated, rf.Status, "%s", rf.Body)
	require.Equal(t, "succeeded", rf.json(t)["status"])
	total -= 400

	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{payment.FormatAmount(10000-total, "TRY"), "0.00"}, []string{balance, reserved})
	s.verify()
}

// payUntilFinal sends the payment to the stack's API until it is answered 201 succeeded (202,
// 409 in use and 503 are retried with the same key), checks that the bank charged it once, and
// returns its amount in minor units.
func (s *crashStack) payUntilFinal(m merchant, key, body string, until time.Time) int64 {
	s.t.Helper()
	for {
		r, err := s.pay(m, key, body)
		require.NoError(s.t, err)
		if r.Status == http.StatusCreated {
			p := r.json(s.t)
			require.Equal(s.t, "succeeded", p["status"], key)
			n, _ := s.simCharges(p["id"].(string))
			require.Equal(s.t, 1, n, "%s: charged exactly once", key)
			amount, err := payment.ParseAmount(p["amount"].(string), "TRY")
			require.NoError(s.t, err)
			return amount
		}
		require.Contains(s.t, []int{http.StatusAccepted, http.StatusConflict, http.StatusServiceUnavailable}, r.Status, "%s: %s", key, r.Body)
		require.True(s.t, time.Now().Before(until), "%s is not final: %d %s", key, r.Status, r.Body)
		time.Sleep(200 * time.Millisecond)
	}
}

// scrapeCounter reads one series' value from a Prometheus text exposition; 0 when absent.
func scrapeCounter(t *testing.T, url, series string) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	m := regexp.MustCompile(regexp.QuoteMeta(series) + ` (\S+)`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return int(v)
}
