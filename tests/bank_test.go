package tests

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/banksim"
)

// The bank simulator's control API, through the one client the tools share.

// bankCharges is how many times the simulator at url moved money for a payment, and the ids of
// the charges that succeeded.
func bankCharges(t *testing.T, url, reference string) (int, []string) {
	t.Helper()
	m, err := banksim.Control{URL: url}.Charges(context.Background(), reference)
	require.NoError(t, err)
	return m.Count, m.Succeeded
}

// bankRefunds is how many times the simulator at url moved money back for a refund.
func bankRefunds(t *testing.T, url, reference string) int {
	t.Helper()
	m, err := banksim.Control{URL: url}.Refunds(context.Background(), reference)
	require.NoError(t, err)
	return m.Count
}

// setBankFaults replaces the simulator's fault rules with those of the PUT /_sim/faults body
// rules (`{"rules":[...]}`, as docs/tools.md shows them).
func setBankFaults(t *testing.T, url, rules string) {
	t.Helper()
	var body struct{ Rules []banksim.Rule }
	dec := json.NewDecoder(strings.NewReader(rules))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&body), "%s", rules)
	require.NoError(t, banksim.Control{URL: url}.SetFaults(context.Background(), body.Rules...))
}

// bankFaultsLeft is how many more requests the simulator's counted fault rules will hit.
func bankFaultsLeft(t *testing.T, url string) int {
	t.Helper()
	n, err := banksim.Control{URL: url}.Remaining(context.Background())
	require.NoError(t, err)
	return n
}
