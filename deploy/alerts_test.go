package deploy

import (
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// loadAlerts returns deploy/alerts.yml's rules by name, each checked for the fields Prometheus needs.
func loadAlerts(t *testing.T) map[string]alertRule {
	t.Helper()
	var file struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(readRepoFile(t, "deploy/alerts.yml")))
	dec.KnownFields(true) // a misspelt key is an error here, as it is for Prometheus
	require.NoError(t, dec.Decode(&file), "deploy/alerts.yml")
	require.NotEmpty(t, file.Groups)
	out := map[string]alertRule{}
	var groups []string
	for _, g := range file.Groups {
		require.NotEmpty(t, g.Name)
		require.NotContains(t, groups, g.Name, "group names are unique")
		groups = append(groups, g.Name)
		require.NotEmptyf(t, g.Rules, "group %s", g.Name)
		for _, r := range g.Rules {
			require.Regexpf(t, `^[A-Z][A-Za-z0-9]+$`, r.Alert, "group %s: every rule is an alert with a name", g.Name)
			_, dup := out[r.Alert]
			require.Falsef(t, dup, "alert %s is defined twice", r.Alert)
			out[r.Alert] = r
		}
	}
	return out
}

// alertMetrics are the series alerts.yml may query that kasa does not export.
var alertMetrics = map[string]string{
	"up": "Prometheus's own: whether it could scrape a target",
	// The Temporal Server's (its common/metrics/metric_defs.go), as its /metrics names them.
	"task_schedule_to_start_latency_bucket": "temporal",
	"persistence_errors":                    "temporal",
	"persistence_latency_bucket":            "temporal",
}

func TestAlertRules(t *testing.T) {
	rules := loadAlerts(t)
	registered := registeredMetrics(t, "api", "outbox", "worker", "sweeper")
	for name, r := range rules {
		t.Run(name, func(t *testing.T) {
			if r.For != "" {
				_, err := model.ParseDuration(r.For)
				require.NoError(t, err, "for")
			}
			require.Contains(t, []string{"page", "ticket"}, r.Labels["severity"], "severity")
			require.NotEmpty(t, r.Annotations["summary"])
			require.Len(t, r.Annotations, 2, "summary and runbook")

			names := exprMetrics(r.Expr)
			require.NotEmpty(t, names, r.Expr)
			for _, m := range names {
				base := m
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if b, ok := strings.CutSuffix(m, suffix); ok && registered[b] {
						base = b
					}
				}
				_, other := alertMetrics[m]
				require.Truef(t, registered[base] || other, "%s is neither kasa's (api/, outbox/, worker/, sweeper/) nor in alertMetrics", m)
			}

			// The runbook is a section of a doc in the repository.
			file, anchor, ok := strings.Cut(r.Annotations["runbook"], "#")
			require.True(t, ok, "runbook is docs/<file>.md#<section>")
			require.Regexp(t, `^docs/[a-z]+\.md$`, file)
			var slugs []string
			for _, h := range mdHeading.FindAllStringSubmatch(readRepoFile(t, file), -1) {
				slugs = append(slugs, slug(h[1]))
			}
			require.Containsf(t, slugs, anchor, "%s has no heading for #%s", file, anchor)
		})
	}
}

// exprMetrics are the metric names a PromQL expression selects: its identifiers once label
// matchers, grouping lists and strings are taken out, less functions (followed by "(") and
// operators. (promtool checks the syntax itself: kasa's module does not carry Prometheus's parser.)
func exprMetrics(expr string) []string {
	expr = promLabels.ReplaceAllString(expr, " ")
	var names []string
	for _, m := range promIdent.FindAllStringSubmatch(expr, -1) {
		if m[2] == "" && !slices.Contains(promKeywords, m[1]) {
			names = append(names, m[1])
		}
	}
	return names
}

var (
	promLabels   = regexp.MustCompile(`\{[^}]*\}|\b(by|without|on|ignoring)\s*\([^)]*\)|"[^"]*"|\[[^\]]*\]`)
	promIdent    = regexp.MustCompile(`\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b\s*(\()?`)
	promKeywords = []string{"by", "without", "on", "ignoring", "bool", "and", "or", "unless", "offset", "group_left", "group_right"}
)

// docAlert is one alert the docs name: phrase is their words, alert the rule that implements it;
// the rule's expression contains expr, and severity is page when money is wrong or waits past its bound.
type docAlert struct {
	doc, phrase, alert, expr, severity string
}

var docAlerts = []docAlert{
	{"operations.md", "payments refused past the backlog's bound (alert when it rises)", "KasaBacklogRefusing", "increase(kasa_backlog_refused_total[5m])) > 0", "ticket"},
	{"operations.md", "or they are still processing after an hour (alert when above 0", "KasaPaymentsStuck", "max(kasa_payments_stuck) > 0", "page"},
	{"operations.md", "a minute after their `capture_before` (alert when above 0", "KasaAuthorizationsOverdue", "max(kasa_authorizations_overdue) > 0", "page"},
	{"operations.md", "is idempotency-record retention keeping up? Alert when the last success is older than a few minutes", "KasaIdempotencyRetentionStalled", "time() - max(kasa_idempotency_retention_last_success_timestamp_seconds) > ", "ticket"},
	{"operations.md", "is the check running, and what does it cost? Alert when the last success is older than three intervals", "KasaLedgerCheckNotRunning", "> 3 * 600", "ticket"},
	{"operations.md", "namespace). Alert when it is above 0 for a few minutes.", "KasaPaymentsStuck", "> 0", "page"},
	{"operations.md", "**Alert** when `max(kasa_ledger_violations) > 0` (page", "KasaLedgerViolations", "max(kasa_ledger_violations) > 0", "page"},
	{"operations.md", "when `time() - max(kasa_ledger_verify_last_success_timestamp_seconds)` exceeds three intervals", "KasaLedgerCheckNotRunning", "time() - max(kasa_ledger_verify_last_success_timestamp_seconds) > 3 * 600", "ticket"},
	{"deployment.md", "`kasa_payments_stuck` or `kasa_refunds_stuck` > 0", "KasaPaymentsStuck", "> 0", "page"},
	{"deployment.md", "`kasa_payments_stuck` or `kasa_refunds_stuck` > 0", "KasaRefundsStuck", "max(kasa_refunds_stuck) > 0", "page"},
	{"deployment.md", "`kasa_ledger_violations` > 0: money invariants are broken", "KasaLedgerViolations", "> 0", "page"},
	{"deployment.md", "(`kasa_ledger_verify_last_success_timestamp_seconds` older than three intervals)", "KasaLedgerCheckNotRunning", "> 3 * 600", "ticket"},
	{"deployment.md", "`kasa_unknown_payments`, `kasa_unknown_refunds` and `kasa_reconcile_age_seconds` growing", "KasaUnknownPastBound", "max(kasa_reconcile_age_seconds) > ", "page"},
	{"deployment.md", "whether the daily settlement file ran (`kasa_reconcile_last_run_timestamp_seconds`)", "KasaReconcileMissed", "time() - max(kasa_reconcile_last_run_timestamp_seconds) > 86400", "ticket"},
	{"deployment.md", "`kasa_outbox_backlog` / `kasa_outbox_oldest_age_seconds` growing", "KasaOutboxBehind", "max(kasa_outbox_oldest_age_seconds) > ", "ticket"},
	{"deployment.md", "`/readyz` failing on any instance", "KasaTargetDown", `up{job=~"api|worker|relay|temporal"} == 0`, "ticket"},
	{"deployment.md", "the 5xx rate", "KasaHTTPErrors", `{status=~"5.."}`, "ticket"},
	{"deployment.md", "p99 of `kasa_http_request_duration_seconds`", "KasaHTTPSlow", "histogram_quantile(0.99, ", "ticket"},
	{"deployment.md", "`kasa_workflow_start_duration_seconds` rising", "KasaWorkflowStartSlow", "histogram_quantile(0.99, ", "ticket"},
	{"deployment.md", "**schedule-to-start latency** of the payment task queue", "TemporalScheduleToStartSlow", "task_schedule_to_start_latency_bucket", "ticket"},
	{"deployment.md", "**persistence latency and errors**", "TemporalPersistenceErrors", "increase(persistence_errors[5m])", "ticket"},
	{"deployment.md", "**persistence latency and errors**", "TemporalPersistenceSlow", "persistence_latency_bucket", "ticket"},
	// Restarts and shard ownership changes are left to `temporal operator cluster health`.
	{"deployment.md", "Shard and service health", "KasaTargetDown", "temporal", "ticket"},
}

var (
	mdListItem = regexp.MustCompile(`^(- |\d+\. |\|)`)
	alertWord  = regexp.MustCompile(`(?i)\balert`)
)

// docPassages splits markdown into paragraphs, list items and table rows, each on one line.
func docPassages(md string) []string {
	var out []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.Join(cur, " "))
			cur = nil
		}
	}
	for _, line := range strings.Split(md, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || mdListItem.MatchString(line) {
			flush()
		}
		if line != "" {
			cur = append(cur, line)
		}
	}
	flush()
	return out
}

// alertPassages are the passages of the docs that name an alert: those saying "alert" in
// operations.md, reconciliation.md and webhooks.md, and the list items of deployment.md's "What
// to monitor".
func alertPassages(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, doc := range []string{"operations.md", "reconciliation.md", "webhooks.md"} {
		for _, p := range docPassages(readRepoFile(t, "docs/"+doc)) {
			if alertWord.MatchString(p) && !strings.Contains(p, "deploy/alerts.yml") { // not the file's own description
				out[doc] = append(out[doc], p)
			}
		}
	}
	_, monitor, ok := strings.Cut(readRepoFile(t, "docs/deployment.md"), "\n## What to monitor\n")
	require.True(t, ok, `deployment.md has a "What to monitor" section`)
	monitor, _, _ = strings.Cut(monitor, "\n## ")
	for _, p := range docPassages(monitor) {
		if strings.HasPrefix(p, "- ") {
			out["deployment.md"] = append(out["deployment.md"], p)
		}
	}
	require.NotEmpty(t, out["operations.md"])
	require.NotEmpty(t, out["deployment.md"])
	return out
}

// Every alert the docs name ships in deploy/alerts.yml, and every rule there is one the docs name.
func TestAlertsAreTheDocs(t *testing.T) {
	rules := loadAlerts(t)
	passages := alertPassages(t)
	covered := map[string]bool{}
	for _, da := range docAlerts {
		t.Run(da.alert+"/"+da.phrase, func(t *testing.T) {
			found := slices.ContainsFunc(passages[da.doc], func(p string) bool { return strings.Contains(p, da.phrase) })
			require.Truef(t, found, "no passage of docs/%s that names an alert says %q", da.doc, da.phrase)
			r, ok := rules[da.alert]
			require.Truef(t, ok, "docs/%s names an alert (%q) that deploy/alerts.yml lacks: %s", da.doc, da.phrase, da.alert)
			require.Contains(t, r.Expr, da.expr)
			require.Equal(t, da.severity, r.Labels["severity"])
		})
		covered[da.alert] = true
	}
	for doc, ps := range passages {
		for _, p := range ps {
			named := slices.ContainsFunc(docAlerts, func(da docAlert) bool { return da.doc == doc && strings.Contains(p, da.phrase) })
			require.Truef(t, named, "docs/%s names an alert that docAlerts does not map to a rule: %q", doc, p)
		}
	}
	for name := range rules {
		require.Truef(t, covered[name], "deploy/alerts.yml's %s is in no doc: name it where the docs say what to alert on", name)
	}
}

// Compose's Prometheus loads the rules from the file the repository ships.
func TestAlertsLoaded(t *testing.T) {
	c := loadCompose(t)
	var cfg prometheusConfig
	require.NoError(t, yaml.Unmarshal([]byte(readRepoFile(t, "deploy/prometheus.yml")), &cfg))
	m := c.mountOf(t, "prometheus", "./deploy/alerts.yml")
	require.True(t, m.readOnly, "mount read-only, as the config is")
	dir := path.Dir(flagValue(t, c.command(t, "prometheus"), "config.file"))
	var loaded []string
	for _, f := range cfg.RuleFiles {
		if !path.IsAbs(f) {
			f = path.Join(dir, f) // Prometheus reads rule_files relative to its config file
		}
		loaded = append(loaded, f)
	}
	require.Contains(t, loaded, m.target, "deploy/prometheus.yml's rule_files must name the mounted deploy/alerts.yml")
}
