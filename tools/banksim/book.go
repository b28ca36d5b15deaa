package banksim

import (
	"encoding/json"
	"errors"
	"log/slog"
	"time"
)

var (
	errKeyReuse   = errors.New("idempotency key reused with a different request")
	errInProgress = errors.New("a request with this key is in progress")
)

// entry is what the bank asks of a line of its logs, a charge's or a refund's.
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

// book is the bank's record of one kind of request (charges, refunds): its durable
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

// replay answers a request whose key the bank has seen, for a bank that honours keys:
// with the record the key first made, if same says the request is the one that made it
// and it has booked by now. found is false when the request is new to the bank.
func (b *book[R]) replay(c Capability, key string, now time.Time, same func(prev R) bool) (prev R, found bool, err error) {
	var none R
	if c != CapabilityIdempotent {
		return none, false, nil
	}
	i, ok := b.byKey[key]
	if !ok {
		return none, false, nil
	}
	switch prev := b.records[i]; {
	case !same(prev):
		return none, true, errKeyReuse
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
