package tests

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// The operator's list in the Web UI, in a real browser: filtered by PaymentStatus="unknown" and
// with the PaymentSummary column added as docs/reconciliation.md says, a parked payment's row
// shows its amount, currency and invoice. KASA_UI_SCREENSHOT=file.png keeps what the browser saw.
func TestWebUIListsWhatIsAtStake(t *testing.T) {
	chromium := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			chromium = p
			break
		}
	}
	if chromium == "" {
		t.Skip("no Chromium on this machine (Debian: apt-get install chromium): the Web UI is not checked in a browser")
	}
	t.Parallel()
	s := newStack(t, "none")
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	s.payUnknown(m, "webui-unknown", payBody("inv-webui-7", "42.17", "TRY", payer), "drop_response")

	bin, err := devenv.FindTool("temporal-ui", "temporal-ui")
	require.NoError(t, err)
	port, err := devenv.FreePort()
	require.NoError(t, err)
	dir := t.TempDir()
	sup := devenv.NewSupervisor(dir, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ui, err := devenv.StartUI(ctx, sup, bin, dir, env.TemporalAddress, "default", port)
	require.NoError(t, err)
	t.Cleanup(func() { sup.StopAll(5*time.Second, []*devenv.Child{ui}) })

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1500, 600))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	base := fmt.Sprintf("http://127.0.0.1:%d/namespaces/default/workflows", port)
	query := fmt.Sprintf(`PaymentStatus="unknown" AND ExecutionStatus="Running" AND MerchantId="%s"`, m.ID)
	// What the column picker stores in the browser when the operator adds PaymentSummary.
	columns := `localStorage.setItem("namespace-workflow-table-columns", JSON.stringify({"default": [
		{"label": "Status"}, {"label": "PaymentSummary"}, {"label": "Workflow ID"}, {"label": "Start"}]}))`
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(base),
		chromedp.Evaluate[chromedp.Void](columns),
		chromedp.Navigate(base+"?query="+url.QueryEscape(query)),
		chromedp.WaitVisible(chromedp.Search(`//td[contains(., "payment 42.17 TRY · invoice inv-webui-7")]`)),
	), "the unknown payment's row shows its summary (ui log: %s)", ui.Tail(20))
	shot, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	if path := os.Getenv("KASA_UI_SCREENSHOT"); path != "" {
		require.NoError(t, os.WriteFile(path, shot, 0o644))
	}
}
