package workflows_test

import (
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// Every key the API takes (up to 255 characters) names a workflow id a Temporal Server with
// limit.maxIDLength 255 accepts (deployment.md): the ids of keys that fit are the key's own, and
// a longer one is shortened with its digest, so two keys never share an id.
func TestWorkflowIDsFitTemporalsLimit(t *testing.T) {
	m := uuid.MustParse("0190a5b2-7c1e-7d3a-9f00-3b1c2d4e5f60")
	ids := map[string]func(uuid.UUID, string) string{"payment": workflows.PaymentWorkflowID, "refund": workflows.RefundWorkflowID}
	for kind, id := range ids {
		for _, tc := range []struct {
			name string
			key  string
			own  bool // the id is prefix/merchant/key
		}{
			{"short", "k-1", true},
			{"longest that fits", strings.Repeat("a", 255-len(kind)-1-36-1), true},
			{"one longer", strings.Repeat("a", 255-len(kind)-1-36), false},
			{"longest key", strings.Repeat("a", 255), false},
			{"longest key, another last character", strings.Repeat("a", 254) + "b", false},
		} {
			t.Run(kind+" "+tc.name, func(t *testing.T) {
				got := id(m, tc.key)
				require.LessOrEqual(t, len(got), 255)
				if tc.own {
					require.Equal(t, kind+"/"+m.String()+"/"+tc.key, got)
				} else {
					require.True(t, strings.HasPrefix(got, kind+"/"+m.String()+"/aaaa"), got)
				}
			})
		}
		require.NotEqual(t, id(m, strings.Repeat("a", 255)), id(m, strings.Repeat("a", 254)+"b"))
		require.NotEqual(t, id(m, strings.Repeat("a", 255)), id(m, strings.Repeat("a", 254)))
	}
}

// A key that fits is the id's last part as it is, so a shortened id must not be one a fitting
// key could make: a key of the longest length that fits, made of a long key's first characters
// and its digest, would otherwise name that long key's workflow.
func TestShortenedWorkflowIDIsNoFittingKeys(t *testing.T) {
	m := uuid.MustParse("0190a5b2-7c1e-7d3a-9f00-3b1c2d4e5f60")
	for kind, id := range map[string]func(uuid.UUID, string) string{"payment": workflows.PaymentWorkflowID, "refund": workflows.RefundWorkflowID} {
		shortened := id(m, strings.Repeat("a", 255))
		forged := strings.TrimPrefix(shortened, kind+"/"+m.String()+"/")
		if payment.ValidKey(forged) {
			require.NotEqual(t, shortened, id(m, forged), "%s: the key %q names the workflow of another key", kind, forged)
		}
	}
}
