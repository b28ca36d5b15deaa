package banksim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var capabilities = []Capability{CapabilityIdempotent, CapabilityInquiry, CapabilityNone}

// answer is what a client saw: a dropped connection, or a status, headers and body.
type answer struct {
	dropped bool
	code    int
	header  http.Header
	body    []byte
}

// try sends a request on a fresh connection: on a reused keep-alive connection Go's
// transport silently re-sends a dropped request that carries an Idempotency-Key.
func (e *env) try(t *testing.T, method, path string, header map[string]string, body any) answer {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	a, err := tried(e.send(client, method, path, header, body))
	require.NoError(t, err)
	return a
}

// tried reads what a client saw of a request: a connection closed without an answer is
// dropped; another error is the caller's to judge.
func tried(resp *http.Response, err error) (answer, error) {
	if err != nil {
		if errors.Is(err, io.EOF) {
			return answer{dropped: true}, nil
		}
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, header: resp.Header, body: b}, err
}

func (e *env) tryCharge(t *testing.T, key string) answer {
	t.Helper()
	return e.try(t, http.MethodPost, "/v1/charges", map[string]string{"Idempotency-Key": key}, chargeReq(key))
}

// requireAnswer checks a fault's answer: want 0 means the connection was dropped.
func requireAnswer(t *testing.T, want int, action string, a answer) {
	t.Helper()
	if want == 0 {
		require.True(t, a.dropped, "want a dropped connection, got %d %s", a.code, a.body)
		return
	}
	require.False(t, a.dropped, "connection dropped")
	require.Equal(t, want, a.code, "%s", a.body)
	switch action {
	case actGarbage:
		require.False(t, json.Valid(a.body), "body is JSON: %s", a.body)
		require.NotEmpty(t, a.body)
	case actError409:
		require.JSONEq(t, `{"error":"a request with this key is in progress"}`, string(a.body))
	case actError429, actError503:
		require.Equal(t, "1", a.header.Get("Retry-After"))
		require.True(t, json.Valid(a.body), "%s", a.body)
	}
}

func TestChargeFaults(t *testing.T) {
	tests := []struct {
		action string
		want   int  // status the client sees; 0: the connection is dropped
		moves  bool // money moves at once
		late   bool // money moves after delay_ms
	}{
		{actLateBooking, 0, false, true},
		{actError409, http.StatusConflict, true, false},
		{actError503, http.StatusServiceUnavailable, true, false},
		{actError429, http.StatusTooManyRequests, false, false},
		{actGarbage, http.StatusOK, true, false},
	}
	for _, tt := range tests {
		for _, c := range capabilities {
			t.Run(tt.action+"/"+string(c), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, c)
				e.faults(t, fmt.Sprintf(`[{"on":"charge","action":%q,"delay_ms":300,"count":1}]`, tt.action))

				requireAnswer(t, tt.want, tt.action, e.tryCharge(t, "op-1"))
				now := e.moved(t, "op-1")
				if tt.moves {
					require.Equal(t, 1, now.Count, "money moved at once")
				} else {
					require.Equal(t, 0, now.Count, "no money moved yet")
					require.Empty(t, now.Charges)
				}
				moved := now.Count
				if tt.late {
					require.Equal(t, 1, now.Pending)
					require.Eventually(t, func() bool { return e.moved(t, "op-1").Count == 1 },
						5*time.Second, 20*time.Millisecond, "the late booking books")
					require.Zero(t, e.moved(t, "op-1").Pending)
					moved = 1
				}

				// The client's retry, with the fault used up.
				code, got := e.charge(t, "op-1", chargeReq("op-1"))
				require.Equal(t, http.StatusCreated, code)
				after := e.moved(t, "op-1")
				if c == CapabilityIdempotent {
					require.Equal(t, 1, after.Count, "a repeated key moves money once")
					if moved == 1 {
						require.Equal(t, after.Charges[0].ID, got.ID, "the repeat returns the first result")
					}
				} else {
					require.Equal(t, moved+1, after.Count, "every POST moves money")
				}
			})
		}
	}
}

func TestInquiryFaults(t *testing.T) {
	tests := []struct {
		action string
		want   int // status the client sees; 0: the connection is dropped
	}{
		{actLateBooking, 0},
		{actError409, http.StatusConflict},
		{actError503, http.StatusServiceUnavailable},
		{actError429, http.StatusTooManyRequests},
		{actGarbage, http.StatusOK},
	}
	for _, tt := range tests {
		for _, c := range capabilities {
			t.Run(tt.action+"/"+string(c), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, c)
				code, ch := e.charge(t, "op-1", chargeReq("op-1"))
				require.Equal(t, http.StatusCreated, code)
				e.faults(t, fmt.Sprintf(`[{"on":"inquiry","action":%q,"count":1}]`, tt.action))

				a := e.try(t, http.MethodGet, "/v1/charges?reference=op-1", nil, nil)
				if c == CapabilityNone {
					require.Equal(t, http.StatusNotImplemented, a.code, "no inquiry, fault or not")
				} else {
					requireAnswer(t, tt.want, tt.action, a)
				}
				require.Equal(t, 1, e.moved(t, "op-1").Count, "an inquiry moves no money")

				if c != CapabilityNone {
					a = e.try(t, http.MethodGet, "/v1/charges?reference=op-1", nil, nil)
					require.Equal(t, http.StatusOK, a.code, "the fault is used up")
					var got charge
					require.NoError(t, json.Unmarshal(a.body, &got))
					require.Equal(t, ch, got)
				}
			})
		}
	}
}

func TestLateBookingFoundOnlyWhenBooked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, CapabilityInquiry)
	e.faults(t, `[{"on":"charge","action":"late_booking","delay_ms":500,"count":1}]`)
	sent := time.Now()
	require.True(t, e.tryCharge(t, "op-1").dropped)

	code, b := e.do(t, http.MethodGet, "/v1/charges?reference=op-1", nil, nil)
	require.Equal(t, http.StatusNotFound, code, "%s", b)
	got := e.moved(t, "op-1")
	require.Equal(t, 0, got.Count)
	require.Equal(t, 1, got.Pending)

	require.Eventually(t, func() bool {
		code, _ := e.do(t, http.MethodGet, "/v1/charges?reference=op-1", nil, nil)
		return code == http.StatusOK
	}, 5*time.Second, 20*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(sent), 500*time.Millisecond, "not booked before delay_ms")
	got = e.moved(t, "op-1")
	require.Equal(t, 1, got.Count)
	require.Zero(t, got.Pending)
	require.NotNil(t, got.Charges[0].ReceivedAt)
	require.GreaterOrEqual(t, got.Charges[0].CreatedAt.Sub(*got.Charges[0].ReceivedAt), 500*time.Millisecond)
}

func TestLateBookingIdempotentRepeatWhilePending(t *testing.T) {
	t.Parallel()
	e := newEnv(t, CapabilityIdempotent)
	e.faults(t, `[{"on":"charge","action":"late_booking","delay_ms":1000,"count":1}]`)
	require.True(t, e.tryCharge(t, "op-1").dropped)

	a := e.tryCharge(t, "op-1")
	require.Equal(t, http.StatusConflict, a.code, "%s", a.body)
	require.JSONEq(t, `{"error":"a request with this key is in progress"}`, string(a.body))
	other := chargeReq("op-1")
	other.AmountMinor++
	code, _ := e.charge(t, "op-1", other)
	require.Equal(t, http.StatusConflict, code, "another request under the key, still in progress")
	got := e.moved(t, "op-1")
	require.Equal(t, 0, got.Count)
	require.Equal(t, 1, got.Pending, "the repeats booked nothing more")

	require.Eventually(t, func() bool { return e.moved(t, "op-1").Count == 1 }, 5*time.Second, 20*time.Millisecond)
	code, c := e.charge(t, "op-1", chargeReq("op-1"))
	require.Equal(t, http.StatusCreated, code)
	got = e.moved(t, "op-1")
	require.Equal(t, 1, got.Count)
	require.Len(t, got.Charges, 1)
	require.Equal(t, got.Charges[0].ID, c.ID)
}

func TestLateBookingSurvivesRestart(t *testing.T) {
	for _, c := range capabilities {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			e := start(t, dir, c)
			e.faults(t, `[{"on":"charge","action":"late_booking","delay_ms":1500,"count":1}]`)
			require.True(t, e.tryCharge(t, "op-1").dropped)
			e.srv.Close()
			require.NoError(t, e.sim.Close())

			e = start(t, dir, c)
			got := e.moved(t, "op-1")
			require.Equal(t, 0, got.Count, "not booked yet")
			require.Equal(t, 1, got.Pending, "the restart kept the pending booking")
			if c == CapabilityIdempotent {
				a := e.tryCharge(t, "op-1")
				require.Equal(t, http.StatusConflict, a.code, "the key is remembered as in progress: %s", a.body)
			}
			require.Eventually(t, func() bool { return e.moved(t, "op-1").Count == 1 }, 5*time.Second, 20*time.Millisecond)
			e.srv.Close()
			require.NoError(t, e.sim.Close())

			e = start(t, dir, c)
			got = e.moved(t, "op-1")
			require.Equal(t, 1, got.Count, "booked once")
			require.Len(t, got.Charges, 1)
			require.Zero(t, got.Pending)
		})
	}
}

func TestLateBookingSettlesOnItsBookingDay(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	day := time.Date(2025, 3, 14, 23, 59, 59, 0, time.UTC)
	e.sim.now = func() time.Time { return day }
	e.faults(t, `[{"on":"charge","action":"late_booking","delay_ms":2000,"count":1}]`)
	require.True(t, e.tryCharge(t, "op-late").dropped)

	header := "settlement_date,provider_charge_id,reference,amount,currency,status,type\nscope,all,charge refund,,,,\n"
	for _, day := range []string{"2025-03-14", "2025-03-15"} {
		code, b := e.do(t, http.MethodGet, "/v1/settlements/"+day+".csv", nil, nil)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, header+"trailer,"+day+",0,2025-03-14T23:59:59Z,,,\n", string(b), "not booked yet: in no file")
	}

	e.sim.now = func() time.Time { return day.Add(2 * time.Second) }
	id := e.moved(t, "op-late").Charges[0].ID
	code, b := e.do(t, http.MethodGet, "/v1/settlements/2025-03-14.csv", nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, header+"trailer,2025-03-14,0,2025-03-15T00:00:01Z,,,\n", string(b), "received on the 14th, booked on the 15th")
	code, b = e.do(t, http.MethodGet, "/v1/settlements/2025-03-15.csv", nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, header+"2025-03-15,"+id+",op-late,123.45,TRY,settled,charge\n"+
		"trailer,2025-03-15,1,2025-03-15T00:00:01Z,,,\n", string(b))
}

func TestLateBookingDefaultDelay(t *testing.T) {
	require.Equal(t, defaultDelay, Rule{Action: actLateBooking}.lateBy())
	require.Equal(t, defaultDelay, Rule{Action: actDelay}.lateBy(), "delay_ms is optional for a delay too")
	require.Equal(t, 250*time.Millisecond, Rule{Action: actLateBooking, DelayMS: 250}.lateBy())

	e := newEnv(t, CapabilityIdempotent)
	e.faults(t, `[{"on":"charge","action":"late_booking","count":1}]`)
	require.True(t, e.tryCharge(t, "op-1").dropped)
	got := e.moved(t, "op-1")
	require.Equal(t, 0, got.Count)
	require.Equal(t, 1, got.Pending)
}

func TestFaultValidationMessages(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	tests := []struct {
		name string
		rule string
		want string // substring of the 400's error; empty: accepted
	}{
		{"late_booking", `{"on":"charge","action":"late_booking","delay_ms":100}`, ""},
		{"late_booking without delay", `{"on":"charge","action":"late_booking"}`, ""},
		{"late_booking on inquiry", `{"on":"inquiry","action":"late_booking"}`, ""},
		{"error_409", `{"on":"charge","action":"error_409","count":2}`, ""},
		{"error_503", `{"on":"inquiry","action":"error_503","probability":0.5}`, ""},
		{"error_429", `{"on":"charge","action":"error_429"}`, ""},
		{"garbage", `{"on":"inquiry","action":"garbage"}`, ""},
		{"negative delay", `{"on":"charge","action":"late_booking","delay_ms":-1}`, "delay_ms"},
		{"a day's delay", `{"on":"charge","action":"late_booking","delay_ms":86400000}`, ""},
		{"delay past a day", `{"on":"charge","action":"late_booking","delay_ms":9300000000000}`, "delay_ms must be at most 86400000 (a day)"},
		{"refund", `{"on":"refund","action":"error_503"}`, ""},
		{"decline on refund", `{"on":"refund","action":"decline"}`, ""},
		{"decline on inquiry", `{"on":"inquiry","action":"decline"}`, "decline does not apply to inquiry"},
		{"authorize", `{"on":"authorize","action":"drop_response"}`, ""},
		{"decline on capture", `{"on":"capture","action":"decline","count":1}`, ""},
		{"void", `{"on":"void","action":"late_booking","delay_ms":100}`, ""},
		{"unknown on", `{"on":"payout","action":"hang"}`, `unknown on "payout" (want charge, inquiry, refund, authorize, capture or void)`},
		{"unknown action", `{"on":"charge","action":"explode"}`,
			`unknown action "explode" (want one of drop_response, error_500, delay, decline, hang, late_booking, error_409, error_503, error_429, garbage)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := e.do(t, http.MethodPut, "/_sim/faults", nil, `{"rules":[`+tt.rule+`]}`)
			if tt.want == "" {
				require.Equal(t, http.StatusOK, code, "%s", b)
				return
			}
			require.Equal(t, http.StatusBadRequest, code)
			var out map[string]string
			require.NoError(t, json.Unmarshal(b, &out))
			require.Contains(t, out["error"], tt.want)
		})
	}
}
