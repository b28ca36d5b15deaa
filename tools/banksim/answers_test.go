package banksim

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden answers in testdata/ from what the simulator answers now")

// step is one request of an answers script, with the fault rules set before it (if any).
type step struct {
	name   string
	faults string
	method string
	path   string
	key    string
	body   any
	before func(e *env)
}

// TestAnswersGolden sends a charge, a refund and an authorization through every branch of their POST and GET
// handlers (validation, fault before and after the work, replay, key reuse, in progress, a
// failing log) and compares what a client sees, byte for byte, with testdata/; a clock that
// stands still and numbered ids make the answers repeatable. go test ./banksim -run
// TestAnswersGolden -update rewrites them.
func TestAnswersGolden(t *testing.T) {
	charge := func(ref string, amount int64) any {
		return chargeRequest{Reference: ref, AmountMinor: amount, Currency: "TRY", AccountID: "acc_1"}
	}
	refund := func(ref string, amount int64) any { return refundReq(ref, "pay-1", amount) }
	scripts := []struct {
		name  string
		on    string // the fault rules' "on" for the POST
		path  string
		req   func(ref string, amount int64) any
		setup func(t *testing.T, e *env)
		steps []step
		fail  func(e *env) // makes the durable log fail
	}{
		{name: "charge", on: onCharge, path: "/v1/charges", req: charge,
			fail: func(e *env) { _ = e.sim.charges.log.close() }},
		{name: "refund", on: onRefund, path: "/v1/refunds", req: refund,
			setup: func(t *testing.T, e *env) { e.charged(t, "pay-1") },
			fail:  func(e *env) { _ = e.sim.refunds.log.close() }},
		{name: "authorization", on: onAuthorize, path: "/v1/authorizations", req: charge,
			fail: func(e *env) { _ = e.sim.authorizations.log.close() }},
	}
	for _, sc := range scripts {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, CapabilityIdempotent)
			none := newEnv(t, CapabilityNone)
			for _, x := range []*env{e, none} {
				x.sim.now = func() time.Time { return time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC) }
			}
			if sc.setup != nil {
				sc.setup(t, e)
			}
			post := func(name, key string, body any, faults string) step {
				return step{name: name, faults: faults, method: http.MethodPost, path: sc.path, key: key, body: body}
			}
			fault := func(on, action string) string {
				return fmt.Sprintf(`[{"on":%q,"action":%q,"delay_ms":5,"count":1}]`, on, action)
			}
			get := func(name, query, faults string) step {
				return step{name: name, faults: faults, method: http.MethodGet, path: sc.path + query}
			}
			steps := []step{
				post("missing key", "", sc.req("r-1", 100), ""),
				post("malformed", "k-1", `{"reference":`, ""),
				post("unknown field", "k-1", `{"reference":"r-1","x":1}`, ""),
				post("trailing data", "k-1", `{} {}`, ""),
				post("invalid", "k-1", sc.req("r-1", 0), ""),
				post("error_500", "k-1", sc.req("r-1", 100), fault(sc.on, actError500)),
				post("error_429", "k-1", sc.req("r-1", 100), fault(sc.on, actError429)),
				post("created", "k-1", sc.req("r-1", 100), ""),
				post("replay", "k-1", sc.req("r-1", 100), ""),
				post("key reuse", "k-1", sc.req("r-1", 101), ""),
				post("delay", "k-2", sc.req("r-2", 100), fault(sc.on, actDelay)),
				post("decline", "k-3", sc.req("r-3", 100), fault(sc.on, actDecline)),
				post("error_409", "k-4", sc.req("r-4", 100), fault(sc.on, actError409)),
				post("error_503", "k-5", sc.req("r-5", 100), fault(sc.on, actError503)),
				post("garbage", "k-6", sc.req("r-6", 100), fault(sc.on, actGarbage)),
				post("drop_response", "k-7", sc.req("r-7", 100), fault(sc.on, actDropResponse)),
				post("late_booking", "k-8", sc.req("r-8", 100), fault(sc.on, actLateBooking)),
				post("in progress", "k-8", sc.req("r-8", 100), ""),
				post("over refund or big charge", "k-9", sc.req("r-9", 1_000_000), ""),
				get("inquiry", "?reference=r-1", ""),
				get("inquiry declined", "?reference=r-3", ""),
				get("inquiry not booked", "?reference=r-8", ""),
				get("inquiry not found", "?reference=nope", ""),
				get("inquiry no reference", "", ""),
				get("inquiry error_503", "?reference=r-1", fault(onInquiry, actError503)),
				get("inquiry garbage", "?reference=r-1", fault(onInquiry, actGarbage)),
				get("inquiry error_500", "?reference=r-1", fault(onInquiry, actError500)),
			}
			steps = append(steps, post("log fails", "k-10", sc.req("r-10", 100), ""))
			steps[len(steps)-1].before = sc.fail

			var out strings.Builder
			ids := idNumbers{}
			for _, st := range steps {
				if st.faults != "" {
					e.faults(t, st.faults)
				}
				if st.before != nil {
					st.before(e)
				}
				fmt.Fprintf(&out, "== %s\n%s", st.name, ids.render(e.try(t, st.method, st.path, keyHeader(st.key), st.body)))
			}
			fmt.Fprintf(&out, "== inquiry without capability\n%s",
				ids.render(none.try(t, http.MethodGet, sc.path+"?reference=r-1", nil, nil)))
			// What the bank keeps of it all: its control API and the day's settlement file.
			control := "/_sim" + strings.TrimPrefix(sc.path, "/v1")
			for _, path := range []string{control, control + "?reference=r-8", "/v1/settlements/2025-03-14.csv"} {
				fmt.Fprintf(&out, "== GET %s\n%s", path, ids.render(e.try(t, http.MethodGet, path, nil, nil)))
			}

			path := filepath.Join("testdata", sc.name+"_answers.golden")
			if *update {
				require.NoError(t, os.MkdirAll("testdata", 0o755))
				require.NoError(t, os.WriteFile(path, []byte(out.String()), 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "no golden answers: run go test ./banksim -run TestAnswersGolden -update")
			require.Equal(t, string(want), out.String())
		})
	}
}

func keyHeader(key string) map[string]string {
	if key == "" {
		return nil
	}
	return map[string]string{"Idempotency-Key": key}
}

var idPattern = regexp.MustCompile(`\b(ch|rf|au|cp|vd)_[0-9a-f-]{36}\b`)

// idNumbers replaces the simulator's random ids by their order of first appearance.
type idNumbers map[string]string

func (n idNumbers) render(a answer) string {
	if a.dropped {
		return "dropped\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n", a.code)
	names := make([]string, 0, len(a.header))
	for k := range a.header {
		if k != "Date" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		fmt.Fprintf(&b, "%s: %s\n", k, strings.Join(a.header[k], ", "))
	}
	body := idPattern.ReplaceAllStringFunc(string(a.body), func(id string) string {
		if _, ok := n[id]; !ok {
			n[id] = fmt.Sprintf("%s_%d", id[:2], len(n)+1)
		}
		return n[id]
	})
	fmt.Fprintf(&b, "%s\n", body)
	return b.String()
}
