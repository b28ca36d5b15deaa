package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Target 1a divides kasa's faster payments pass by the T pass run beside it, never by a T pass
// from another moment of the machine; target 3 likewise divides the faster one-merchant pass by
// the many-merchant run of its pass.
func TestPairedTargetsDivideRunsOfOnePass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		kasa1, t1  float64
		kasa2, t2  float64
		want       float64
		wantMet    bool
		wantInputs string
	}{
		{name: "second pass faster", kasa1: 50, t1: 80, kasa2: 60, t2: 70, want: 60.0 / 70, wantMet: true,
			wantInputs: "60.0 ÷ 70.0 (pass #2; pass #1: 50.0 ÷ 80.0 = 0.62)"},
		{name: "first pass faster, its T slower than the other", kasa1: 62, t1: 70, kasa2: 55, t2: 80, want: 62.0 / 70, wantMet: true,
			wantInputs: "62.0 ÷ 70.0 (pass #1; pass #2: 55.0 ÷ 80.0 = 0.69)"},
		// The best kasa pass against the best T would give 62 ÷ 70 = 0.89; beside its own T it is 0.78.
		{name: "faster kasa pass beside a fast T", kasa1: 62, t1: 80, kasa2: 50, t2: 70, want: 62.0 / 80, wantMet: false,
			wantInputs: "62.0 ÷ 80.0 (pass #1; pass #2: 50.0 ÷ 70.0 = 0.71)"},
		{name: "no T measured", kasa1: 62, kasa2: 50, want: 0, wantMet: false,
			wantInputs: "62.0 ÷ 0.0 (pass #1; pass #2: 50.0 ÷ 0.0 = 0.00)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runs := map[string]Result{
				RunSpread + " #1": {NewPaymentRate: tc.kasa1}, RunTOwn + " #1": {Throughput: tc.t1},
				RunSpread + " #2": {NewPaymentRate: tc.kasa2}, RunTOwn + " #2": {Throughput: tc.t2},
			}
			got := targets(runs, nil)[0]
			require.Contains(t, got.Name, "1a")
			require.InDelta(t, tc.want, got.Value, 1e-9)
			require.Equal(t, tc.wantMet, got.Met)
			require.Equal(t, tc.wantInputs, got.Inputs)

			// The same pairs as target 3's: kasa's one-merchant runs over its many-merchant runs.
			runs = map[string]Result{
				RunHot + " #1": {NewPaymentRate: tc.kasa1}, RunSpread + " #1": {NewPaymentRate: tc.t1},
				RunHot + " #2": {NewPaymentRate: tc.kasa2}, RunSpread + " #2": {NewPaymentRate: tc.t2},
			}
			got = targets(runs, nil)[3]
			require.Contains(t, got.Name, "3 one hot merchant")
			require.InDelta(t, tc.want, got.Value, 1e-9)
			require.Equal(t, tc.want >= 0.9, got.Met)
			require.Equal(t, tc.wantInputs, got.Inputs)
		})
	}
}
