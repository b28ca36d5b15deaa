package banksim

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// The control client reads what the bank did and sets its faults, as the tools use it.
func TestControl(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, CapabilityIdempotent)
	c := Control{URL: e.srv.URL}

	m, err := c.Charges(ctx, "pay_1")
	require.NoError(t, err)
	require.Equal(t, Moved{}, m, "nothing moved for an unknown reference")

	one := 1
	require.NoError(t, c.SetFaults(ctx, Rule{On: "charge", Action: "decline", Count: &one}))
	n, err := c.Remaining(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, declined := e.charge(t, "k-1", chargeReq("pay_1"))
	require.Equal(t, statusDeclined, declined.Status, "the rule declines the first charge")
	n, err = c.Remaining(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	code, ch := e.charge(t, "k-2", chargeReq("pay_1"))
	require.Equal(t, 201, code)
	m, err = c.Charges(ctx, "pay_1")
	require.NoError(t, err)
	require.Equal(t, Moved{Count: 1, Succeeded: []string{ch.ID}}, m, "a declined charge moved nothing")
	all, err := c.AllCharges(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string][]string{"pay_1": {ch.ID}}, all, "every reference's, the declined one left out")

	require.NoError(t, c.SetFaults(ctx))
	require.Error(t, c.SetFaults(ctx, Rule{On: "charge", Action: "explode"}), "a bad rule is refused")
	n, err = c.Remaining(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	m, err = c.Refunds(ctx, "ref_1")
	require.NoError(t, err)
	require.Equal(t, Moved{}, m)
	all, err = c.AllRefunds(ctx)
	require.NoError(t, err)
	require.Empty(t, all)

	h, err := c.Authorizations(ctx, "pay_2")
	require.NoError(t, err)
	require.Equal(t, Held{}, h)
	e.capture(t, "cp-1", e.authorized(t, "pay_2"), 100)
	_, a := e.authorize(t, "k-3", chargeReq("pay_2"))
	e.void(t, "vd-1", a.ID)
	h, err = c.Authorizations(ctx, "pay_2")
	require.NoError(t, err)
	require.Equal(t, Held{Count: 2, CapturedMinor: 100, Voided: true}, h)
	_, live := e.authorize(t, "k-4", chargeReq("pay_2"))
	h, err = c.Authorizations(ctx, "pay_2")
	require.NoError(t, err)
	require.Equal(t, []string{live.ID}, h.Live, "only the hold neither captured nor voided")
}
