package banksim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func refundReq(ref, charge string, amount int64) refundRequest {
	return refundRequest{Reference: ref, ChargeReference: charge, AmountMinor: amount, Currency: "TRY"}
}

func (e *env) refund(t *testing.T, key string, req any) (int, refund) {
	t.Helper()
	return posted[refund](t, e, "/v1/refunds", key, req)
}

func (e *env) tryRefund(t *testing.T, key string, req refundRequest) answer {
	t.Helper()
	return e.try(t, http.MethodPost, "/v1/refunds", map[string]string{"Idempotency-Key": key}, req)
}

type simRefunds struct {
	Count   int            `json:"count"`
	Refunds []refundRecord `json:"refunds"`
	Pending int            `json:"pending"`
}

func (e *env) refunded(t *testing.T, ref string) simRefunds {
	t.Helper()
	return kept[simRefunds](t, e, "/_sim/refunds", ref)
}

// charged makes a succeeded charge of 123.45 TRY for ref.
func (e *env) charged(t *testing.T, ref string) {
	t.Helper()
	code, c := e.charge(t, ref, chargeReq(ref))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, statusSucceeded, c.Status)
}

func TestRefundValidation(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.charged(t, "pay-1")
	tests := []struct {
		name string
		key  string
		body string
		want int
	}{
		{"ok", "k", `{"reference":"r","charge_reference":"pay-1","amount_minor":1,"currency":"TRY"}`, 201},
		{"missing key", "", `{"reference":"r","charge_reference":"pay-1","amount_minor":1,"currency":"TRY"}`, 400},
		{"unknown field", "k1", `{"reference":"r","charge_reference":"pay-1","amount_minor":1,"currency":"TRY","x":1}`, 400},
		{"zero amount", "k2", `{"reference":"r","charge_reference":"pay-1","amount_minor":0,"currency":"TRY"}`, 400},
		{"negative amount", "k3", `{"reference":"r","charge_reference":"pay-1","amount_minor":-1,"currency":"TRY"}`, 400},
		{"bad currency", "k4", `{"reference":"r","charge_reference":"pay-1","amount_minor":1,"currency":"try"}`, 400},
		{"no reference", "k5", `{"charge_reference":"pay-1","amount_minor":1,"currency":"TRY"}`, 400},
		{"no charge reference", "k6", `{"reference":"r","amount_minor":1,"currency":"TRY"}`, 400},
		{"trailing data", "k7", `{"reference":"r","charge_reference":"pay-1","amount_minor":1,"currency":"TRY"} {}`, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := e.do(t, http.MethodPost, "/v1/refunds", map[string]string{"Idempotency-Key": tt.key}, tt.body)
			require.Equal(t, tt.want, code, string(b))
		})
	}
	require.Equal(t, 1, e.refunded(t, "").Count)
}

// The bank refunds at most what it charged for a charge reference, in its currency; every
// capability keeps to that, and only idempotent returns the first result for a repeated key.
func TestRefundCapabilities(t *testing.T) {
	for _, c := range capabilities {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, c)
			e.charged(t, "pay-1") // 123.45 TRY

			code, first := e.refund(t, "rf-1", refundReq("rf-1", "pay-1", 5000))
			require.Equal(t, http.StatusCreated, code)
			require.Equal(t, statusSucceeded, first.Status)
			require.Regexp(t, `^rf_`, first.ID)
			require.Equal(t, "rf-1", first.Reference)
			require.Equal(t, 1, e.refunded(t, "rf-1").Count)

			code, again := e.refund(t, "rf-1", refundReq("rf-1", "pay-1", 5000))
			require.Equal(t, http.StatusCreated, code)
			if c == CapabilityIdempotent {
				require.Equal(t, first, again, "a repeated key returns the first result")
				require.Equal(t, 1, e.refunded(t, "rf-1").Count, "and moves no money again")
				other := refundReq("rf-1", "pay-1", 5001)
				code, again = e.refund(t, "rf-1", other)
				require.Equal(t, http.StatusCreated, code)
				require.Equal(t, first, again, "another request under the key: the first result")
				require.Equal(t, 1, e.refunded(t, "rf-1").Count)
			} else {
				require.NotEqual(t, first.ID, again.ID)
				require.Equal(t, statusSucceeded, again.Status)
				require.Equal(t, 2, e.refunded(t, "rf-1").Count, "every POST moves money")
			}
			refundedSoFar := int64(5000)
			if c != CapabilityIdempotent {
				refundedSoFar = 10000
			}

			// One minor unit above what is left: declined; exactly what is left: succeeded.
			code, over := e.refund(t, "rf-2", refundReq("rf-2", "pay-1", 12345-refundedSoFar+1))
			require.Equal(t, http.StatusCreated, code)
			require.Equal(t, statusDeclined, over.Status, "over-refund")
			require.Equal(t, 0, e.refunded(t, "rf-2").Count)
			require.Len(t, e.refunded(t, "rf-2").Refunds, 1, "declines are recorded")
			code, rest := e.refund(t, "rf-3", refundReq("rf-3", "pay-1", 12345-refundedSoFar))
			require.Equal(t, http.StatusCreated, code)
			require.Equal(t, statusSucceeded, rest.Status)
			code, more := e.refund(t, "rf-4", refundReq("rf-4", "pay-1", 1))
			require.Equal(t, http.StatusCreated, code)
			require.Equal(t, statusDeclined, more.Status, "fully refunded")

			for name, req := range map[string]refundRequest{
				"unknown charge":  refundReq("rf-5", "nope", 1),
				"other currency":  {Reference: "rf-6", ChargeReference: "pay-2", AmountMinor: 1, Currency: "EUR"},
				"declined charge": refundReq("rf-7", "pay-dec", 1),
			} {
				if name == "other currency" {
					e.charged(t, "pay-2")
				}
				if name == "declined charge" {
					e.faults(t, `[{"on":"charge","action":"decline","count":1}]`)
					code, ch := e.charge(t, "pay-dec", chargeReq("pay-dec"))
					require.Equal(t, http.StatusCreated, code)
					require.Equal(t, statusDeclined, ch.Status)
				}
				code, r := e.refund(t, req.Reference, req)
				require.Equal(t, http.StatusCreated, code, name)
				require.Equal(t, statusDeclined, r.Status, name)
				require.Equal(t, 0, e.refunded(t, req.Reference).Count, name)
			}

			all := e.refunded(t, "")
			var sum int64
			for _, r := range all.Refunds {
				if r.Status == statusSucceeded {
					sum += r.AmountMinor
				}
			}
			require.Equal(t, int64(12345), sum, "refunded exactly what was charged")
		})
	}
}

func TestRefundFaults(t *testing.T) {
	tests := []struct {
		action  string
		want    int  // status the client sees; 0: the connection is dropped; -1: a client timeout
		moves   bool // money moves at once
		late    bool // money moves after delay_ms
		decline bool // the bank answers a decline
	}{
		{actDropResponse, 0, true, false, false},
		{actError500, http.StatusInternalServerError, false, false, false},
		{actDelay, http.StatusCreated, true, false, false},
		{actDecline, http.StatusCreated, false, false, true},
		{actHang, -1, false, false, false},
		{actLateBooking, 0, false, true, false},
		{actError409, http.StatusConflict, true, false, false},
		{actError503, http.StatusServiceUnavailable, true, false, false},
		{actError429, http.StatusTooManyRequests, false, false, false},
		{actGarbage, http.StatusOK, true, false, false},
	}
	for _, tt := range tests {
		for _, c := range capabilities {
			t.Run(tt.action+"/"+string(c), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, c)
				e.charged(t, "pay-1")
				e.faults(t, fmt.Sprintf(`[{"on":"refund","action":%q,"delay_ms":300,"count":1}]`, tt.action))
				req := refundReq("rf-1", "pay-1", 1000)

				if tt.want == -1 {
					client := &http.Client{Timeout: 200 * time.Millisecond}
					_, err := e.send(client, http.MethodPost, "/v1/refunds", map[string]string{"Idempotency-Key": "rf-1"}, req)
					var ue interface{ Timeout() bool }
					require.True(t, errors.As(err, &ue) && ue.Timeout(), "%v", err)
				} else {
					a := e.tryRefund(t, "rf-1", req)
					requireAnswer(t, tt.want, tt.action, a)
					if tt.decline {
						var r refund
						require.NoError(t, json.Unmarshal(a.body, &r))
						require.Equal(t, statusDeclined, r.Status)
					}
				}
				require.Equal(t, 0, e.moved(t, "rf-1").Count, "a refund is no charge")
				now := e.refunded(t, "rf-1")
				if tt.moves {
					require.Equal(t, 1, now.Count, "money moved at once")
				} else {
					require.Equal(t, 0, now.Count, "no money moved yet")
				}
				moved := now.Count
				if tt.late {
					require.Equal(t, 1, now.Pending)
					require.Eventually(t, func() bool { return e.refunded(t, "rf-1").Count == 1 },
						5*time.Second, 20*time.Millisecond, "the late booking books")
					moved = 1
				}

				// The client's retry, with the fault used up.
				code, got := e.refund(t, "rf-1", req)
				require.Equal(t, http.StatusCreated, code)
				after := e.refunded(t, "rf-1")
				switch {
				case c == CapabilityIdempotent && tt.decline:
					require.Equal(t, statusDeclined, got.Status, "the first answer stands")
					require.Equal(t, 0, after.Count)
				case c == CapabilityIdempotent:
					require.Equal(t, 1, after.Count, "a repeated key moves money once")
					require.Equal(t, statusSucceeded, got.Status)
				default:
					require.Equal(t, moved+1, after.Count, "every POST moves money")
				}
			})
		}
	}
}

func TestRefundInquiry(t *testing.T) {
	for _, c := range capabilities {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, c)
			e.charged(t, "pay-1")
			_, r := e.refund(t, "rf-1", refundReq("rf-1", "pay-1", 100))

			code, b := e.do(t, http.MethodGet, "/v1/refunds?reference=rf-1", nil, nil)
			if c == CapabilityNone {
				require.Equal(t, http.StatusNotImplemented, code)
				return
			}
			require.Equal(t, http.StatusOK, code)
			var got refund
			require.NoError(t, json.Unmarshal(b, &got))
			require.Equal(t, r, got)

			code, b = e.do(t, http.MethodGet, "/v1/refunds?reference=nope", nil, nil)
			require.Equal(t, http.StatusNotFound, code)
			require.JSONEq(t, `{"error":"not found"}`, string(b))
			code, _ = e.do(t, http.MethodGet, "/v1/refunds?reference=pay-1", nil, nil)
			require.Equal(t, http.StatusNotFound, code, "a charge is not a refund")

			e.faults(t, `[{"on":"inquiry","action":"error_503","count":1}]`)
			code, _ = e.do(t, http.MethodGet, "/v1/refunds?reference=rf-1", nil, nil)
			require.Equal(t, http.StatusServiceUnavailable, code, "inquiry faults apply to refund inquiries")

			e.faults(t, `[{"on":"refund","action":"late_booking","delay_ms":400,"count":1}]`)
			require.True(t, e.tryRefund(t, "rf-late", refundReq("rf-late", "pay-1", 100)).dropped)
			code, _ = e.do(t, http.MethodGet, "/v1/refunds?reference=rf-late", nil, nil)
			require.Equal(t, http.StatusNotFound, code, "not booked yet")
			require.Eventually(t, func() bool {
				code, _ := e.do(t, http.MethodGet, "/v1/refunds?reference=rf-late", nil, nil)
				return code == http.StatusOK
			}, 5*time.Second, 20*time.Millisecond)
		})
	}
}

// A pending late refund already counts against what is left to refund: the money will move.
func TestLateRefundCountsAgainstTheCharge(t *testing.T) {
	e := newEnv(t, CapabilityInquiry)
	e.charged(t, "pay-1")
	e.faults(t, `[{"on":"refund","action":"late_booking","delay_ms":1000,"count":1}]`)
	require.True(t, e.tryRefund(t, "rf-1", refundReq("rf-1", "pay-1", 12345)).dropped)
	code, r := e.refund(t, "rf-2", refundReq("rf-2", "pay-1", 1))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, statusDeclined, r.Status)
}

func TestRefundsSurviveRestart(t *testing.T) {
	for _, c := range capabilities {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			e := start(t, dir, c)
			e.charged(t, "pay-1")
			_, first := e.refund(t, "rf-1", refundReq("rf-1", "pay-1", 12000))
			require.Equal(t, statusSucceeded, first.Status)
			e.faults(t, `[{"on":"refund","action":"late_booking","delay_ms":1500,"count":1}]`)
			require.True(t, e.tryRefund(t, "rf-late", refundReq("rf-late", "pay-1", 345)).dropped)
			e.srv.Close()
			require.NoError(t, e.sim.Close())

			e = start(t, dir, c)
			got := e.refunded(t, "")
			require.Equal(t, 1, got.Count)
			require.Equal(t, 1, got.Pending, "the restart kept the pending refund")
			require.Equal(t, first, got.Refunds[0].refund)
			if c == CapabilityIdempotent {
				code, again := e.refund(t, "rf-1", refundReq("rf-1", "pay-1", 12000))
				require.Equal(t, http.StatusCreated, code)
				require.Equal(t, first, again, "the key is remembered")
				a := e.tryRefund(t, "rf-late", refundReq("rf-late", "pay-1", 345))
				require.Equal(t, http.StatusConflict, a.code, "the pending key is in progress: %s", a.body)
			}
			code, r := e.refund(t, "rf-2", refundReq("rf-2", "pay-1", 1))
			require.Equal(t, http.StatusCreated, code)
			require.Equal(t, statusDeclined, r.Status, "what was refunded before the restart still counts")
			require.Eventually(t, func() bool { return e.refunded(t, "rf-late").Count == 1 }, 5*time.Second, 20*time.Millisecond)
			require.Equal(t, 2, e.refunded(t, "").Count)
		})
	}
}

func TestSettlementCSVWithRefunds(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	day := time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)
	e.sim.now = func() time.Time { return day }
	_, ch := e.charge(t, "pay-1", chargeReq("pay-1"))
	_, r1 := e.refund(t, "rf-1", refundReq("rf-1", "pay-1", 2000))
	_, dec := e.refund(t, "rf-over", refundReq("rf-over", "pay-1", 99999))
	require.Equal(t, statusDeclined, dec.Status)
	e.sim.now = func() time.Time { return day.Add(24 * time.Hour) }
	_, r2 := e.refund(t, "rf-2", refundReq("rf-2", "pay-1", 45))

	header := "settlement_date,provider_charge_id,reference,amount,currency,status,type\nscope,all,charge refund,,,,\n"
	code, b := e.do(t, http.MethodGet, "/v1/settlements/2025-03-14.csv", nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, header+
		"2025-03-14,"+ch.ID+",pay-1,123.45,TRY,settled,charge\n"+
		"2025-03-14,"+r1.ID+",rf-1,20.00,TRY,settled,refund\n"+
		"trailer,2025-03-14,2,2025-03-15T12:00:00Z,,,\n", string(b))
	code, b = e.do(t, http.MethodGet, "/v1/settlements/2025-03-15.csv", nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, header+
		"2025-03-15,"+r2.ID+",rf-2,0.45,TRY,settled,refund\n"+
		"trailer,2025-03-15,1,2025-03-15T12:00:00Z,,,\n", string(b))
}

// Parallel refunds of one charge never pay back more than it charged, and parallel requests
// under one key (idempotent) refund once.
func TestParallelRefunds(t *testing.T) {
	e := newEnv(t, CapabilityIdempotent)
	e.charged(t, "pay-1") // 123.45
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { e.refund(t, fmt.Sprintf("rf-%d", i), refundReq(fmt.Sprintf("rf-%d", i), "pay-1", 3000)) })
	}
	for range 50 {
		wg.Go(func() { e.refund(t, "rf-same", refundReq("rf-same", "pay-1", 100)) })
	}
	wg.Wait()
	got := e.refunded(t, "")
	var sum int64
	for _, r := range got.Refunds {
		if r.Status == statusSucceeded {
			sum += r.AmountMinor
		}
	}
	require.LessOrEqual(t, sum, int64(12345))
	require.Equal(t, 5, got.Count, "the one same-key refund of 1.00 and four of 30.00 fit in 123.45, a fifth does not")
	require.Len(t, e.refunded(t, "rf-same").Refunds, 1)
}
