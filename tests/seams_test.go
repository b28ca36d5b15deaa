package tests

import (
	"context"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Deployed as docs/deployment.md says: the bank and the workers at capability none, the API left
// at its default (idempotent). The bank's answer to a charge and to a refund is lost: the
// worker's policy governs, so neither is sent again; both wait, unknown, for reconciliation.
func TestSplitCapabilityNeverResendsToABankWithoutIdempotency(t *testing.T) {
	t.Parallel()
	s := newCrashStack(t, crashConfig{capability: "none", syncWait: "300ms"})
	s.startBanksim()
	s.startWorker()
	s.startAPI("KASA_PROVIDER_CAPABILITY", "idempotent")
	m := s.merchant()
	acct := s.account(m, "TRY", "100.00")

	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	r, err := s.pay(m, "split-pay", payBody("split-pay", "10.00", "TRY", acct))
	require.NoError(t, err)
	require.Contains(t, []int{http.StatusAccepted}, r.Status, "%s", r.Body)
	id := r.json(t)["id"].(string)
	p := s.waitPayment(m, id, time.Now().Add(20*time.Second))
	require.Equal(t, "unknown", p["status"], "%v", p)
	time.Sleep(3 * time.Second) // an idempotent strategy would have re-sent within this
	require.Equal(t, 1, s.simCount(id), "the bank moved the money once")

	// A refund of another, paid payment: its answer lost too.
	s.setFaults(`{"rules":[]}`)
	r, err = s.pay(m, "split-paid", payBody("split-paid", "20.00", "TRY", acct))
	require.NoError(t, err)
	paid := s.waitPayment(m, r.json(t)["id"].(string), time.Now().Add(20*time.Second))
	require.Equal(t, "succeeded", paid["status"], "%v", paid)
	s.setFaults(`{"rules":[{"on":"refund","action":"drop_response","count":1}]}`)
	rf := s.mustCall("POST", s.apiURL()+"/v1/payments/"+paid["id"].(string)+"/refunds", m.APIKey, `{"amount":"5.00"}`, "Idempotency-Key", "split-refund")
	require.Equal(t, http.StatusAccepted, rf.Status, "%s", rf.Body)
	refundID := rf.json(t)["id"].(string)
	got := s.waitRefund(m, refundID, time.Now().Add(20*time.Second))
	require.Equal(t, "unknown", got["status"], "%v", got)
	time.Sleep(3 * time.Second)
	require.Equal(t, 1, s.simRefundCount(refundID), "the bank refunded once")
	balance, reserved := s.balances(m, acct)
	require.Equal(t, []string{"80.00", "10.00"}, []string{balance, reserved}, "the unknown payment keeps its hold")
	s.verify()

	// A second worker configured otherwise than the running one never polls: it exits at start,
	// naming both settings.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, "worker")
	cmd.Dir, cmd.Env = s.dir, s.env("KASA_PROVIDER_CAPABILITY", "idempotent")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.NotZero(t, exit.ExitCode())
	require.Contains(t, string(out), "runs with capability none", "%s", out)
	require.Contains(t, string(out), "configured with capability idempotent", "%s", out)
}
