package tests

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/api"
	"github.com/kasa-pay/kasa/workflows"
)

// Every admin call is in the audit, newest first, naming the token that made it by its id; the
// previous admin token works while a rotation overlaps, and is told apart.
func TestAdminCallsAreAudited(t *testing.T) {
	const previous = "the-admin-token-before-the-rotation-0001"
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc, adminPrevious: previous})
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "10.00")
	r := s.do("POST", "/admin/v1/settlements?merchant_id="+m.ID+"&dry_run=true", previous, s.settlementFile(today()), "Content-Type", "text/csv")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	r = s.do("POST", "/admin/v1/settlements?merchant_id="+m.ID, adminToken, s.settlementFile(today()), "Content-Type", "text/csv")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, http.StatusUnauthorized, s.do("GET", "/admin/v1/audit", "not-the-token", "").Status)

	r = s.do("GET", "/admin/v1/audit?limit=3", adminToken, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	page := r.json(t)
	require.Equal(t, true, page["has_more"])
	entries := page["data"].([]any)
	require.Len(t, entries, 3)
	want := []struct {
		token, method, route, target string
		status                       float64
	}{
		{api.AdminTokenID(adminToken), "POST", "/admin/v1/settlements", "/admin/v1/settlements?merchant_id=" + m.ID, 200},
		{api.AdminTokenID(previous), "POST", "/admin/v1/settlements", "/admin/v1/settlements?merchant_id=" + m.ID + "&dry_run=true", 200},
		{api.AdminTokenID(adminToken), "POST", "/admin/v1/accounts/:id/deposits", "/admin/v1/accounts/" + payer + "/deposits", 201},
	}
	for i, w := range want {
		e := entries[i].(map[string]any)
		require.Equal(t, w.token, e["token_id"], "entry %d", i)
		require.Equal(t, w.method, e["method"])
		require.Equal(t, w.route, e["route"])
		require.Equal(t, w.target, e["target"])
		require.Equal(t, w.status, e["status"])
		require.NotEmpty(t, e["request_id"])
		require.NotContains(t, fmt.Sprint(e), adminToken, "the audit never holds a token")
	}
	require.NotEqual(t, api.AdminTokenID(adminToken), api.AdminTokenID(previous))

	// The next page goes on from the last entry, down to the merchant's creation.
	last := entries[2].(map[string]any)["id"].(string)
	r = s.do("GET", "/admin/v1/audit?limit=100&starting_after="+last, adminToken, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var routes []string
	for _, e := range r.json(t)["data"].([]any) {
		routes = append(routes, e.(map[string]any)["route"].(string))
	}
	require.Contains(t, routes, "/admin/v1/accounts")
	require.Contains(t, routes, "/admin/v1/merchants")
}

// An admin call whose query string holds bytes that are not UTF-8 (HTTP lets them through; it
// is refused 400) is in the audit all the same: PostgreSQL refuses such bytes in text, and the
// call would otherwise be left out of the audit.
func TestAdminCallWithRawBytesInItsQueryIsAudited(t *testing.T) {
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityIdempotent, temporal: tc})
	m := s.newMerchant()
	reqID := "raw-query-" + m.ID
	r := s.do("POST", "/admin/v1/merchants/"+m.ID+"/webhook-secret?revoke_previous=\xff", adminToken, "", "X-Request-Id", reqID)
	require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)

	var found map[string]any
	after := ""
	for page := 0; found == nil && page < 20; page++ {
		r = s.do("GET", "/admin/v1/audit?limit=100"+after, adminToken, "")
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		body := r.json(t)
		entries := body["data"].([]any)
		for _, e := range entries {
			if e := e.(map[string]any); e["request_id"] == reqID {
				found = e
			}
		}
		if body["has_more"] != true {
			break
		}
		after = "&starting_after=" + entries[len(entries)-1].(map[string]any)["id"].(string)
	}
	require.NotNil(t, found, "the call is in the audit")
	require.Equal(t, "/admin/v1/merchants/:id/webhook-secret", found["route"])
	require.Equal(t, float64(http.StatusBadRequest), found["status"])
	require.Equal(t, "/admin/v1/merchants/"+m.ID+"/webhook-secret?revoke_previous=%FF", found["target"], "the byte percent-encoded")
}
