package api

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/testkit"
)

// Two API instances on one database: a key revoked through one is refused by the other within a
// second, although the other had just authenticated it; the merchant's other key keeps working.
// Query strings PostgreSQL cannot hold are refused before they reach it.
func TestRevokedKeyIsRefusedByEveryInstanceWithinASecond(t *testing.T) {
	t.Parallel()
	env := testkit.Start(t, testkit.Options{})
	newServer := func() http.Handler {
		return New(Options{Store: env.Store, Workflows: &fakeWorkflows{}, AdminToken: "adm", Logger: slog.New(slog.DiscardHandler)}).Handler()
	}
	one, two := newServer(), newServer()
	call := func(h http.Handler, method, path, auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, nil)
		req.Header.Set("Authorization", "Bearer "+auth)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	decode := func(rec *httptest.ResponseRecorder) map[string]string {
		var out map[string]string
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
		return out
	}

	req := httptest.NewRequest("POST", "/admin/v1/merchants", strings.NewReader(`{"name":"Two Tills"}`))
	req.Header.Set("Authorization", "Bearer adm")
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	one.ServeHTTP(rec, req)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	var m struct{ ID, APIKey, APIKeyID string }
	var raw map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &raw))
	m.ID, m.APIKey, m.APIKeyID = raw["id"].(string), raw["api_key"].(string), raw["api_key_id"].(string)

	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"), "a merchant's first key and webhook secret must not be cached")

	rec = call(one, "POST", "/admin/v1/merchants/"+m.ID+"/api-keys", "adm")
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"), "a new key must not be cached")
	second := decode(rec)
	rec = call(one, "POST", "/admin/v1/merchants/"+m.ID+"/webhook-secret", "adm")
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"), "a new webhook secret must not be cached")

	byKey := "/v1/payments?idempotency_key=nothing-yet"
	for _, h := range []http.Handler{one, two} {
		require.Equal(t, http.StatusNotFound, call(h, "GET", byKey, m.APIKey).Code, "the first key works")
		require.Equal(t, http.StatusNotFound, call(h, "GET", byKey, second["api_key"]).Code, "and so does the second")
	}

	require.Equal(t, http.StatusNoContent, call(one, "DELETE", "/admin/v1/merchants/"+m.ID+"/api-keys/"+m.APIKeyID, "adm").Code)
	revoked := time.Now()
	require.Equal(t, http.StatusUnauthorized, call(one, "GET", byKey, m.APIKey).Code, "the revoking instance refuses at once")
	// The promise is about when a request arrives: none that arrives a second after the revocation
	// is let in. A request's own duration (long under -race on a loaded machine) is not counted.
	var lastAccepted time.Time
	require.Eventually(t, func() bool {
		arrived := time.Now()
		code := call(two, "GET", byKey, m.APIKey).Code
		if code != http.StatusUnauthorized {
			lastAccepted = arrived
		}
		return code == http.StatusUnauthorized
	}, 3*time.Second, 5*time.Millisecond)
	require.Less(t, lastAccepted.Sub(revoked), time.Second, "the other instance refuses within a second")
	require.Equal(t, http.StatusNotFound, call(two, "GET", byKey, second["api_key"]).Code, "the other key still works")

	for _, q := range []string{"%FF", "%00", "%C3%28"} {
		rec := call(two, "GET", "/v1/payments?idempotency_key="+q, second["api_key"])
		require.Equal(t, http.StatusBadRequest, rec.Code, "%s: %s", q, rec.Body.String())
		require.Contains(t, rec.Body.String(), `"code":"idempotency_key_invalid"`)
	}
}
