package banksim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func (e *env) authorize(t *testing.T, key string, req any) (int, authorization) {
	t.Helper()
	return posted[authorization](t, e, "/v1/authorizations", key, req)
}

func (e *env) capture(t *testing.T, key, id string, amount int64) (int, capture) {
	t.Helper()
	return posted[capture](t, e, "/v1/authorizations/"+id+"/capture", key, captureRequest{AmountMinor: amount})
}

func (e *env) void(t *testing.T, key, id string) (int, void) {
	t.Helper()
	return posted[void](t, e, "/v1/authorizations/"+id+"/void", key, nil)
}

// authorized places a hold of 123.45 TRY for ref and returns its id.
func (e *env) authorized(t *testing.T, ref string) string {
	t.Helper()
	code, a := e.authorize(t, ref, chargeReq(ref))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, statusSucceeded, a.Status)
	return a.ID
}

type simAuthorizations struct {
	Count          int          `json:"count"`
	CapturedMinor  int64        `json:"captured_minor"`
	Voided         bool         `json:"voided"`
	Authorizations []authRecord `json:"authorizations"`
	Pending        int          `json:"pending"`
}

func (e *env) held(t *testing.T, ref string) simAuthorizations {
	t.Helper()
	return kept[simAuthorizations](t, e, "/_sim/authorizations", ref)
}

// inquired is GET /v1/authorizations?reference=ref, which must find it.
func (e *env) inquired(t *testing.T, ref string) authorization {
	t.Helper()
	code, b := e.do(t, http.MethodGet, "/v1/authorizations?reference="+ref, nil, nil)
	require.Equal(t, http.StatusOK, code, "%s", b)
	var a authorization
	require.NoError(t, json.Unmarshal(b, &a))
	return a
}

// act is a capture (of amount) or a void of the authorization, and the status it must get.
type act struct {
	void   bool
	amount int64
	want   string
}

// act1 sends a with key and checks its answer.
func (e *env) act1(t *testing.T, key, id, ref string, a act) {
	t.Helper()
	if a.void {
		code, v := e.void(t, key, id)
		require.Equal(t, http.StatusCreated, code)
		require.Equal(t, void{ID: v.ID, AuthorizationID: id, Reference: ref, Status: a.want}, v)
		require.Regexp(t, `^vd_`, v.ID)
		return
	}
	code, c := e.capture(t, key, id, a.amount)
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, capture{ID: c.ID, AuthorizationID: id, Reference: ref, AmountMinor: a.amount, Status: a.want}, c)
	require.Regexp(t, `^cp_`, c.ID)
}

// One capture of at most the authorized amount, or a void, each only while the money is held.
func TestAuthorizationLifecycle(t *testing.T) {
	capture := func(amount int64, want string) act { return act{amount: amount, want: want} }
	voided := func(want string) act { return act{void: true, want: want} }
	ok, no := statusSucceeded, statusDeclined
	tests := []struct {
		name     string
		declined bool // the authorization itself is declined
		acts     []act
		state    string
		captured int64
	}{
		{"authorized", false, nil, stateAuthorized, 0},
		{"partial capture", false, []act{capture(5000, ok)}, stateCaptured, 5000},
		{"whole capture", false, []act{capture(12345, ok)}, stateCaptured, 12345},
		{"over capture", false, []act{capture(12346, no)}, stateAuthorized, 0},
		{"zero capture", false, []act{capture(0, no)}, stateAuthorized, 0},
		{"negative capture", false, []act{capture(-1, no)}, stateAuthorized, 0},
		{"second capture", false, []act{capture(100, ok), capture(100, no)}, stateCaptured, 100},
		{"void", false, []act{voided(ok)}, stateVoided, 0},
		{"void twice", false, []act{voided(ok), voided(ok)}, stateVoided, 0},
		{"capture after void", false, []act{voided(ok), capture(100, no)}, stateVoided, 0},
		{"void after capture", false, []act{capture(100, ok), voided(no)}, stateCaptured, 100},
		{"declined authorization", true, []act{capture(100, no), voided(no)}, stateDeclined, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, CapabilityIdempotent)
			if tt.declined {
				e.faults(t, `[{"on":"authorize","action":"decline","count":1}]`)
			}
			code, a := e.authorize(t, "pay-1", chargeReq("pay-1"))
			require.Equal(t, http.StatusCreated, code)
			require.Regexp(t, `^au_`, a.ID)
			require.Equal(t, authorization{ID: a.ID, Reference: "pay-1", AmountMinor: 12345, Currency: "TRY",
				Status: statusOf(tt.declined), State: map[bool]string{false: stateAuthorized, true: stateDeclined}[tt.declined]}, a)

			for i, x := range tt.acts {
				e.act1(t, fmt.Sprintf("k-%d", i), a.ID, "pay-1", x)
			}
			got := e.inquired(t, "pay-1")
			require.Equal(t, tt.state, got.State)
			require.Equal(t, tt.captured, got.CapturedMinor)
			require.Equal(t, statusOf(tt.declined), got.Status, "the authorize call's answer stands")

			held := e.held(t, "pay-1")
			require.Equal(t, map[bool]int{false: 1, true: 0}[tt.declined], held.Count, "a declined authorization holds nothing")
			require.Equal(t, tt.captured, held.CapturedMinor)
			require.Equal(t, tt.state == stateVoided, held.Voided)
			require.Len(t, held.Authorizations, 1)
			require.Equal(t, got, held.Authorizations[0].authorization)
			require.Equal(t, "pay-1", held.Authorizations[0].IdempotencyKey)
		})
	}
}

func TestAuthorizationRequests(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	id := e.authorized(t, "pay-1")
	tests := []struct {
		name string
		path string
		key  string
		body any
		want int
	}{
		{"authorize without key", "/v1/authorizations", "", chargeReq("r"), 400},
		{"authorize invalid", "/v1/authorizations", "k-1", `{"reference":"r","amount_minor":0,"currency":"TRY","account_id":"a"}`, 400},
		{"authorize unknown field", "/v1/authorizations", "k-1", `{"reference":"r","x":1}`, 400},
		{"capture without key", "/v1/authorizations/" + id + "/capture", "", `{"amount_minor":1}`, 400},
		{"capture malformed", "/v1/authorizations/" + id + "/capture", "k-2", `{"amount_minor":`, 400},
		{"capture unknown field", "/v1/authorizations/" + id + "/capture", "k-2", `{"amount":1}`, 400},
		{"capture unknown authorization", "/v1/authorizations/au_nope/capture", "k-2", `{"amount_minor":1}`, 404},
		{"capture escaped id", "/v1/authorizations/au%2Fnope/capture", "k-2", `{"amount_minor":1}`, 404},
		{"void without key", "/v1/authorizations/" + id + "/void", "", nil, 400},
		{"void unknown field", "/v1/authorizations/" + id + "/void", "k-3", `{"x":1}`, 400},
		{"void unknown authorization", "/v1/authorizations/au_nope/void", "k-3", nil, 404},
		{"void with an empty object", "/v1/authorizations/" + id + "/void", "k-3", `{}`, 201},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := e.do(t, http.MethodPost, tt.path, keyHeader(tt.key), tt.body)
			require.Equal(t, tt.want, code, "%s", b)
			if code != http.StatusCreated {
				var out map[string]string
				require.NoError(t, json.Unmarshal(b, &out))
				require.NotEmpty(t, out["error"])
			}
		})
	}
	got := e.held(t, "")
	require.Equal(t, 1, got.Count)
	require.True(t, got.Voided)
}

// Only a bank with idempotency answers a repeated key with its first answer; any other
// evaluates the request again.
func TestAuthorizationRepeatedKeys(t *testing.T) {
	for _, c := range capabilities {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, c)
			idem := c == CapabilityIdempotent
			_, a1 := e.authorize(t, "pay-1", chargeReq("pay-1"))
			_, a2 := e.authorize(t, "pay-1", chargeReq("pay-1"))
			require.Equal(t, idem, a1.ID == a2.ID)
			require.Equal(t, map[bool]int{true: 1, false: 2}[idem], e.held(t, "pay-1").Count)

			_, c1 := e.capture(t, "cp-1", a1.ID, 5000)
			_, c2 := e.capture(t, "cp-1", a1.ID, 5000)
			require.Equal(t, statusSucceeded, c1.Status)
			if idem {
				require.Equal(t, c1, c2, "the first answer")
			} else {
				require.NotEqual(t, c1.ID, c2.ID)
				require.Equal(t, statusDeclined, c2.Status, "evaluated again: already captured")
			}
			require.Equal(t, int64(5000), e.held(t, "pay-1").CapturedMinor)

			id := e.authorized(t, "pay-2")
			_, v1 := e.void(t, "vd-1", id)
			_, v2 := e.void(t, "vd-1", id)
			require.Equal(t, statusSucceeded, v1.Status)
			require.Equal(t, statusSucceeded, v2.Status)
			require.Equal(t, idem, v1.ID == v2.ID)

			if idem { // another request under a key the bank has seen: the first answer, nothing moved
				other := chargeReq("pay-1")
				other.AmountMinor++
				code, again := e.authorize(t, "pay-1", other)
				require.Equal(t, http.StatusCreated, code)
				require.Equal(t, a1.ID, again.ID)
				for _, capture := range []struct {
					id     string
					amount int64
				}{{a1.ID, 4999}, {a2.ID + "x", 5000}} {
					code, c3 := e.capture(t, "cp-1", capture.id, capture.amount)
					require.Equal(t, http.StatusCreated, code)
					require.Equal(t, c1, c3)
				}
				code, v3 := e.void(t, "vd-1", a1.ID)
				require.Equal(t, http.StatusCreated, code)
				require.Equal(t, v1.ID, v3.ID)
				held := e.held(t, "pay-1")
				require.Equal(t, 1, held.Count)
				require.Equal(t, int64(5000), held.CapturedMinor)
				require.False(t, held.Voided)
			}
		})
	}
}

func TestAuthorizationInquiry(t *testing.T) {
	for _, c := range capabilities {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, c)
			id := e.authorized(t, "pay-1")
			code, b := e.do(t, http.MethodGet, "/v1/authorizations?reference=pay-1", nil, nil)
			if c == CapabilityNone {
				require.Equal(t, http.StatusNotImplemented, code, "%s", b)
				return
			}
			require.Equal(t, stateAuthorized, e.inquired(t, "pay-1").State)
			e.capture(t, "cp-1", id, 100)
			require.Equal(t, authorization{ID: id, Reference: "pay-1", AmountMinor: 12345, Currency: "TRY",
				Status: statusSucceeded, State: stateCaptured, CapturedMinor: 100}, e.inquired(t, "pay-1"))

			for _, ref := range []string{"nope", "cp-1"} {
				code, b = e.do(t, http.MethodGet, "/v1/authorizations?reference="+ref, nil, nil)
				require.Equal(t, http.StatusNotFound, code)
				require.JSONEq(t, `{"error":"not found"}`, string(b))
			}
			e.faults(t, `[{"on":"inquiry","action":"error_503","count":1}]`)
			code, _ = e.do(t, http.MethodGet, "/v1/authorizations?reference=pay-1", nil, nil)
			require.Equal(t, http.StatusServiceUnavailable, code, "inquiry faults apply")
		})
	}
}

// Every fault on an authorize, a capture or a void does what it does to a charge: the hold is
// placed, the capture taken or the void made (or not) as for money moving, and the client's
// retry acts at most once with idempotency.
func TestAuthorizationFaults(t *testing.T) {
	kinds := []struct {
		on     string
		send   func(e *env, id string, c *http.Client) (answer, error)
		effect func(h simAuthorizations) int // 1 once the request took effect
	}{
		{onAuthorize, func(e *env, _ string, c *http.Client) (answer, error) {
			return tried(e.send(c, http.MethodPost, "/v1/authorizations", keyHeader("au-1"), chargeReq("pay-1")))
		}, func(h simAuthorizations) int { return h.Count - 1 }},
		{onCapture, func(e *env, id string, c *http.Client) (answer, error) {
			return tried(e.send(c, http.MethodPost, "/v1/authorizations/"+id+"/capture", keyHeader("cp-1"), captureRequest{5000}))
		}, func(h simAuthorizations) int { return int(h.CapturedMinor / 5000) }},
		{onVoid, func(e *env, id string, c *http.Client) (answer, error) {
			return tried(e.send(c, http.MethodPost, "/v1/authorizations/"+id+"/void", keyHeader("vd-1"), nil))
		}, func(h simAuthorizations) int { return map[bool]int{true: 1}[h.Voided] }},
	}
	actionTests := []struct {
		action string
		want   int  // status the client sees; 0: the connection is dropped; -1: a client timeout
		moves  bool // takes effect at once
		late   bool // takes effect after delay_ms
	}{
		{actDropResponse, 0, true, false},
		{actError500, http.StatusInternalServerError, false, false},
		{actDelay, http.StatusCreated, true, false},
		{actDecline, http.StatusCreated, false, false},
		{actHang, -1, false, false},
		{actLateBooking, 0, false, true},
		{actError409, http.StatusConflict, true, false},
		{actError503, http.StatusServiceUnavailable, true, false},
		{actError429, http.StatusTooManyRequests, false, false},
		{actGarbage, http.StatusOK, true, false},
	}
	for _, k := range kinds {
		for _, tt := range actionTests {
			for _, c := range []Capability{CapabilityIdempotent, CapabilityNone} {
				t.Run(k.on+"/"+tt.action+"/"+string(c), func(t *testing.T) {
					t.Parallel()
					e := newEnv(t, c)
					// One authorization made before the fault: what a capture or void acts on,
					// and the count an authorize adds to.
					id := e.authorized(t, "pay-1")
					e.faults(t, fmt.Sprintf(`[{"on":%q,"action":%q,"delay_ms":300,"count":1}]`, k.on, tt.action))

					client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
					if tt.want == -1 {
						client.Timeout = 200 * time.Millisecond
					}
					a, err := k.send(e, id, client)
					if tt.want == -1 {
						var ue interface{ Timeout() bool }
						require.True(t, errors.As(err, &ue) && ue.Timeout(), "%v", err)
					} else {
						require.NoError(t, err)
						requireAnswer(t, tt.want, tt.action, a)
					}
					if tt.action == actDecline {
						var got struct{ Status string }
						require.NoError(t, json.Unmarshal(a.body, &got))
						require.Equal(t, statusDeclined, got.Status)
					}
					require.Equal(t, map[bool]int{true: 1}[tt.moves], k.effect(e.held(t, "pay-1")))
					if tt.late {
						require.Eventually(t, func() bool { return k.effect(e.held(t, "pay-1")) == 1 },
							5*time.Second, 20*time.Millisecond, "the late booking books")
					}

					// The client's retry, with the fault used up.
					a, err = k.send(e, id, client)
					require.NoError(t, err)
					require.Equal(t, http.StatusCreated, a.code, "%s", a.body)
					effect := k.effect(e.held(t, "pay-1"))
					switch {
					case c == CapabilityIdempotent && tt.action == actDecline:
						require.Equal(t, 0, effect, "the first answer stands")
					case c == CapabilityNone && k.on == onAuthorize && (tt.moves || tt.late):
						require.Equal(t, 2, effect, "every POST places a hold")
					default:
						require.Equal(t, 1, effect, "took effect once")
					}
				})
			}
		}
	}
}

// A capture or void that books late already holds the authorization: nothing else can take
// it meanwhile, though reads show it authorized until the booking.
func TestLateCaptureHoldsTheAuthorization(t *testing.T) {
	e := newEnv(t, CapabilityInquiry)
	id := e.authorized(t, "pay-1")
	e.faults(t, `[{"on":"capture","action":"late_booking","delay_ms":500,"count":1}]`)
	a := e.try(t, http.MethodPost, "/v1/authorizations/"+id+"/capture", keyHeader("cp-1"), captureRequest{100})
	require.True(t, a.dropped)
	require.Equal(t, stateAuthorized, e.inquired(t, "pay-1").State, "not booked yet")
	e.act1(t, "vd-1", id, "pay-1", act{void: true, want: statusDeclined})
	e.act1(t, "cp-2", id, "pay-1", act{amount: 100, want: statusDeclined})
	require.Eventually(t, func() bool { return e.inquired(t, "pay-1").State == stateCaptured },
		5*time.Second, 20*time.Millisecond)
	require.Equal(t, int64(100), e.held(t, "pay-1").CapturedMinor)
}

// Settlement files list captures, on the day they book; authorizations and voids move no money.
func TestSettlementCSVWithCaptures(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	day := time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)
	e.sim.now = func() time.Time { return day }
	_, ch := e.charge(t, "pay-1", chargeReq("pay-1"))
	_, cp := e.capture(t, "cp-2", e.authorized(t, "pay-2"), 5000)
	id3 := e.authorized(t, "pay-3")
	e.void(t, "vd-3", id3)
	e.capture(t, "cp-3", id3, 100) // declined
	e.authorized(t, "pay-4")
	e.sim.now = func() time.Time { return day.Add(24 * time.Hour) }
	_, cp5 := e.capture(t, "cp-5", e.authorized(t, "pay-5"), 7)

	header := "settlement_date,provider_charge_id,reference,amount,currency,status,type\nscope,all,charge refund,,,,\n"
	code, b := e.do(t, http.MethodGet, "/v1/settlements/2025-03-14.csv", nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, header+
		"2025-03-14,"+ch.ID+",pay-1,123.45,TRY,settled,charge\n"+
		"2025-03-14,"+cp.ID+",pay-2,50.00,TRY,settled,capture\n"+
		"trailer,2025-03-14,2,2025-03-15T12:00:00Z,,,\n", string(b))
	code, b = e.do(t, http.MethodGet, "/v1/settlements/2025-03-15.csv", nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, header+
		"2025-03-15,"+cp5.ID+",pay-5,0.07,TRY,settled,capture\n"+
		"trailer,2025-03-15,1,2025-03-15T12:00:00Z,,,\n", string(b))
}

// A captured payment is refunded as a charged one is, up to what was captured.
func TestRefundOfACapture(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.capture(t, "cp-1", e.authorized(t, "pay-1"), 5000)
	e.authorized(t, "pay-2")
	for _, tt := range []struct {
		req  refundRequest
		want string
	}{
		{refundReq("rf-1", "pay-1", 4000), statusSucceeded},
		{refundReq("rf-2", "pay-1", 1001), statusDeclined},
		{refundReq("rf-3", "pay-1", 1000), statusSucceeded},
		{refundReq("rf-4", "pay-2", 1), statusDeclined}, // held, never captured
	} {
		code, r := e.refund(t, tt.req.Reference, tt.req)
		require.Equal(t, http.StatusCreated, code)
		require.Equal(t, tt.want, r.Status, tt.req.Reference)
	}
}

func TestAuthorizationsSurviveRestart(t *testing.T) {
	for _, c := range capabilities {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			e := start(t, dir, c)
			captured, voided, open := e.authorized(t, "pay-1"), e.authorized(t, "pay-2"), e.authorized(t, "pay-3")
			_, cp := e.capture(t, "cp-1", captured, 5000)
			e.void(t, "vd-2", voided)
			late := e.authorized(t, "pay-4")
			e.faults(t, `[{"on":"capture","action":"late_booking","delay_ms":1500,"count":1}]`)
			require.True(t, e.try(t, http.MethodPost, "/v1/authorizations/"+late+"/capture", keyHeader("cp-4"), captureRequest{1}).dropped)
			before := e.held(t, "")
			e.srv.Close()
			require.NoError(t, e.sim.Close())

			e = start(t, dir, c)
			require.Equal(t, before, e.held(t, ""))
			require.Equal(t, 4, before.Count)
			require.Equal(t, int64(5000), before.CapturedMinor)
			require.True(t, before.Voided)
			if c == CapabilityIdempotent {
				_, again := e.capture(t, "cp-1", captured, 5000)
				require.Equal(t, cp, again, "the key is remembered")
				_, a := e.authorize(t, "pay-1", chargeReq("pay-1"))
				require.Equal(t, captured, a.ID)
			}
			e.act1(t, "cp-2", voided, "pay-2", act{amount: 1, want: statusDeclined})
			e.act1(t, "cp-1b", captured, "pay-1", act{amount: 1, want: statusDeclined})
			e.act1(t, "vd-4", late, "pay-4", act{void: true, want: statusDeclined}) // its capture is pending
			e.act1(t, "cp-3", open, "pay-3", act{amount: 12345, want: statusSucceeded})
			require.Eventually(t, func() bool { return e.held(t, "pay-4").CapturedMinor == 1 }, 5*time.Second, 20*time.Millisecond)
		})
	}
}

// An authorization nobody captured or voided expires at the bank after its TTL: a capture is
// declined and moves nothing, a void answers succeeded (the hold is gone either way).
func TestAuthorizationExpires(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	now := time.Now()
	e.sim.mu.Lock()
	e.sim.now = func() time.Time { return now }
	e.sim.mu.Unlock()
	id := e.authorized(t, "exp-1")
	now = now.Add(authorizationTTL)
	require.Equal(t, stateExpired, e.inquired(t, "exp-1").State)
	code, c := e.capture(t, "cap-1", id, 100)
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, statusDeclined, c.Status)
	require.Zero(t, e.held(t, "exp-1").CapturedMinor)
	code, v := e.void(t, "void-1", id)
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, statusSucceeded, v.Status)
}
