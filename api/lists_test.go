package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// listFixture is a server on a fake store holding three payments of merchant A, a minute
// apart (fakeID(1) oldest), and one of merchant B.
func listFixture(t *testing.T) (*fakeStore, http.Handler) {
	t.Helper()
	st := newFakeStore()
	for i, m := range []uuid.UUID{merchantA, merchantA, merchantA, merchantB} {
		id := fakeID(i + 1)
		created := t0.Add(time.Duration(i) * time.Minute)
		st.payments[id] = payment.Payment{
			ID: id, MerchantID: m, IdempotencyKey: "k" + id.String()[30:], AccountID: accountA, AmountMinor: 1000 + int64(i),
			Currency: "TRY", InvoiceID: "inv-" + id.String()[30:], PaymentType: "purchase", Status: payment.StatusSucceeded,
			ProviderReference: "ch_" + id.String()[30:], CreatedAt: created, UpdatedAt: created.Add(time.Second),
		}
		st.records[recordKey{m, "k" + id.String()[30:]}] = store.Record{MerchantID: m, Key: "k" + id.String()[30:], OperationID: id}
	}
	wf := &fakeWorkflows{st: st, outcome: payment.StatusSucceeded}
	return st, New(Options{Store: st, Workflows: wf, Logger: slog.New(slog.DiscardHandler)}).Handler()
}

func getList(h http.Handler, query string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request{method: http.MethodGet, path: "/v1/payments" + query}.build())
	return rec
}

// listBody is the JSON of a page of these payments.
func listBody(t *testing.T, st *fakeStore, more bool, ids ...uuid.UUID) string {
	t.Helper()
	page := listPage[payment.Resource]{Data: []payment.Resource{}, HasMore: more}
	for _, id := range ids {
		page.Data = append(page.Data, st.payments[id].Resource())
	}
	b, err := payment.JSON(page)
	require.NoError(t, err)
	return string(b)
}

func TestListPaymentsAnswersPagesNewestFirst(t *testing.T) {
	t.Parallel()
	st, h := listFixture(t)

	rec := getList(h, "?limit=2")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.JSONEq(t, listBody(t, st, true, fakeID(3), fakeID(2)), rec.Body.String())
	var shape map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &shape))
	require.Len(t, shape, 2, "data and has_more, nothing else")

	rec = getList(h, "?limit=2&starting_after="+fakeID(2).String())
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.JSONEq(t, listBody(t, st, false, fakeID(1)), rec.Body.String())

	rec = getList(h, "?starting_after="+fakeID(1).String())
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, `{"data":[],"has_more":false}`+"\n", rec.Body.String(), "an empty page is an empty list")

	// Merchant B sees only its own.
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, request{method: http.MethodGet, path: "/v1/payments", header: map[string]string{"Authorization": "Bearer sk_b"}}.build())
	require.Equal(t, http.StatusOK, rec.Code)
	require.JSONEq(t, listBody(t, st, false, fakeID(4)), rec.Body.String())
}

func TestListPaymentsPassesParameters(t *testing.T) {
	t.Parallel()
	gte := time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)
	lt := time.Date(2025, 3, 2, 0, 0, 0, 500, time.UTC)
	after := fakeID(2)
	for _, tc := range []struct {
		query string
		want  store.ListPaymentsInput
	}{
		{"", store.ListPaymentsInput{MerchantID: merchantA, Limit: 20}},
		{"?limit=1", store.ListPaymentsInput{MerchantID: merchantA, Limit: 1}},
		{"?limit=100", store.ListPaymentsInput{MerchantID: merchantA, Limit: 100}},
		{"?status=unknown&created_gte=2025-03-01T12:00:00%2B03:00&created_lt=2025-03-02T00:00:00.0000005Z&starting_after=" + after.String(),
			store.ListPaymentsInput{MerchantID: merchantA, Limit: 20, Status: payment.StatusUnknown, CreatedGTE: &gte, CreatedLT: &lt, StartingAfter: &after}},
		// RFC 3339 lets "T" and "Z" be written in lower case.
		{"?created_gte=2025-03-01t09:00:00z", store.ListPaymentsInput{MerchantID: merchantA, Limit: 20, CreatedGTE: &gte}},
	} {
		st, h := listFixture(t)
		rec := getList(h, tc.query)
		require.Equal(t, http.StatusOK, rec.Code, "%s: %s", tc.query, rec.Body.String())
		got := st.lastList
		require.Equal(t, tc.want.MerchantID, got.MerchantID, tc.query)
		require.Equal(t, tc.want.Limit, got.Limit, tc.query)
		require.Equal(t, tc.want.Status, got.Status, tc.query)
		require.Equal(t, tc.want.StartingAfter, got.StartingAfter, tc.query)
		for _, pair := range [][2]*time.Time{{tc.want.CreatedGTE, got.CreatedGTE}, {tc.want.CreatedLT, got.CreatedLT}} {
			if pair[0] == nil {
				require.Nil(t, pair[1], tc.query)
				continue
			}
			require.NotNil(t, pair[1], tc.query)
			require.True(t, pair[0].Equal(*pair[1]), "%s: %v != %v", tc.query, pair[0], pair[1])
		}
	}
}

// Every bad parameter answers 400 invalid_request naming it, and nothing is read when the
// parameters alone say so.
func TestListPaymentsRefusesBadParameters(t *testing.T) {
	t.Parallel()
	unknown := payment.NewID().String()
	for _, tc := range []struct {
		query  string
		fields []string
		reads  bool // the store is asked (the cursor is judged there)
	}{
		{"?limit=0", []string{"limit"}, false},
		{"?limit=101", []string{"limit"}, false},
		{"?limit=-1", []string{"limit"}, false},
		{"?limit=%2B5", []string{"limit"}, false},
		{"?limit=05", []string{"limit"}, false},
		{"?limit=1.5", []string{"limit"}, false},
		{"?limit=ten", []string{"limit"}, false},
		{"?limit=", []string{"limit"}, false},
		{"?limit=1&limit=2", []string{"limit"}, false},
		{"?starting_after=nope", []string{"starting_after"}, false},
		{"?starting_after=", []string{"starting_after"}, false},
		{"?starting_after=" + fakeID(1).String()[:8] + fakeID(1).String()[9:], []string{"starting_after"}, false},
		{"?starting_after=" + unknown, []string{"starting_after"}, true},
		{"?starting_after=" + fakeID(4).String(), []string{"starting_after"}, true}, // merchant B's
		{"?status=pending", []string{"status"}, false},
		{"?status=SUCCEEDED", []string{"status"}, false},
		{"?status=", []string{"status"}, false},
		{"?created_gte=2025-03-01", []string{"created_gte"}, false},
		{"?created_gte=yesterday", []string{"created_gte"}, false},
		{"?created_lt=2025-03-01T00:00:00", []string{"created_lt"}, false},
		{"?created_lt=2025-03-01T00:00:00+03:00", []string{"created_lt"}, false}, // an unencoded + is a space
		{"?created_lt=", []string{"created_lt"}, false},
		{"?created_gte=2025-03-01T00:00:00Z&created_lt=2025-03-01T03:00:00%2B03:00", []string{"created_lt"}, false},
		{"?created_gte=2025-03-02T00:00:00Z&created_lt=2025-03-01T00:00:00Z", []string{"created_lt"}, false},
		{"?limit=0&status=x&created_gte=x&created_lt=x&starting_after=x", []string{"limit", "starting_after", "status", "created_gte", "created_lt"}, false},
		{"?page=2", []string{"page"}, false},
		{"?offset=20&limit=5", []string{"offset"}, false},
	} {
		st, h := listFixture(t)
		rec := getList(h, tc.query)
		require.Equal(t, http.StatusBadRequest, rec.Code, "%s: %s", tc.query, rec.Body.String())
		var p problem
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
		require.Equal(t, "invalid_request", p.Code, tc.query)
		var fields []string
		for _, f := range p.Errors {
			require.NotEmpty(t, f.Message, tc.query)
			fields = append(fields, f.Field)
		}
		require.Equal(t, tc.fields, fields, tc.query)
		if !tc.reads {
			require.Zero(t, st.calls["ListPayments"], "%s: refused before the store is asked", tc.query)
		}
	}
}

func TestListPaymentsKeepsTheKeyLookup(t *testing.T) {
	t.Parallel()
	st, h := listFixture(t)
	rec := getList(h, "?idempotency_key=k"+fakeID(2).String()[30:])
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	b, err := payment.JSON(st.payments[fakeID(2)].Resource())
	require.NoError(t, err)
	require.Equal(t, string(b), rec.Body.String(), "the payment itself, not a list")

	rec = getList(h, "?idempotency_key=k1&limit=5")
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Contains(t, rec.Body.String(), `"field":"limit","message":"unknown query parameter"`)
	require.Zero(t, st.calls["ListPayments"])
}

func TestListPaymentsStoreDown(t *testing.T) {
	t.Parallel()
	st, h := listFixture(t)
	st.fail["ListPayments"] = context.DeadlineExceeded
	rec := getList(h, "")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
}
