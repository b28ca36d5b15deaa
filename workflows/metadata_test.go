package workflows

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// The list's PaymentSummary holds the summary whole when it fits a Keyword column (255
// characters), and cut on a character boundary, marked, when it does not.
func TestListedSummaryFitsItsColumn(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		whole    bool
	}{
		{"short", "payment 12.34 TRY · invoice 1 · merchant m", true},
		{"255 characters", strings.Repeat("ş", 255), true},
		{"256 characters", strings.Repeat("ş", 256), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := listed(tc.in)
			require.True(t, utf8.ValidString(got))
			require.LessOrEqual(t, utf8.RuneCountInString(got), 255)
			if tc.whole {
				require.Equal(t, tc.in, got)
			} else {
				require.True(t, strings.HasSuffix(got, "…"))
				require.True(t, strings.HasPrefix(tc.in, strings.TrimSuffix(got, "…")))
			}
		})
	}
}
