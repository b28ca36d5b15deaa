package deploy

import (
	"encoding/json"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// dashboardTargets returns every panel's title and query expressions in docs/grafana/kasa-dashboard.json.
func dashboardTargets(t *testing.T) map[string][]string {
	t.Helper()
	var dash struct {
		Panels []grafanaPanel `json:"panels"`
	}
	require.NoError(t, json.Unmarshal([]byte(readRepoFile(t, "docs/grafana/kasa-dashboard.json")), &dash))
	out := map[string][]string{}
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out[p.Title] = append(out[p.Title], tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	require.NotEmpty(t, out)
	return out
}

var (
	selectorRef = regexp.MustCompile(`(kasa_[a-z_]+)(\{([^}]*)\})?`)
	matcherRef  = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	ratioExpr   = regexp.MustCompile(`^sum\(rate\(([^\[]+)\[[^\]]+\]\)\) / sum\(rate\(([^\[]+)\[[^\]]+\]\)\)$`)
)

// selects reports whether the label matchers of selector (PromQL, without the metric name's
// own braces) all accept labels.
func selects(t *testing.T, matchers string, labels map[string]string) bool {
	t.Helper()
	for _, m := range matcherRef.FindAllStringSubmatch(matchers, -1) {
		v := labels[m[1]]
		var ok bool
		switch m[2] {
		case "=":
			ok = v == m[3]
		case "!=":
			ok = v != m[3]
		case "=~", "!~":
			ok = regexp.MustCompile("^(?:" + m[3] + ")$").MatchString(v)
			if m[2] == "!~" {
				ok = !ok
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// The duplicate ratio is the share of payment and refund requests that were not new ones
// (docs/operations.md's metrics table; the seed's duplicate_ratio: retries, a faulty client). A
// new payment queued in the start backlog counts under outcome "new" and again under "queued",
// so a payday burst without a single retry must read 0, not the share that was queued.
func TestDashboardDuplicateRatio(t *testing.T) {
	exprs := dashboardTargets(t)["Duplicate ratio"]
	require.Len(t, exprs, 1)
	m := ratioExpr.FindStringSubmatch(exprs[0])
	require.NotNilf(t, m, "the duplicate ratio is sum(rate(A)) / sum(rate(B)): %s", exprs[0])
	ratio := func(perOutcome map[string]float64) float64 {
		var num, den float64
		for i, part := range []*float64{&num, &den} {
			sel := selectorRef.FindStringSubmatch(m[i+1])
			require.Equal(t, "kasa_idempotency_requests_total", sel[1])
			for outcome, n := range perOutcome {
				if selects(t, sel[3], map[string]string{"outcome": outcome}) {
					*part += n
				}
			}
		}
		return num / den
	}
	for _, tc := range []struct {
		name       string
		perOutcome map[string]float64 // requests a second, as the API counts them
		want       float64
	}{
		{"new payments only", map[string]float64{"new": 100}, 0},
		{"a payday burst, 60 of 100 new payments queued", map[string]float64{"new": 100, "queued": 60}, 0},
		{"a quarter of the requests are retries", map[string]float64{"new": 75, "replayed": 20, "in_use": 5}, 0.25},
		{"retries during a burst", map[string]float64{"new": 75, "queued": 50, "replayed": 15, "reused": 5, "duplicate_payment": 5}, 0.25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, ratio(tc.perOutcome), 1e-9, exprs[0])
		})
	}
}

// Every API instance reports the figures it reads from the database at scrape time alike
// (deploy/prometheus.yml, docs/deployment.md): a panel that sums them over the instances shows
// each figure once per API. These are the metrics the API's database collector describes.
func TestDashboardDoesNotSumDatabaseFigures(t *testing.T) {
	src := readRepoFile(t, "api/metrics.go")
	var dbMetrics []string
	for _, m := range regexp.MustCompile(`prometheus\.NewDesc\("(kasa_[a-z_]+)"`).FindAllStringSubmatch(src, -1) {
		dbMetrics = append(dbMetrics, m[1])
	}
	require.Contains(t, dbMetrics, "kasa_unknown_payments")
	require.Contains(t, dbMetrics, "kasa_reconcile_outcomes_total")
	summed := regexp.MustCompile(`\bsum\s*(\(|by\b|without\b)`)
	for title, exprs := range dashboardTargets(t) {
		for _, expr := range exprs {
			for _, name := range selectorRef.FindAllStringSubmatch(expr, -1) {
				if !slices.Contains(dbMetrics, name[1]) {
					continue
				}
				require.Falsef(t, summed.MatchString(expr),
					"panel %q sums %s, which every API reports alike: take max, not sum: %s", title, name[1], expr)
			}
		}
	}
}
