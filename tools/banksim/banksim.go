// Package banksim simulates a bank / payment provider over HTTP; docs/tools.md ("The bank
// simulator") says what it answers. Only the CLI (`kasa banksim`) and tests import it;
// production code never does.
//
// Like a real bank it never forgets: every charge, refund, authorization, capture and void is
// appended to its own log under DataDir, fsynced before the response is written, and the logs
// are replayed on start. The logs only grow: an authorization's state is read from the
// captures and voids that name it. Fault rules (/_sim/faults) reproduce the failures a payment
// system must survive: lost responses, error answers, unparseable bodies, delays, declines,
// hangs, and charges the bank books only later.
//
// A late booking is logged when it arrives, with its created_at set to the time it books:
// every read (inquiry, /_sim/charges, settlement files) skips records whose time has not come,
// so a restart in between books it on time. Decisions (what is left to refund or to capture)
// count it already: its money will move.
package banksim

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// Capability is how the simulated provider deals with a re-sent charge.
type Capability string

const (
	// CapabilityIdempotent: a repeated Idempotency-Key returns the first result.
	CapabilityIdempotent Capability = "idempotent"
	// CapabilityInquiry: no idempotency, but charges can be looked up by reference.
	CapabilityInquiry Capability = "inquiry"
	// CapabilityNone: no idempotency and no inquiry; every POST moves money.
	CapabilityNone Capability = "none"
)

// Options configures a Sim.
type Options struct {
	DataDir    string       // directory of the durable logs (created if missing); required
	Capability Capability   // default CapabilityIdempotent
	Logger     *slog.Logger // optional
}

// authorizationTTL is how long an authorization holds before the bank lets it expire (a
// capture is then declined, a void answers succeeded).
const authorizationTTL = 7 * 24 * time.Hour

const (
	statusSucceeded = "succeeded"
	statusDeclined  = "declined"
	logFile         = "charges.jsonl"
)

// charge is the provider API's view of a charge: the request and what the bank made of it.
type charge struct {
	ID string `json:"id"`
	chargeRequest
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

// record is one line of the durable log. The key is kept out of the provider
// API response but must survive restarts so replays keep working.
type record struct {
	charge
	IdempotencyKey string `json:"idempotency_key"`
	// ReceivedAt is set for a late booking only: when the request arrived.
	// CreatedAt is then the later time the charge books.
	ReceivedAt *time.Time `json:"received_at,omitempty"`
}

// view is the provider API's answer for a charge.
func (r record) view(time.Time) any { return r.charge }

// Sim is the simulator. All state is guarded by mu.
type Sim struct {
	capability Capability
	log        *slog.Logger
	now        func() time.Time // replaced in tests to produce charges on other days

	closed    chan struct{} // releases hanging handlers on Close
	closeOnce sync.Once

	mu             sync.Mutex
	charges        book[record]
	refunds        book[refundRecord]
	authorizations book[authRecord]
	captures       book[captureRecord]
	voids          book[voidRecord]
	faults         []faultState
	unlock         func() // the data directory's lock: one simulator per directory
}

// New opens (or creates) the durable logs under opts.DataDir and replays them.
func New(opts Options) (*Sim, error) {
	if opts.DataDir == "" {
		return nil, errors.New("banksim: DataDir is required")
	}
	capability := cmp.Or(opts.Capability, CapabilityIdempotent)
	if !slices.Contains([]Capability{CapabilityIdempotent, CapabilityInquiry, CapabilityNone}, capability) {
		return nil, fmt.Errorf("banksim: unknown capability %q", capability)
	}
	logger := cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	s := &Sim{
		capability: capability,
		log:        logger,
		now:        time.Now,
		closed:     make(chan struct{}),
	}
	if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("banksim: %w", err)
	}
	dir := opts.DataDir
	unlock, err := devenv.LockDir(filepath.Join(dir, "banksim.lock"), "bank simulator")
	if err != nil {
		return nil, fmt.Errorf("banksim: %w", err)
	}
	s.unlock = unlock
	err = errors.Join(
		s.charges.open(dir, logFile, logger),
		s.refunds.open(dir, "refunds.jsonl", logger),
		s.authorizations.open(dir, "authorizations.jsonl", logger),
		s.captures.open(dir, "captures.jsonl", logger),
		s.voids.open(dir, "voids.jsonl", logger),
	)
	if err != nil {
		_ = s.closeLogs()
		return nil, err
	}
	s.log.Info("banksim ready", "capability", capability, "charges", len(s.charges.records),
		"refunds", len(s.refunds.records), "authorizations", len(s.authorizations.records))
	return s, nil
}

// Close releases hanging requests and closes the log. It is safe to call twice.
func (s *Sim) Close() error {
	s.Release()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeLogs()
}

// Release ends the requests a hang rule holds (their connections dropped), as a bank going down
// would, so that a server's shutdown need not wait for them; the rest is served as before.
func (s *Sim) Release() { s.closeOnce.Do(func() { close(s.closed) }) }

func (s *Sim) closeLogs() error {
	if s.unlock != nil {
		defer s.unlock()
		s.unlock = nil
	}
	return errors.Join(s.charges.log.close(), s.refunds.log.close(),
		s.authorizations.log.close(), s.captures.log.close(), s.voids.log.close())
}

// statusOf is the status of a request the bank grants unless declined.
func statusOf(declined bool) string {
	if declined {
		return statusDeclined
	}
	return statusSucceeded
}
