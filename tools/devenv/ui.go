package devenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
	return sup.startServing(ctx, "temporal-ui", fmt.Sprintf("http://127.0.0.1:%d/", port), bin,
		"--root", dir, "--config", "config", "--env", "kasa", "start")
}
