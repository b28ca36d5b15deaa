package outbox

import (
	"errors"
	"net/url"
	"strings"
)

// RedactURL is raw as logs and stored errors may show it: without a password, a query string
// or a fragment, where merchants and brokers put their secrets (a webhook's token, a NATS
// user's password). A secret in the path is not recognised: merchants are told not to put one
// there (docs/webhooks.md).
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	if u.RawQuery != "" || u.ForceQuery {
		u.RawQuery, u.ForceQuery = "…", false
	}
	u.Fragment, u.RawFragment = "", ""
	return u.Redacted()
}

// redactURLs redacts a comma-separated list of URLs, as KASA_NATS_URL takes (a webhook URL is
// one URL, commas and all).
func redactURLs(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		parts[i] = RedactURL(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

// redactErr hides the secrets of the URL an HTTP client's error names (Post "…": cause).
func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = RedactURL(ue.URL)
	}
	return err
}
