package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Targets 1a and 3 divide each pass's run by the run beside it, never by a run from another
// moment of the machine, and average the two passes' ratios.
func TestPairedTargetsDivideRunsOfOnePass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		num1, den1 float64
		num2, den2 float64
		want       float64
		wantInputs string
	}{
		{name: "both passes alike", num1: 60, den1: 75, num2: 64, den2: 80, want: 0.8,
			wantInputs: "mean of 60.0 ÷ 75.0 = 0.80 and 64.0 ÷ 80.0 = 0.80"},
		// The faster numerator over the faster denominator (62 ÷ 80) would miss the goal here.
		{name: "the machine slowed between the passes", num1: 62, den1: 80, num2: 50, den2: 60, want: (62.0/80 + 50.0/60) / 2,
			wantInputs: "mean of 62.0 ÷ 80.0 = 0.78 and 50.0 ÷ 60.0 = 0.83"},
		{name: "a fast numerator beside a fast denominator", num1: 62, den1: 80, num2: 50, den2: 70, want: (62.0/80 + 50.0/70) / 2,
			wantInputs: "mean of 62.0 ÷ 80.0 = 0.78 and 50.0 ÷ 70.0 = 0.71"},
		{name: "a denominator missing", num1: 62, den1: 0, num2: 50, den2: 50, want: 0.5,
			wantInputs: "mean of 62.0 ÷ 0.0 = 0.00 and 50.0 ÷ 50.0 = 1.00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, target := range []struct {
				index     int
				name      string
				num, den  string
				threshold float64
				denRate   func(float64) Result
			}{
				{0, "1a new payments vs Temporal", RunSpread, RunTOwn, 0.8, func(v float64) Result { return Result{Throughput: v} }},
				{3, "3 one hot merchant vs many", RunHot, RunSpread, 0.9, func(v float64) Result { return Result{NewPaymentRate: v} }},
			} {
				runs := map[string]Result{
					target.num + " #1": {NewPaymentRate: tc.num1}, target.den + " #1": target.denRate(tc.den1),
					target.num + " #2": {NewPaymentRate: tc.num2}, target.den + " #2": target.denRate(tc.den2),
				}
				got := targets(runs, nil)[target.index]
				require.Contains(t, got.Name, target.name)
				require.InDelta(t, tc.want, got.Value, 1e-9)
				require.Equal(t, tc.want >= target.threshold-1e-9, got.Met)
				require.Equal(t, tc.wantInputs, got.Inputs)
			}
		})
	}
}

// Target 4 takes each table's runs relative to the run beside them (new payments to T, replays
// to H), so a machine that slowed between the small and the large table's runs does not count
// against kasa, and a kasa that slowed on the large table does.
func TestLargeTableTargetsArePacedByTheRunsBesideThem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		large1, by1  float64
		large2, by2  float64
		want         float64
		met          bool
		inputsPrefix string
	}{
		{name: "the machine slowed by 30%, kasa did not", large1: 56, by1: 70, large2: 58.8, by2: 73.5, want: 1, met: true,
			inputsPrefix: "(mean of 56.0 ÷ 70.0 = 0.80 and 58.8 ÷ 73.5 = 0.80) ÷ (mean of 80.0 ÷ 100.0 = 0.80 and 84.0 ÷ 105.0 = 0.80)"},
		{name: "kasa slowed by 20% on the large table", large1: 64, by1: 100, large2: 67.2, by2: 105, want: 0.8, met: false},
		{name: "a fast spell beside one large run", large1: 80, by1: 100, large2: 100, by2: 140, want: (0.8 + 100.0/140) / 2 / 0.8, met: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, target := range []struct {
				name           string
				small, smallBy string
				large, largeBy string
			}{
				{"4 new payments with a large table", RunSpread, RunTOwn, RunSpreadLarge, RunTLarge},
				{"4 replays with a large table", RunReplay, RunHTTP, RunReplayLarge, RunHLarge},
			} {
				runs := map[string]Result{
					target.small + " #1": {Throughput: 80}, target.smallBy + " #1": {Throughput: 100},
					target.small + " #2": {Throughput: 84}, target.smallBy + " #2": {Throughput: 105},
					target.large + " #1": {Throughput: tc.large1}, target.largeBy + " #1": {Throughput: tc.by1},
					target.large + " #2": {Throughput: tc.large2}, target.largeBy + " #2": {Throughput: tc.by2},
				}
				var got *Target
				for _, tg := range targets(runs, nil) {
					if tg.Name == target.name {
						got = &tg
					}
				}
				require.NotNil(t, got, target.name)
				require.InDelta(t, tc.want, got.Value, 1e-9, target.name)
				require.Equal(t, tc.met, got.Met, target.name)
				require.True(t, strings.HasPrefix(got.Inputs, tc.inputsPrefix), got.Inputs)
			}
		})
	}
}
