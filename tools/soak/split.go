package soak

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// splits is what the settings_split faults saw: a worker with another provider capability than
// the deployment's must refuse to start, never poll (docs/deployment.md, "Money settings").
type splits struct {
	mu     sync.Mutex
	tried  int
	polled []string // a split worker that polled: a violation
}

// otherCapability is a capability that is not c.
func otherCapability(c string) string {
	if c == "idempotent" {
		return "none"
	}
	return "idempotent"
}

// split starts one more worker with another capability and waits, for the fault's duration, for
// it to refuse: exit non-zero, naming both settings. It is stopped if it still runs then.
func (s *stack) split(ctx context.Context, f Fault) error {
	sup := devenv.NewSupervisor(s.dir, nil) // no restart: its exit is the answer
	sup.WorkDir = s.dir
	c, err := sup.Start(f.Target, s.environ(map[string]string{"KASA_PROVIDER_CAPABILITY": otherCapability(s.o.Capability)}), s.o.Binary, "worker")
	if err != nil {
		return err
	}
	select {
	case <-c.Done():
	case <-time.After(f.Duration):
	case <-ctx.Done():
	}
	c.Stop(15 * time.Second)
	log, _ := os.ReadFile(c.LogPath)
	s.splits.mu.Lock()
	defer s.splits.mu.Unlock()
	s.splits.tried++
	switch {
	case strings.Contains(string(log), "worker polling"):
		s.splits.polled = append(s.splits.polled, fmt.Sprintf("at %s: a worker with capability %s polled beside %s ones (log %s)",
			clock(f.At), otherCapability(s.o.Capability), s.o.Capability, c.LogPath))
	case strings.Contains(string(log), "needs the same money settings"): // refused, as it must
	default: // it waited for a server another fault had taken down: this one says nothing
		return fmt.Errorf("inconclusive: the worker neither refused nor polled within %s (log %s)", f.Duration, c.LogPath)
	}
	return nil
}

const splitsName = "a worker with other money settings is refused"

// checkSplits: no worker with other money settings ever polled.
func (s *stack) checkSplits() Check {
	s.splits.mu.Lock()
	defer s.splits.mu.Unlock()
	c := Check{Name: splitsName, Checked: s.splits.tried}
	for _, p := range s.splits.polled {
		c.fail("%s", p)
	}
	return c.done()
}
