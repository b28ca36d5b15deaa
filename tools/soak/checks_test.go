package soak

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// A kasa verify that fails without a word is still a violation, named by its error, never an
// empty example.
func TestCheckVerifyNamesASilentFailure(t *testing.T) {
	s := &stack{dir: t.TempDir(), o: Options{Binary: "/bin/false"}}
	c := s.checkVerify(context.Background())
	require.False(t, c.OK)
	require.Equal(t, 1, c.Violations)
	require.Len(t, c.Examples, 1)
	require.Contains(t, c.Examples[0], "exit status 1")
}

// A check counts what it looked at, not what it passed over: the expiry check counts the
// expired authorizations (k5's and k7's), not every manual payment, so that a run in which none
// expired shows it checked nothing.
func TestExpiryCheckCountsTheExpired(t *testing.T) {
	state := newSoakState()
	c := checkExpiries(state.st, state.hook.byPayment())
	require.True(t, c.OK, "%v", c.Examples)
	require.Equal(t, 2, c.Checked)

	for _, id := range []string{"p5", "p7"} {
		state.st.payments[id].res.Status = payment.StatusSucceeded
	}
	require.Zero(t, checkExpiries(state.st, state.hook.byPayment()).Checked)
}

// A check that looked at nothing does not read as one that held: the report says it checked
// nothing, and names the checks that were not run at all, with why.
func TestReportShowsWhatWasNotChecked(t *testing.T) {
	rep := &Report{Checks: []Check{{Name: "held", OK: true, Checked: 3}, {Name: "empty", OK: true}},
		Unchecked: []string{"probed: no manual payment waited"}}
	var b bytes.Buffer
	rep.WriteText(&b)
	require.Contains(t, b.String(), "| held | ok | 3 | 0 |")
	require.Contains(t, b.String(), "| empty | nothing to check | 0 | 0 |")
	require.Contains(t, b.String(), "Not checked:\n\n- probed: no manual payment waited\n")
}
