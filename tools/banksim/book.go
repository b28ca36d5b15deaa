package banksim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

var errInProgress = errors.New("a request with this key is in progress")

// entry is a line of one of the bank's logs: a charge, refund, authorization, capture or void.
type entry interface{ meta() meta }

// meta is what the books read of every entry, whatever its kind.
type meta struct {
	key    string // the idempotency key it was sent with
	ref    string // the client's reference
	link   string // what finds it beside its reference (see book.byLink); "" for a charge
	status string
	at     time.Time // when it books
}

func (m meta) succeeded() bool             { return m.status == statusSucceeded }
func (m meta) bookedBy(now time.Time) bool { return !m.at.After(now) }

func (r record) meta() meta {
	return meta{r.IdempotencyKey, r.Reference, "", r.Status, r.CreatedAt}
}
func (r refundRecord) meta() meta {
	return meta{r.IdempotencyKey, r.Reference, r.ChargeReference, r.Status, r.CreatedAt}
}
func (r authRecord) meta() meta {
	return meta{r.IdempotencyKey, r.Reference, r.ID, r.Status, r.CreatedAt}
}
func (r captureRecord) meta() meta {
	return meta{r.IdempotencyKey, r.Reference, r.AuthorizationID, r.Status, r.CreatedAt}
}
func (r voidRecord) meta() meta {
	return meta{r.IdempotencyKey, r.Reference, r.AuthorizationID, r.Status, r.CreatedAt}
}

// book is the bank's record of one kind of request (charges, refunds, ...): its durable
// log and the indexes that replays and inquiries read. Guarded by the Sim's mu.
type book[R entry] struct {
	log     *journal
	records []R
	byKey   map[string]int   // first record per idempotency key
	byRef   map[string][]int // all records per reference, in log order
	// byLink finds, in log order, a refund by its charge reference, a capture or a void by its
	// authorization's id, and an authorization by its own id.
	byLink map[string][]int
}

// open replays the log dir/name into b and keeps it open for appending.
func (b *book[R]) open(dir, name string, logger *slog.Logger) error {
	b.byKey, b.byRef, b.byLink = map[string]int{}, map[string][]int{}, map[string][]int{}
	path := filepath.Join(dir, name)
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("banksim: %w", err)
	}
	valid := 0
	for line := range bytes.Lines(data) {
		if !bytes.HasSuffix(line, []byte("\n")) {
			// A crash mid-append leaves an incomplete last line. Its fsync
			// never finished, so no client was ever answered for it.
			break
		}
		if len(bytes.TrimSpace(line)) > 0 {
			var rec R
			if err := json.Unmarshal(line, &rec); err != nil {
				return fmt.Errorf("banksim: %s: corrupt record at byte %d: %w", path, valid, err)
			}
			b.index(rec)
		}
		valid += len(line)
	}

	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("banksim: %w", err)
	}
	if valid < len(data) {
		// Cut the torn line, or the next append would be glued onto it.
		logger.Warn("banksim: dropping torn last line of a log", "file", name, "bytes", len(data)-valid)
		err = f.Truncate(int64(valid))
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("banksim: %w", err)
	}
	// Make the file's directory entry durable too.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	b.log = &journal{f: f, size: int64(valid)}
	return nil
}

// index adds rec to the in-memory state. Callers hold mu (or own the Sim exclusively).
func (b *book[R]) index(rec R) {
	m, i := rec.meta(), len(b.records)
	b.records = append(b.records, rec)
	if _, ok := b.byKey[m.key]; !ok {
		b.byKey[m.key] = i
	}
	b.byRef[m.ref] = append(b.byRef[m.ref], i)
	if m.link != "" {
		b.byLink[m.link] = append(b.byLink[m.link], i)
	}
}

// enter is the one way a request gets into one of the bank's books. A bank that honours keys
// answers a key it has seen with the record the key first made, whatever the request, once it
// has booked. Otherwise decide makes the record from the time the request arrived (or refuses
// it with an error), and it is appended durably before anyone hears of it. The lock is held
// across it all, so parallel requests with one key act once and parallel requests never
// decide on stale state.
func enter[R entry](s *Sim, kind string, b *book[R], key string, same func(prev R) bool,
	decide func(now time.Time) (R, error)) (R, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().UTC()
	var none R
	if i, seen := b.byKey[key]; seen && s.capability == CapabilityIdempotent {
		prev := b.records[i]
		if !prev.meta().bookedBy(now) {
			return none, errInProgress
		}
		if !same(prev) { // the first result all the same: a key names one operation
			s.log.Warn("banksim: idempotency key reused with another request: answered with the first", "kind", kind, "key", key)
		}
		return prev, nil
	}
	var line []byte
	rec, err := decide(now)
	if err == nil {
		line, err = b.log.append(rec)
	}
	if err != nil {
		return none, err
	}
	b.index(rec)
	s.log.Info("banksim "+kind, "record", bytes.TrimSpace(line)) // the line as logged: readable in any handler
	return rec, nil
}

// latest returns the latest record for ref booked by now, preferring a succeeded one.
func (b *book[R]) latest(ref string, now time.Time) (R, bool) {
	found := -1
	for _, i := range b.byRef[ref] {
		m := b.records[i].meta()
		if m.bookedBy(now) && (found < 0 || m.succeeded() || !b.records[found].meta().succeeded()) {
			found = i
		}
	}
	if found < 0 {
		var none R
		return none, false
	}
	return b.records[found], true
}

// tally is what the control API shows of the records for ref ("" for all): those
// booked by now in log order, how many of them succeeded, and how many are yet to book.
func (b *book[R]) tally(ref string, now time.Time) (booked []R, succeeded, pending int) {
	booked = []R{}
	for _, rec := range b.records {
		switch m := rec.meta(); {
		case ref != "" && m.ref != ref:
		case !m.bookedBy(now):
			pending++
		default:
			booked = append(booked, rec)
			if m.succeeded() {
				succeeded++
			}
		}
	}
	return booked, succeeded, pending
}

// journal is one durable append-only log of JSON lines.
type journal struct {
	f    *os.File
	size int64 // bytes of complete lines in f, to undo a failed append
}

// append writes v as one line, durably, and returns the line. Callers hold the Sim's mu.
func (j *journal) append(v any) ([]byte, error) {
	if j.f == nil {
		return nil, errors.New("banksim: closed")
	}
	line, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	line = append(line, '\n')
	if _, err = j.f.Write(line); err == nil {
		err = j.f.Sync()
	}
	if err != nil {
		_ = j.f.Truncate(j.size) // don't leave half a line behind
		return nil, err
	}
	j.size += int64(len(line))
	return line, nil
}

// close closes the log; a log that never opened (nil) has nothing to close.
func (j *journal) close() error {
	if j == nil || j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}
