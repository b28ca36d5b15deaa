package api

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A merchant's webhook URL that points at kasa's own network, or carries credentials, is refused
// at registration with a 400 naming webhook_url; a public one is accepted. With private webhooks
// allowed, only the credentials are refused.
func TestCreateMerchantRefusesPrivateWebhookURLs(t *testing.T) {
	t.Parallel()
	for _, allow := range []bool{false, true} {
		t.Run("allow_private="+strconv.FormatBool(allow), func(t *testing.T) { createMerchantURLs(t, allow) })
	}
}

func createMerchantURLs(t *testing.T, allowPrivate bool) {
	t.Parallel()
	for _, tc := range []struct {
		url     string
		refused bool
	}{
		{"https://hooks.example.com/kasa", false},
		{"https://93.184.216.34:8443/hooks", false},
		{"http://127.0.0.1:9000/hooks", true},
		{"http://localhost/hooks", true},
		{"http://2130706433/", true},
		{"http://[::ffff:127.0.0.1]/", true},
		{"http://10.1.2.3/", true},
		{"http://169.254.169.254/latest/meta-data/", true},
		{"http://[fd12::1]/", true},
		{"http://0.0.0.0:8080/", true},
		{"https://user:secret@hooks.example.com/", true},
	} {
		refused := tc.refused && (!allowPrivate || strings.Contains(tc.url, "@"))
		t.Run(tc.url, func(t *testing.T) {
			t.Parallel()
			h := New(Options{Store: newFakeStore(), AdminToken: "adm", AllowPrivateWebhooks: allowPrivate, Logger: slog.New(slog.DiscardHandler)}).Handler()
			body, err := json.Marshal(map[string]string{"name": "Cafe", "webhook_url": tc.url})
			require.NoError(t, err)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, request{method: http.MethodPost, path: "/admin/v1/merchants", body: string(body)}.build())
			if !refused {
				require.Equal(t, http.StatusCreated, rec.Code, "%s", rec.Body)
				return
			}
			require.Equal(t, http.StatusBadRequest, rec.Code, "%s", rec.Body)
			var p struct {
				Code   string `json:"code"`
				Errors []struct {
					Field, Message string
				} `json:"errors"`
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p), "%s", rec.Body)
			require.Equal(t, "invalid_request", p.Code)
			require.Len(t, p.Errors, 1, "%s", rec.Body)
			require.Equal(t, "webhook_url", p.Errors[0].Field)
			require.NotEmpty(t, p.Errors[0].Message)
		})
	}
}
