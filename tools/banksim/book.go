package banksim

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"time"
)

var (
	errInProgress = errors.New("a request with this key is in progress")
)

// entry is what the bank asks of a line of its logs: a charge, refund, authorization, capture or void.
type entry interface {
	key() string                 // the idempotency key it was sent with
	ref() string                 // the client's reference
	bookedBy(now time.Time) bool // whether it has taken effect at now
	succeeded() bool
}

func (r record) key() string           { return r.IdempotencyKey }
func (r record) ref() string           { return r.Reference }
func (r record) succeeded() bool       { return r.Status == statusSucceeded }
func (r refundRecord) key() string     { return r.IdempotencyKey }
func (r refundRecord) ref() string     { return r.Reference }
func (r refundRecord) succeeded() bool { return r.Status == statusSucceeded }
func (r refundRecord) link() string    { return r.ChargeReference }

// book is the bank's record of one kind of request (charges, refunds, ...): its durable
// log and the indexes that replays and inquiries read. Guarded by the Sim's mu.
type book[R entry] struct {
	log     *journal
	records []R
	byKey   map[string]int   // first record per idempotency key
	byRef   map[string][]int // all records per reference, in log order
}

func newBook[R entry]() book[R] {
	return book[R]{byKey: map[string]int{}, byRef: map[string][]int{}}
}

// open replays the log dir/name through index (b.index, or that of a book that
// indexes more) and keeps it open for appending.
func (b *book[R]) open(dir, name string, logger *slog.Logger, index func(R)) error {
	var err error
	b.log, err = openJournal(dir, name, logger, func(line []byte) error {
		var rec R
		if err := json.Unmarshal(line, &rec); err != nil {
			return err
		}
		index(rec)
		return nil
	})
	return err
}

// index adds rec to the in-memory state. Callers hold mu (or own the Sim exclusively).
func (b *book[R]) index(rec R) {
	i := len(b.records)
	b.records = append(b.records, rec)
	if _, ok := b.byKey[rec.key()]; !ok {
		b.byKey[rec.key()] = i
	}
	b.byRef[rec.ref()] = append(b.byRef[rec.ref()], i)
}

// linkedBook is a book whose records each belong to something else's: a refund to a charge
// reference, a capture or a void to an authorization id. byLink finds them.
type linkedBook[R interface {
	entry
	link() string
}] struct {
	book[R]
	byLink map[string][]int // all records per link, in log order
}

func newLinkedBook[R interface {
	entry
	link() string
}]() linkedBook[R] {
	return linkedBook[R]{book: newBook[R](), byLink: map[string][]int{}}
}

func (b *linkedBook[R]) index(rec R) {
	b.book.index(rec)
	b.byLink[rec.link()] = append(b.byLink[rec.link()], len(b.records)-1)
}

// enter is the one way a request gets into one of the bank's books (b, indexed by index): a key
// the bank honours and has seen answers with its first record (see replay); otherwise decide
// makes the record from the time the request arrived (or refuses it with an error), and it is
// appended durably before anyone hears of it. The lock is held across it all, so parallel
// requests with one key act once and parallel requests never decide on stale state.
func enter[R entry](s *Sim, kind string, b *book[R], index func(R), key string,
	same func(prev R) bool, decide func(now time.Time) (R, error)) (R, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().UTC()
	if prev, found, err := b.replay(s.capability, key, now); found {
		if err == nil && !same(prev) { // the first result all the same: a key names one operation
			s.log.Warn("banksim: idempotency key reused with another request: answered with the first", "kind", kind, "key", key)
		}
		return prev, err
	}
	var line []byte
	rec, err := decide(now)
	if err == nil {
		line, err = b.log.append(rec)
	}
	if err != nil {
		var none R
		return none, err
	}
	index(rec)
	s.log.Info("banksim "+kind, "record", bytes.TrimSpace(line)) // the line as logged: readable in any handler
	return rec, nil
}

// replay answers a request whose key the bank has seen, for a bank that honours keys: with
// the record the key first made, whatever the request, once it has booked. found is false when
// the request is new to the bank.
func (b *book[R]) replay(c Capability, key string, now time.Time) (prev R, found bool, err error) {
	var none R
	if c != CapabilityIdempotent {
		return none, false, nil
	}
	i, ok := b.byKey[key]
	if !ok {
		return none, false, nil
	}
	switch prev := b.records[i]; {
	case !prev.bookedBy(now):
		return none, true, errInProgress
	default:
		return prev, true, nil
	}
}

// latest returns the latest record for ref booked by now, preferring a succeeded one.
func (b *book[R]) latest(ref string, now time.Time) (R, bool) {
	found := -1
	for _, i := range b.byRef[ref] {
		rec := b.records[i]
		if !rec.bookedBy(now) {
			continue
		}
		if found < 0 || rec.succeeded() || !b.records[found].succeeded() {
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
		if ref != "" && rec.ref() != ref {
			continue
		}
		if !rec.bookedBy(now) {
			pending++
			continue
		}
		booked = append(booked, rec)
		if rec.succeeded() {
			succeeded++
		}
	}
	return booked, succeeded, pending
}
