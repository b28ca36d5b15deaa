package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/outbox"
)

// A merchant cannot register kasa's own public host as its webhook URL, even where private
// addresses are allowed; another host is accepted.
func TestWebhookURLMayNotBeKasaItself(t *testing.T) {
	s, _, _ := newTestServer(t, func(o *Options) {
		o.AllowPrivateWebhooks = true
		o.OwnHosts = outbox.NewOwnHosts([]string{"api.kasa.example"})
	})
	for _, tc := range []struct {
		url  string
		code int
	}{
		{"https://api.kasa.example/admin/v1/merchants", http.StatusBadRequest},
		{"https://hooks.cafe.example/kasa", http.StatusCreated},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/admin/v1/merchants", strings.NewReader(`{"name":"Cafe","webhook_url":"`+tc.url+`"}`))
		req.Header.Set("Authorization", "Bearer adm")
		req.Header.Set("Content-Type", "application/json")
		s.Handler().ServeHTTP(rec, req)
		require.Equal(t, tc.code, rec.Code, "%s: %s", tc.url, rec.Body)
		if tc.code == http.StatusBadRequest {
			require.Contains(t, rec.Body.String(), "must not point at kasa itself (api.kasa.example)")
		}
	}
}
