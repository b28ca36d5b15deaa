package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// A process runs at most MaxRunning payments, one merchant at most its share of them; the rest
// queue, and a returned slot is free again.
func TestAdmissionRunningSlots(t *testing.T) {
	a := newAdmission(Backlog{State: fakeBacklog{}, MaxRunning: 4}, 0.5)
	m1, m2 := uuid.New(), uuid.New()
	require.True(t, a.take(m1))
	require.True(t, a.take(m1))
	require.False(t, a.take(m1), "merchant 1 holds its half")
	require.True(t, a.take(m2))
	require.True(t, a.take(m2))
	require.False(t, a.take(uuid.New()), "every slot is taken")
	a.give(m1)
	require.True(t, a.take(m1))

	off := newAdmission(Backlog{MaxRunning: 4}, 0.5) // no backlog: nothing queues
	for range 10 {
		require.True(t, off.take(m1))
	}
}

// A merchant's share is at most that part of the slots, and below 1 it always leaves one to the
// others: with 8 slots and a share of 0.9, one merchant holding all 8 would queue (or, of the
// requests in flight, refuse) every other merchant while it alone is busy.
func TestMerchantShareIsAtMostItsPart(t *testing.T) {
	for _, tc := range []struct {
		n     int
		share float64
		want  int
	}{
		{64, 0.5, 32},
		{1024, 0.5, 512},
		{8, 0.9, 7},
		{64, 0.99, 63},
		{3, 0.5, 1},
		{7, 0.3, 2},
		{100, 0.29, 29}, // 100 × 0.29 is 28.999999999999996 in float64
		{10, 0.05, 1},   // at least one
		{1, 0.5, 1},
		{4, 1, 4}, // 1, or outside (0, 1): all of them
		{4, 0, 4},
	} {
		t.Run(fmt.Sprintf("%d×%v", tc.n, tc.share), func(t *testing.T) {
			require.Equal(t, tc.want, merchantShare(tc.n, tc.share))
		})
	}

	a := newAdmission(Backlog{State: fakeBacklog{}, MaxRunning: 8}, 0.9)
	busy, quiet := uuid.New(), uuid.New()
	held := 0
	for a.take(busy) {
		held++
	}
	require.Equal(t, 7, held, "the busy merchant holds at most 0.9 of the 8 running slots")
	require.True(t, a.take(quiet), "another merchant's payment still runs at once")
}

func TestAdmissionBound(t *testing.T) {
	epoch := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		b     Backlog
		state store.BacklogState
		want  int // Retry-After of the refusal; 0: admitted
	}{
		{"under both bounds", Backlog{MaxQueued: 100, MaxWait: time.Minute}, store.BacklogState{Queued: 99, DrainPerSecond: 10}, 0},
		{"at the count", Backlog{MaxQueued: 100}, store.BacklogState{Queued: 100, DrainPerSecond: 10}, 1},
		{"longer than the wait", Backlog{MaxWait: time.Minute}, store.BacklogState{Queued: 900, DrainPerSecond: 10}, 30},
		{"rate unknown: only the count", Backlog{MaxWait: time.Minute}, store.BacklogState{Queued: 900}, 0},
		{"no drainer saved a rate lately: only the count", Backlog{MaxWait: time.Minute}, store.BacklogState{Queued: 900, DrainPerSecond: 1, Age: time.Hour}, 0},
		{"no bounds", Backlog{}, store.BacklogState{Queued: 1 << 40}, 0},
		// A drain that stalled (rate 0) takes for ever: refused once the oldest queued payment has
		// waited longer than the clients' patience, as a backlog that only began (no start yet
		// within the window) or none at all is not.
		{"stalled, the oldest waited past the wait", Backlog{MaxWait: time.Minute},
			store.BacklogState{Queued: 5, Oldest: epoch, Now: epoch.Add(time.Minute + time.Second)}, 30},
		{"no drainer lately, the oldest waited past the wait", Backlog{MaxWait: time.Minute},
			store.BacklogState{Queued: 5, DrainPerSecond: 1, Age: time.Hour, Oldest: epoch, Now: epoch.Add(time.Hour)}, 30},
		{"stalled, the oldest within the wait", Backlog{MaxWait: time.Minute},
			store.BacklogState{Queued: 900, Oldest: epoch, Now: epoch.Add(time.Minute)}, 0},
		{"stalled, nothing queued", Backlog{MaxWait: time.Minute}, store.BacklogState{Now: epoch.Add(time.Hour)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.b.State, tc.b.MaxRunning = fakeBacklog{state: tc.state}, 8
			err := newAdmission(tc.b, 1).admit(context.Background())
			if tc.want == 0 {
				require.NoError(t, err)
				return
			}
			var full *backlogFullError
			require.ErrorAs(t, err, &full)
			require.Equal(t, tc.want, full.retryAfter())
		})
	}
}

// A drainer's record not saved for longer than its window is no drainer's: nobody leads, and the
// drain rate reads 0 (docs/operations.md, "Payday"), however fast the last leader drained.
func TestAdmissionStaleDrainRate(t *testing.T) {
	fresh := store.BacklogState{Queued: 5000, DrainPerSecond: 50, Age: time.Second}
	require.Equal(t, 50.0, newAdmission(Backlog{State: fakeBacklog{state: fresh}, MaxRunning: 8}, 1).backlog(context.Background()).DrainPerSecond)
	stale := store.BacklogState{Queued: 5000, DrainPerSecond: 50, Age: 10 * time.Minute}
	st := newAdmission(Backlog{State: fakeBacklog{state: stale}, MaxRunning: 8}, 1).backlog(context.Background())
	require.Zero(t, st.DrainPerSecond)
	require.Equal(t, int64(5000), st.Queued)
}

// A drainer's record that is not saved again (the drainer is stuck starting a workflow while
// Temporal is away, or none leads) does not make this process forget the payments it queued
// since: the bound holds however long the record stays old.
func TestAdmissionKeepsCountingWhileTheRecordIsStale(t *testing.T) {
	a := newAdmission(Backlog{State: fakeBacklog{state: store.BacklogState{Age: time.Hour}}, MaxRunning: 1, MaxQueued: 5}, 1)
	admitted := 0
	for range 12 {
		if a.admit(context.Background()) != nil {
			break
		}
		admitted++
		a.wasQueued()
		a.read = time.Time{} // the record is read again, and is the same
	}
	require.Equal(t, 5, admitted)
}

// One merchant's burst fills the backlog to its bound: another merchant, with nothing queued,
// whose payment this process can run at once is not refused (docs/api.md: one merchant's burst
// does not hold up the others'); the burst's merchant, and any payment that would be queued, is.
func TestAdmissionPastTheBoundLetsAnotherMerchantRun(t *testing.T) {
	burst, other := uuid.New(), uuid.New()
	full := store.BacklogState{Queued: 3, DrainPerSecond: 1, Age: time.Second}
	a := newAdmission(Backlog{State: fakeBacklog{state: full, queued: map[uuid.UUID]bool{burst: true}}, MaxRunning: 2, MaxQueued: 3}, 0.5)
	var refused *backlogFullError
	require.ErrorAs(t, a.admitFor(context.Background(), burst, true), &refused, "the burst's merchant has payments queued")
	require.NoError(t, a.admitFor(context.Background(), other, true), "another merchant's payment runs here at once")
	require.ErrorAs(t, a.admitFor(context.Background(), other, false), &refused, "it would be queued: past the bound")
}

// Past the backlog's bound a request the store would refuse whatever the load gets that answer,
// as below the bound; only a payment kasa would take is told to come back, and nothing is written.
func TestPastTheBoundRefusalsAnswerAsBelowIt(t *testing.T) {
	full := store.BacklogState{Queued: 10, DrainPerSecond: 1, Age: time.Second}
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
		fail       error // the refusal's read fails: the bound's 503 stands
	}{
		{"another key for the invoice's live payment", otherPayBody, 409, "duplicate_payment", nil},
		{"another merchant's payer account", strings.Replace(payBody, accountA.String(), accountB.String(), 1), 400, "invalid_request", nil},
		{"a new invoice", strings.Replace(payBody, "inv-1", "inv-2", 1), 503, "unavailable", nil},
		{"the refusal's read failing", otherPayBody, 503, "unavailable", errors.New("relation accounts: disk full")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newFakeStore()
			f := &fixture{st: st, wf: &fakeWorkflows{st: st, outcome: payment.StatusSucceeded}, reconc: &parseOnly{}}
			f.opts = Options{Store: st, Workflows: f.wf, AdminToken: "adm", Reconciler: f.reconc,
				SyncWait: 50 * time.Millisecond, PollAfter: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
				Backlog: Backlog{State: fakeBacklog{state: full, queued: map[uuid.UUID]bool{merchantA: true}}, MaxRunning: 8, MaxQueued: 10}}
			f.paid()
			if tc.fail != nil {
				st.fail["Refusal"] = tc.fail
			}
			rec := httptest.NewRecorder()
			New(f.opts).Handler().ServeHTTP(rec, request{body: tc.body, header: map[string]string{"Idempotency-Key": "k2"}}.build())
			require.Equal(t, tc.status, rec.Code, rec.Body.String())
			require.Contains(t, rec.Body.String(), `"code":"`+tc.code+`"`)
			if tc.status == 503 {
				require.NotEmpty(t, rec.Header().Get("Retry-After"))
			}
			_, err := st.Record(context.Background(), merchantA, "k2")
			require.ErrorIs(t, err, payment.ErrNotFound, "nothing was written")
		})
	}
}

// The oldest queued payment's age is taken from the database's clock, which stamped its arrival:
// an API host whose clock is minutes off would report it minutes off, or below zero.
func TestBacklogOldestAgeByTheDatabasesClock(t *testing.T) {
	for _, skew := range []time.Duration{-2 * time.Minute, 0, 2 * time.Minute} { // the database's clock ahead of this host's
		dbNow := time.Now().Add(skew)
		reg := prometheus.NewRegistry()
		newAdmission(Backlog{State: fakeBacklog{state: store.BacklogState{Queued: 3, Oldest: dbNow.Add(-20 * time.Second), Now: dbNow}},
			MaxRunning: 8}, 1).register(reg)
		families, err := reg.Gather()
		require.NoError(t, err)
		var age float64
		for _, f := range families {
			if f.GetName() == "kasa_backlog_oldest_age_seconds" {
				age = f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		require.InDelta(t, 20, age, 1, "skew %s", skew)
	}
}
