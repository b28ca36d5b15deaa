package banksim

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/kasa-pay/kasa/tools/kasaapi"
)

// Control is a client of a running simulator's control API (/_sim): what the end-to-end tests,
// the soak and the benchmark ask the bank and tell it. Its zero Client is http.DefaultClient.
type Control struct {
	URL    string // the simulator's base URL, http://host:port
	Client *http.Client
}

// Moved is what the bank did for one reference: how many times money moved, the late bookings
// still to come, and the ids of the charges or refunds that succeeded.
type Moved struct {
	Count     int
	Pending   int
	Succeeded []string
}

// Rule is one fault rule of PUT /_sim/faults (docs/tools.md, "The bank simulator").
type Rule struct {
	On          string   `json:"on"`
	Action      string   `json:"action"`
	DelayMS     int      `json:"delay_ms,omitempty"`
	Count       *int     `json:"count,omitempty"`
	Probability *float64 `json:"probability,omitempty"`
}

// Charges is GET /_sim/charges?reference=.
func (c Control) Charges(ctx context.Context, reference string) (Moved, error) {
	m, _, err := c.moved(ctx, "charges", reference)
	return m, err
}

// Refunds is GET /_sim/refunds?reference=.
func (c Control) Refunds(ctx context.Context, reference string) (Moved, error) {
	m, _, err := c.moved(ctx, "refunds", reference)
	return m, err
}

// AllCharges is every charge that succeeded (GET /_sim/charges without a reference): their ids,
// by the reference each was made for. Late bookings still to come are left out.
func (c Control) AllCharges(ctx context.Context) (map[string][]string, error) {
	_, all, err := c.moved(ctx, "charges", "")
	return all, err
}

// AllRefunds is AllCharges for refunds (GET /_sim/refunds).
func (c Control) AllRefunds(ctx context.Context) (map[string][]string, error) {
	_, all, err := c.moved(ctx, "refunds", "")
	return all, err
}

// Held is what the bank did with the authorizations of one reference: how many holds it
// placed (and has still to book), what their captures took, whether one was voided, and the
// ids of those still held (neither captured, voided, declined nor expired).
type Held struct {
	Count, Pending int
	CapturedMinor  int64
	Voided         bool
	Live           []string
}

// Authorizations is GET /_sim/authorizations?reference=.
func (c Control) Authorizations(ctx context.Context, reference string) (Held, error) {
	var out struct { // the names without a tag match case-insensitively
		Count          *int
		Pending        int
		CapturedMinor  int64 `json:"captured_minor"`
		Voided         bool
		Authorizations []struct{ ID, State string }
	}
	if err := c.do(ctx, http.MethodGet, "/_sim/authorizations?reference="+url.QueryEscape(reference), nil, &out); err != nil {
		return Held{}, err
	}
	if out.Count == nil {
		return Held{}, fmt.Errorf("banksim: authorizations of %s: an answer without count", reference)
	}
	h := Held{Count: *out.Count, Pending: out.Pending, CapturedMinor: out.CapturedMinor, Voided: out.Voided}
	for _, a := range out.Authorizations {
		if a.State == stateAuthorized {
			h.Live = append(h.Live, a.ID)
		}
	}
	return h, nil
}

// moved is what the bank did for reference ("" for every one), and the ids that succeeded by
// their references.
func (c Control) moved(ctx context.Context, kind, reference string) (Moved, map[string][]string, error) {
	var out struct { // the names match case-insensitively
		Count            *int
		Pending          int
		Charges, Refunds []struct{ ID, Reference, Status string }
	}
	if err := c.do(ctx, http.MethodGet, "/_sim/"+kind+"?reference="+url.QueryEscape(reference), nil, &out); err != nil {
		return Moved{}, nil, err
	}
	if out.Count == nil {
		return Moved{}, nil, fmt.Errorf("banksim: %s of %s: an answer without count", kind, reference)
	}
	m, all := Moved{Count: *out.Count, Pending: out.Pending}, map[string][]string{}
	for _, r := range append(out.Charges, out.Refunds...) {
		if r.Status == statusSucceeded {
			m.Succeeded = append(m.Succeeded, r.ID)
			all[r.Reference] = append(all[r.Reference], r.ID)
		}
	}
	return m, all, nil
}

// SetFaults replaces the fault rules; no rules clears them.
func (c Control) SetFaults(ctx context.Context, rules ...Rule) error {
	if len(rules) == 0 {
		return c.do(ctx, http.MethodDelete, "/_sim/faults", nil, nil)
	}
	b, err := json.Marshal(map[string][]Rule{"rules": rules})
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPut, "/_sim/faults", b, nil)
}

// Remaining is how many more requests the counted fault rules will hit, together.
func (c Control) Remaining(ctx context.Context) (int, error) {
	var out struct{ Rules []struct{ Remaining *int } }
	if err := c.do(ctx, http.MethodGet, "/_sim/faults", nil, &out); err != nil {
		return 0, err
	}
	n := 0
	for _, r := range out.Rules {
		if r.Remaining != nil {
			n += *r.Remaining
		}
	}
	return n, nil
}

// do sends one request and decodes a 2xx answer into out (when not nil); another status is an
// error quoting the body.
func (c Control) do(ctx context.Context, method, path string, body []byte, out any) error {
	a, err := kasaapi.Do(ctx, cmp.Or(c.Client, http.DefaultClient), method, strings.TrimRight(c.URL, "/")+path, "", body)
	switch {
	case err != nil:
		return fmt.Errorf("banksim: %s %s: %w", method, path, err)
	case a.Status/100 != 2:
		return fmt.Errorf("banksim: %s %s: %d %s", method, path, a.Status, bytes.TrimSpace(a.Body))
	case out != nil:
		if err := json.Unmarshal(a.Body, out); err != nil {
			return fmt.Errorf("banksim: %s %s: %w", method, path, err)
		}
	}
	return nil
}
