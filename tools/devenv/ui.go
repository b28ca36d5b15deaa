package devenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// StartUI runs the Temporal Web UI server (bin/temporal-ui) on 127.0.0.1:port, pointed at the
// frontend at address, with its configuration under dir.
func StartUI(ctx context.Context, sup *Supervisor, bin, dir, address, namespace string, port int) (*Child, error) {
	if err := os.MkdirAll(filepath.Join(dir, "config"), 0o755); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`# Written by kasa at each start: edits are lost.
temporalGrpcAddress: %s
host: 127.0.0.1
port: %d
enableUi: true
defaultNamespace: %s
cors:
  cookieInsecure: true
`, address, port, namespace)
	if err := os.WriteFile(filepath.Join(dir, "config", "base.yaml"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	ui, err := sup.Start("temporal-ui", os.Environ(), bin, "--root", dir, "--config", "config", "--env", "kasa", "start")
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := WaitHTTP(wctx, fmt.Sprintf("http://127.0.0.1:%d/", port), ui); err != nil {
		ui.Stop(5 * time.Second)
		return nil, err
	}
	return ui, nil
}
