package outbox

import (
	"errors"
	"net/url"
	"strings"
)

// RedactURL is raw as logs and stored errors may show it: without a password, a query string
// or a fragment, where merchants and brokers put their secrets (a webhook's token, a NATS
// user's password). A list of URLs, as KASA_NATS_URL takes, is redacted one by one.
func RedactURL(raw string) string {
	if strings.Contains(raw, ",") {
		parts := strings.Split(raw, ",")
		for i, p := range parts {
			parts[i] = RedactURL(strings.TrimSpace(p))
		}
		return strings.Join(parts, ",")
	}
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

// redactErr hides the secrets of the URL an HTTP client's error names (Post "…": cause).
func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = RedactURL(ue.URL)
	}
	return err
}
