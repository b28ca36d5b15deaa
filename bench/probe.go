package bench

import (
	"context"
	"crypto/sha256"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Probe measures how fast this machine runs a fixed CPU workload right now: SHA-256 blocks
// per second over every core, for d. A shared machine can run at half speed for minutes; a
// ratio whose two sides were measured in different spells compares the machine, not kasa.
func Probe(d time.Duration) float64 {
	var total atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			var buf [4096]byte
			var n int64
			for time.Now().Before(deadline) {
				for range 8 {
					sum := sha256.Sum256(buf[:])
					buf[0] = sum[0]
					n++
				}
			}
			total.Add(n)
		})
	}
	wg.Wait()
	return float64(total.Load()) / d.Seconds()
}

// steadiness probes the machine before each run of a suite and, while it runs well below the
// fastest probe seen, waits for the slow spell to pass, within a budget for the whole suite.
type steadiness struct {
	probe   func() float64
	fastest float64
	budget  time.Duration // waiting left
	until   time.Time     // no waiting after this (zero: no limit), to keep the suite's length bounded
	pause   time.Duration
	// quiet comes before each first probe: a run of payments ends with its last workflows,
	// events and writes still finishing for about a second, and a probe then read 67–72% of
	// the fastest after every payments run of a suite (and after no other run), so each was
	// followed by a wait for a slow spell that was kasa's own.
	quiet    time.Duration
	slow     float64 // a probe below slow × fastest is a slow spell
	progress func(format string, args ...any)
}

func (s *steadiness) wait(ctx context.Context) (float64, error) {
	if err := sleep(ctx, s.quiet); err != nil {
		return 0, err
	}
	for {
		p := s.probe()
		s.fastest = max(s.fastest, p)
		late := !s.until.IsZero() && time.Now().After(s.until)
		if p >= s.slow*s.fastest || s.budget < s.pause || late {
			return p, nil
		}
		s.progress("the machine runs at %.0f%% of its fastest probe: waiting %s for the slow spell to pass", 100*p/s.fastest, s.pause)
		s.budget -= s.pause
		if err := sleep(ctx, s.pause); err != nil {
			return 0, err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
