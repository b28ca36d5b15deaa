package tests

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/api"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/kasaapi"
	"github.com/kasa-pay/kasa/workflows"
)

// leavesAtCommit is the APIs' store, whose armed command begin sees its client leave as it
// commits: the command is written, and a context its client canceled loses the answer, as
// PostgreSQL's driver then does.
type leavesAtCommit struct {
	api.Store
	armed     atomic.Bool
	committed chan struct{}
}

func (s *leavesAtCommit) BeginCommand(ctx context.Context, c store.Command, lease time.Duration) (store.Command, bool, error) {
	c, began, err := s.Store.BeginCommand(ctx, c, lease)
	if err != nil || !s.armed.CompareAndSwap(true, false) {
		return c, began, err
	}
	close(s.committed)
	select {
	case <-ctx.Done():
		return c, began, ctx.Err()
	case <-time.After(200 * time.Millisecond): // a context the client cannot cancel
		return c, began, nil
	}
}

// A merchant whose client times out just as its capture is committed retries with the same key:
// the retry gets the capture's outcome, not 409 idempotency_key_in_use until the command's lease
// runs out (the sync wait and 5 s), and the bank captures once.
func TestCaptureWhoseClientLeftAtTheCommit(t *testing.T) {
	t.Parallel()
	leaving := &leavesAtCommit{committed: make(chan struct{})}
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc,
		apiStore: func(st api.Store) api.Store { leaving.Store = st; return leaving }})
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	auth := s.pay(m, "left-at-commit", manualBody("inv-left-at-commit", "30.00", payer))
	require.Equal(t, http.StatusCreated, auth.Status, "%s", auth.Body)
	id := auth.json(t)["id"].(string)

	leaving.armed.Store(true)
	ctx, leave := context.WithCancel(context.Background())
	go func() {
		<-leaving.committed
		leave()
	}()
	_, err := kasaapi.Do(ctx, testClient, "POST", s.api.URL+"/v1/payments/"+id+"/capture", m.APIKey, []byte(`{"amount":"20.00"}`),
		"Idempotency-Key", "cap-left", "Content-Type", "application/json")
	require.ErrorIs(t, err, context.Canceled, "the client gave up waiting")

	// A retry while the first request still runs is answered 409 with Retry-After: 1; one a
	// few seconds on gets the outcome.
	var again response
	require.Eventually(t, func() bool {
		again = s.command(m, id, "capture", "cap-left", `{"amount":"20.00"}`)
		return again.Status != http.StatusConflict
	}, 5*time.Second, time.Second, "the retries got 409 for 5 s")
	require.Equal(t, http.StatusCreated, again.Status, "the retry gets the capture's outcome: %s", again.Body)
	require.Equal(t, "succeeded", again.json(t)["status"])
	require.Equal(t, int64(2000), s.held(id).CapturedMinor, "captured once, 20.00")
	require.Equal(t, "80.00", s.account(m, payer)["balance"])
	require.Zero(t, reserved(t, payer), "the rest of the hold released")
}
