package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"

	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// TestDevLifecycle is `make run` as a newcomer uses it: `kasa dev` starts PostgreSQL, Temporal
// with its UI, the simulator, the worker and the API; the printed walk-through pays; SIGTERM
// stops every child process; a second start finds the same data.
func TestDevLifecycle(t *testing.T) {
	t.Parallel()
	data, bin, envv, ports := devSetup(t)
	envv = append(envv, "KASA_WEBHOOK_ALLOW_PRIVATE=true") // the test's webhook endpoint listens on 127.0.0.1
	apiURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])

	start := func() (*proc, devState) {
		// A failing test still stops kasa dev gracefully (startProc's cleanup), so it takes its
		// children with it.
		p := startProcIn(t, "", data, bin, "dev", envv, "dev")
		p.waitLog("Ctrl-C stops everything", 3*time.Minute)
		p.waitLog("kasa is running", time.Second)
		p.waitLog(fmt.Sprintf("http://127.0.0.1:%d/namespaces/default/workflows?query=PaymentStatus%%3D%%22unknown%%22+AND+ExecutionStatus%%3D%%22Running%%22", ports[3]), time.Second)
		var st devState
		b, err := os.ReadFile(filepath.Join(data, "dev.json"))
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &st))
		waitReady(t, apiURL+"/readyz")
		return p, st
	}
	stop := func(p *proc) {
		p.stopCleanly(60 * time.Second)
		require.Empty(t, processesMentioning(data), "no child process may survive SIGTERM")
	}

	dev, st := start()
	// The walk-through of README.md: pay 100.00 TRY with the demo merchant...
	r := httpDo(t, "POST", apiURL+"/v1/payments", st.DemoAPIKey, payBody("dev-inv-1", "100.00", "TRY", st.DemoAccountID),
		"Idempotency-Key", "dev-test-1")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	paymentID := r.json(t)["id"].(string)
	r = httpDo(t, "GET", apiURL+"/v1/accounts/"+st.DemoAccountID, st.DemoAPIKey, "")
	require.Contains(t, string(r.Body), `"balance":"9900.00"`)
	// Operators find it in the Web UI by its search attributes, though the payment ran seconds
	// after the server started (the server caches the attribute definitions).
	requireListed(t, ports[2], fmt.Sprintf("WorkflowType = 'PaymentWorkflow' AND PaymentStatus = 'succeeded' AND MerchantId = '%s'", st.DemoMerchantID), 1)
	// ... then refund 30.00 of it under a key of its own.
	refundWalkThrough(t, apiURL, fmt.Sprintf("http://127.0.0.1:%d", ports[1]), st, paymentID)
	requireListed(t, ports[2], fmt.Sprintf("WorkflowType = 'RefundWorkflow' AND PaymentStatus = 'succeeded' AND MerchantId = '%s'", st.DemoMerchantID), 1)

	// The relay runs inside kasa dev: a merchant with a webhook URL hears of its payment.
	hook := newSink(t)
	r = httpDo(t, "POST", apiURL+"/admin/v1/merchants", st.AdminToken, fmt.Sprintf(`{"name":"Hooked","webhook_url":%q}`, hook.URL))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	hooked := r.json(t)
	r = httpDo(t, "POST", apiURL+"/admin/v1/accounts", st.AdminToken, fmt.Sprintf(`{"merchant_id":%q,"currency":"TRY"}`, hooked["id"]))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	acct := r.json(t)["id"].(string)
	r = httpDo(t, "POST", apiURL+"/admin/v1/accounts/"+acct+"/deposits", st.AdminToken, `{"amount":"50.00"}`, "Idempotency-Key", "dev-hook-seed")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	r = httpDo(t, "POST", apiURL+"/v1/payments", hooked["api_key"].(string), payBody("dev-hook-1", "20.00", "TRY", acct), "Idempotency-Key", "dev-hook-1")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Eventually(t, func() bool { return len(hook.Requests()) == 1 }, 30*time.Second, 50*time.Millisecond, "the webhook of a kasa dev payment")
	require.Equal(t, r.json(t)["id"], testkit.DecodeWebhook(t, hook.Requests()[0].Body).Data.ID)
	// The sender counts the delivery once the merchant's answer is recorded, just after it arrived.
	require.Eventually(t, func() bool {
		metrics := string(httpDo(t, "GET", apiURL+"/metrics", "", "").Body)
		return strings.Contains(metrics, "kasa_relay_backlog ") && strings.Contains(metrics, `kasa_webhook_deliveries_total{outcome="delivered"} 1`)
	}, 10*time.Second, 50*time.Millisecond, "the relay's metrics on the API's /metrics")
	metrics := string(httpDo(t, "GET", apiURL+"/metrics", "", "").Body)
	require.Contains(t, metrics, "kasa_ledger_violations 0", "kasa dev checks the ledger at start and shows it on the API's /metrics")
	require.NotContains(t, metrics, "kasa_ledger_verify_last_success_timestamp_seconds 0\n")
	readmeWalkThrough(t, apiURL, fmt.Sprintf("http://127.0.0.1:%d", ports[1]), data, bin, st.AdminToken)
	stop(dev)

	dev, st2 := start()
	require.Equal(t, st.AdminToken, st2.AdminToken, "a second run keeps its credentials")
	require.Equal(t, st.DemoAccountID, st2.DemoAccountID, "a second run finds the same data")
	r = httpDo(t, "GET", apiURL+"/v1/accounts/"+st.DemoAccountID, st.DemoAPIKey, "")
	require.Contains(t, string(r.Body), `"balance":"9930.00"`)
	r = httpDo(t, "GET", apiURL+"/v1/payments/"+paymentID, st.DemoAPIKey, "")
	require.Contains(t, string(r.Body), `"amount_refunded":"30.00"`)
	r = httpDo(t, "POST", apiURL+"/v1/payments", st.DemoAPIKey, payBody("dev-inv-2", "1.00", "TRY", st.DemoAccountID),
		"Idempotency-Key", "dev-test-2")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	requireListed(t, ports[2], fmt.Sprintf("WorkflowType = 'PaymentWorkflow' AND PaymentStatus = 'succeeded' AND MerchantId = '%s'", st.DemoMerchantID), 2)
	// Authorize now, capture later: 5.00 held, 2.00 taken, the rest let go.
	r = httpDo(t, "POST", apiURL+"/v1/payments", st.DemoAPIKey, manualBody("dev-inv-3", "5.00", st.DemoAccountID), "Idempotency-Key", "dev-test-3")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "requires_capture", r.json(t)["status"])
	manual := r.json(t)["id"].(string)
	r = httpDo(t, "GET", apiURL+"/v1/accounts/"+st.DemoAccountID, st.DemoAPIKey, "")
	require.Equal(t, "5.00", r.json(t)["reserved"])
	r = httpDo(t, "POST", apiURL+"/v1/payments/"+manual+"/capture", st.DemoAPIKey, `{"amount":"2.00"}`,
		"Idempotency-Key", "dev-capture-3", "Content-Type", "application/json")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Equal(t, "2.00", r.json(t)["amount_captured"])
	r = httpDo(t, "GET", apiURL+"/v1/accounts/"+st.DemoAccountID, st.DemoAPIKey, "")
	require.Equal(t, "9927.00", r.json(t)["balance"])
	require.Equal(t, "0.00", r.json(t)["reserved"])
	stop(dev)
}

// readmeWalkThrough runs the README's walk-through as its reader would, with bash and curl: its
// commands, with what the banner and each answer show in place of their <placeholders>.
func readmeWalkThrough(t *testing.T, apiURL, simURL, data, bin, adminToken string) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Log("SKIPPED the README's walk-through: no curl here")
		return
	}
	b, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, walk, _ := strings.Cut(string(b), "## Walk-through")
	_, script, _ := strings.Cut(walk, "```sh\n")
	script, _, _ = strings.Cut(script, "```")
	require.Contains(t, script, "curl", "README.md has no walk-through")
	// Each curl's answer is printed and kept for the placeholders of the lines after it.
	script = regexp.MustCompile(`(?m)^(curl (?:.*\\\n)*.*?)(?:[ \t]+#.*)?$`).ReplaceAllString(script, `ANSWER=$$($1); echo "$$ANSWER"`)
	script = regexp.MustCompile(`<(\w+) from the answer>`).ReplaceAllString(script, `$$(sed -n 's/.*"${1}":"\([^"]*\)".*/\1/p' <<<"$$ANSWER")`)
	var dev struct {
		DatabaseURL string `json:"database_url"`
	}
	state, err := os.ReadFile(filepath.Join(data, "dev.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(state, &dev))
	script = strings.NewReplacer("http://127.0.0.1:8080", apiURL, "http://127.0.0.1:8090", simURL, "./bin/kasa", bin,
		"<admin token from the banner>", adminToken, "<PostgreSQL URL from the banner>", "'"+dev.DatabaseURL+"'").Replace(script)
	out, err := exec.Command("bash", "-euo", "pipefail", "-c", script).CombinedOutput()
	require.NoError(t, err, "the README's walk-through failed:\n%s\n%s", script, out)
	// What the README's comments say the steps show.
	for _, want := range []string{"HTTP/1.1 201 Created", `"status":"succeeded"`, `"balance":"1000.00"`, `"count":1,`,
		"Location: /v1/refunds/", `"amount_refunded":"300.00"`, `"balance":"1300.00"`, "verify: ok"} {
		require.Contains(t, string(out), want, "the README's walk-through:\n%s", out)
	}
}

// refundWalkThrough is the README's refund step: 30.00 of the 100.00 payment goes back to the
// payer, once at the bank however often the request is sent, and the payment shows it.
func refundWalkThrough(t *testing.T, apiURL, simURL string, st devState, paymentID string) {
	t.Helper()
	refund := func() response {
		return httpDo(t, "POST", apiURL+"/v1/payments/"+paymentID+"/refunds", st.DemoAPIKey, `{"amount":"30.00"}`,
			"Idempotency-Key", "dev-refund-1")
	}
	r := refund()
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	first := r.json(t)
	refundID, _ := first["id"].(string)
	require.Equal(t, map[string]any{
		"id": refundID, "payment_id": paymentID, "status": "succeeded", "amount": "30.00", "currency": "TRY",
		"reason": nil, "failure_code": nil, "provider_reference": first["provider_reference"],
		"created_at": first["created_at"], "updated_at": first["updated_at"],
	}, first)
	require.NotEmpty(t, first["provider_reference"])
	require.Equal(t, "/v1/refunds/"+refundID, r.Header.Get("Location"))

	again := refund()
	require.Equal(t, http.StatusCreated, again.Status, "%s", again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(r.Body), string(again.Body), "a replay is the first answer, byte for byte")
	require.Equal(t, 1, bankRefunds(t, simURL, refundID), "the bank paid the refund back once")

	r = httpDo(t, "GET", apiURL+"/v1/payments/"+paymentID, st.DemoAPIKey, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, "30.00", r.json(t)["amount_refunded"])
	r = httpDo(t, "GET", apiURL+"/v1/accounts/"+st.DemoAccountID, st.DemoAPIKey, "")
	require.Equal(t, "9930.00", r.json(t)["balance"], "the payer got 30.00 back")
	r = httpDo(t, "GET", apiURL+"/v1/refunds/"+refundID, st.DemoAPIKey, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, first, r.json(t))
}

// requireListed waits until Temporal's visibility lists n workflows for the query.
func requireListed(t *testing.T, temporalPort int, query string, n int) {
	t.Helper()
	c, err := client.Dial(client.Options{HostPort: fmt.Sprintf("127.0.0.1:%d", temporalPort), Logger: tlog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	require.NoError(t, err)
	defer c.Close()
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := c.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Query: query})
		if err != nil {
			last = err.Error()
			continue
		}
		if last = fmt.Sprintf("%d listed", len(resp.GetExecutions())); len(resp.GetExecutions()) == n {
			return
		}
	}
	t.Fatalf("visibility query %q: want %d listed, last: %s", query, n, last)
}

type devState struct {
	AdminToken     string `json:"admin_token"`
	DemoMerchantID string `json:"demo_merchant_id"`
	DemoAPIKey     string `json:"demo_api_key"`
	DemoAccountID  string `json:"demo_account_id"`
}

func waitReady(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s never answered 200", url)
}

// devSetup is a data directory, the kasa binary and the environment of a `kasa dev` of its own:
// the API, the simulator, Temporal and its UI on ports[0..3].
func devSetup(t *testing.T) (data, bin string, envv []string, ports []int) {
	t.Helper()
	data, err := os.MkdirTemp("", "kasa-dev-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(data) })
	bin = kasaBinary(t, data)
	ports = make([]int, 4)
	for i := range ports {
		ports[i], err = devenv.FreePort()
		require.NoError(t, err)
	}
	envv = append(os.Environ(), "KASA_DATA_DIR="+data,
		fmt.Sprintf("KASA_API_ADDR=127.0.0.1:%d", ports[0]), fmt.Sprintf("KASA_BANKSIM_ADDR=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("KASA_TEMPORAL_PORT=%d", ports[2]), fmt.Sprintf("KASA_TEMPORAL_UI_PORT=%d", ports[3]),
		"KASA_DATABASE_URL=", "KASA_TEMPORAL_ADDRESS=", "KASA_ADMIN_TOKEN=", "KASA_SECRET_KEY=")
	return data, bin, envv, ports
}

// startDev starts `kasa dev` on a data directory and ports of its own, and waits until it runs.
func startDev(t *testing.T) (dev *proc, data, apiURL, simURL string) {
	t.Helper()
	data, bin, envv, ports := devSetup(t)
	dev = startProcIn(t, "", data, bin, "dev", envv, "dev")
	dev.waitLog("kasa is running", 3*time.Minute)
	return dev, data, fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
}

// `kasa dev` without its database cannot work: when PostgreSQL dies (SIGKILL), it says so, stops
// every other child and exits non-zero, rather than answer 503 for ever.
func TestDevStopsWhenPostgresDies(t *testing.T) {
	t.Parallel()
	dev, data, _, _ := startDev(t)
	b, err := os.ReadFile(filepath.Join(data, "postgres", "postmaster.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	select {
	case <-dev.c.Done():
	case <-time.After(time.Minute):
		t.Fatalf("kasa dev runs on without its database\n%s", testkit.Tail(dev.log, 20))
	}
	require.Error(t, dev.c.Err(), "a non-zero exit")
	dev.waitLog("PostgreSQL exited on its own", time.Second)
	require.Eventually(t, func() bool { return len(processesMentioning(data+"/")) == 0 }, 30*time.Second, 100*time.Millisecond,
		"no child may survive: %v", processesMentioning(data+"/"))
}

// A second Ctrl-C ends a stop that waits for a charge still at the bank (the worker lets its
// activities finish): at once, its children with it.
func TestDevSecondInterruptStopsAtOnce(t *testing.T) {
	t.Parallel()
	dev, data, apiURL, simURL := startDev(t)
	var st devState
	b, err := os.ReadFile(filepath.Join(data, "dev.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &st))
	setBankFaults(t, simURL, `{"rules":[{"on":"charge","action":"delay","delay_ms":40000}]}`)
	r := httpDo(t, "POST", apiURL+"/v1/payments", st.DemoAPIKey, payBody("dev-slow-1", "1.00", "TRY", st.DemoAccountID), "Idempotency-Key", "dev-slow-1")
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	require.NoError(t, syscall.Kill(dev.pid(), syscall.SIGINT))
	dev.waitLog("shutting down", 10*time.Second)
	time.Sleep(500 * time.Millisecond)
	require.True(t, !dev.exited(), "the first stop waits for the charge at the bank")
	require.NoError(t, syscall.Kill(dev.pid(), syscall.SIGINT))
	select {
	case <-dev.c.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("a second Ctrl-C did not end kasa dev\n%s", testkit.Tail(dev.log, 20))
	}
	require.Eventually(t, func() bool { return len(processesMentioning(data+"/")) == 0 }, 30*time.Second, 100*time.Millisecond,
		"no child may survive: %v", processesMentioning(data+"/"))
}

// An API or simulator address another process holds is refused before kasa dev starts anything,
// naming the address and its setting, as kasa cluster refuses it.
func TestDevRefusesATakenAddressBeforeStarting(t *testing.T) {
	t.Parallel()
	for i, setting := range []string{"KASA_API_ADDR", "KASA_BANKSIM_ADDR"} {
		t.Run(setting, func(t *testing.T) {
			t.Parallel()
			data, bin, envv, ports := devSetup(t)
			addr := fmt.Sprintf("127.0.0.1:%d", ports[i])
			ln, err := net.Listen("tcp", addr)
			require.NoError(t, err)
			defer ln.Close()
			dev := startProcIn(t, "", data, bin, "dev", envv, "dev")
			select {
			case <-dev.c.Done():
			case <-time.After(time.Minute):
				t.Fatalf("kasa dev runs on with %s taken\n%s", addr, testkit.Tail(dev.log, 20))
			}
			require.Error(t, dev.c.Err(), "a non-zero exit")
			dev.waitLog(addr+" ("+setting+") is taken by another process", time.Second)
			require.NoDirExists(t, filepath.Join(data, "postgres"), "nothing started before the check")
		})
	}
}
