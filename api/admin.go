package api

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// decodeStrict decodes one JSON object into v (a pointer to a struct) with the rules of payment
// bodies: the JSON content type, at most 64 KiB, no duplicate or unknown fields, field names
// exactly as documented (encoding/json alone would take "Name" for "name"), no trailing data.
func decodeStrict(c *gin.Context, v any) error {
	body, err := readJSONBody(c)
	if err != nil {
		return err
	}
	keys, err := payment.StrictObject(body)
	if err != nil {
		return &payment.ValidationError{Fields: []payment.FieldError{{Field: "body", Message: err.Error()}}}
	}
	names := jsonNames(v)
	var ve payment.ValidationError
	for _, k := range keys {
		if !names[k] {
			ve.Fields = append(ve.Fields, payment.FieldError{Field: k, Message: "unknown field"})
		}
	}
	if len(ve.Fields) > 0 {
		return &ve
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return &payment.ValidationError{Fields: []payment.FieldError{{Field: te.Field, Message: "must be a JSON " + jsonKind(te.Type.Kind())}}}
		}
		return &payment.ValidationError{Fields: []payment.FieldError{{Field: "body", Message: "body is not valid JSON"}}}
	}
	return nil
}

// decodeNone accepts no body, or an empty JSON object, for calls that take no input.
func decodeNone(c *gin.Context) error {
	if c.Request.ContentLength == 0 {
		return nil
	}
	var none struct{}
	return decodeStrict(c, &none)
}

// jsonNames are the JSON field names of the struct v points to.
func jsonNames(v any) map[string]bool {
	t := reflect.TypeOf(v).Elem()
	names := make(map[string]bool, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		names[name] = true
	}
	return names
}

func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int64, reflect.Float64:
		return "number"
	}
	return "value of another type"
}

// optionalIdempotencyKey is the Idempotency-Key of a call that takes one if given: "" when
// there is none, payment.ErrKeyInvalid when it is malformed or repeated.
func optionalIdempotencyKey(c *gin.Context) (string, error) {
	if len(c.Request.Header.Values("Idempotency-Key")) == 0 {
		return "", nil
	}
	return idempotencyKey(c)
}

type merchantRequest struct {
	Name       string `json:"name"`
	WebhookURL string `json:"webhook_url"`
}

type merchantCreated struct {
	ID            string  `json:"id"`
	Name          string  `json:"name"`
	WebhookURL    *string `json:"webhook_url"`
	APIKey        string  `json:"api_key"`
	APIKeyID      string  `json:"api_key_id"`
	WebhookSecret string  `json:"webhook_secret"`
}

func (s *Server) createMerchant(c *gin.Context) {
	if !s.queryOK(c) {
		return
	}
	key, err := optionalIdempotencyKey(c)
	if err != nil {
		s.writeError(c, err)
		return
	}
	var req merchantRequest
	if err := decodeStrict(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	var ve payment.ValidationError
	req.Name = strings.TrimSpace(req.Name)
	switch {
	case req.Name == "" || utf8.RuneCountInString(req.Name) > 200:
		ve.Fields = append(ve.Fields, payment.FieldError{Field: "name", Message: "is required, at most 200 characters"})
	case strings.ContainsFunc(req.Name, unicode.IsControl):
		// PostgreSQL cannot store NUL, and no merchant's name needs a control character.
		ve.Fields = append(ve.Fields, payment.FieldError{Field: "name", Message: "must not contain control characters"})
	}
	if req.WebhookURL != "" {
		if err := outbox.CheckWebhookURL(req.WebhookURL, outbox.Policy{AllowPrivate: s.AllowPrivateWebhooks, Own: s.OwnHosts}); err != nil {
			ve.Fields = append(ve.Fields, payment.FieldError{Field: "webhook_url", Message: err.Error()})
		}
	}
	if len(ve.Fields) > 0 {
		s.writeError(c, &ve)
		return
	}
	m := payment.Merchant{ID: payment.NewID(), Name: req.Name, WebhookURL: req.WebhookURL}
	created := store.MerchantCreated{MerchantID: m.ID, APIKeyID: payment.NewID(), APIKey: payment.NewSecret("sk_"), WebhookSecret: payment.NewSecret("whsec_")}
	replayed := false
	if key == "" {
		err = s.Store.CreateMerchantWithKey(c.Request.Context(), m, created.APIKeyID, created.APIKey, created.WebhookSecret)
	} else {
		hash, _ := json.Marshal(req) // the request as validated: its name trimmed
		sum := sha256.Sum256(hash)
		created, replayed, err = s.Store.CreateMerchantOnce(c.Request.Context(), key, sum[:], m, created)
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	if replayed {
		c.Header("Idempotent-Replayed", "true")
	}
	out := merchantCreated{ID: created.MerchantID.String(), Name: m.Name, APIKey: created.APIKey, APIKeyID: created.APIKeyID.String(),
		WebhookSecret: created.WebhookSecret}
	if m.WebhookURL != "" {
		out.WebhookURL = &m.WebhookURL
	}
	writeJSON(c, http.StatusCreated, out)
}

type accountRequest struct {
	MerchantID string `json:"merchant_id"`
	Currency   string `json:"currency"`
}

func (s *Server) createAccount(c *gin.Context) {
	if !s.queryOK(c) {
		return
	}
	key, err := optionalIdempotencyKey(c)
	if err != nil {
		s.writeError(c, err)
		return
	}
	var req accountRequest
	if err := decodeStrict(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	var ve payment.ValidationError
	merchantID, err := uuid.Parse(req.MerchantID)
	if err != nil {
		ve.Fields = append(ve.Fields, payment.FieldError{Field: "merchant_id", Message: "must be a merchant id"})
	}
	currency, err := payment.ParseCurrency(req.Currency)
	if err != nil {
		ve.Fields = append(ve.Fields, payment.FieldError{Field: "currency", Message: err.Error()})
	}
	if len(ve.Fields) > 0 {
		s.writeError(c, &ve)
		return
	}
	var a payment.Account
	replayed := false
	if key == "" {
		a, err = s.Store.CreateAccount(c.Request.Context(), merchantID, currency)
	} else {
		a, replayed, err = s.Store.CreateAccountOnce(c.Request.Context(), key, merchantID, currency)
	}
	if errors.Is(err, payment.ErrNotFound) {
		err = &payment.ValidationError{Fields: []payment.FieldError{{Field: "merchant_id", Message: "no such merchant"}}}
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	if replayed {
		c.Header("Idempotent-Replayed", "true")
	}
	writeJSON(c, http.StatusCreated, accountResource(a))
}

type depositRequest struct {
	Amount json.RawMessage `json:"amount"`
}

type depositBody struct {
	ID        string `json:"id"`
	AccountID string `json:"account_id"`
	Amount    string `json:"amount"`
	Currency  string `json:"currency"`
	CreatedAt string `json:"created_at"`
}

func (s *Server) deposit(c *gin.Context) {
	if !s.queryOK(c) {
		return
	}
	key, err := idempotencyKey(c)
	if err != nil {
		s.writeError(c, err)
		return
	}
	accountID, err := uuid.Parse(c.Param("id"))
	if err != nil {
		s.writeError(c, payment.ErrNotFound)
		return
	}
	var req depositRequest
	if err := decodeStrict(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	acct, err := s.Store.Account(c.Request.Context(), accountID)
	if err != nil {
		s.writeError(c, err)
		return
	}
	amount, err := payment.ParseAmountJSON(req.Amount, acct.Currency)
	if err != nil {
		s.writeError(c, &payment.ValidationError{Fields: []payment.FieldError{{Field: "amount", Message: err.Error()}}})
		return
	}
	d, replayed, err := s.Store.Deposit(c.Request.Context(), accountID, key, amount)
	if err != nil {
		s.writeError(c, err)
		return
	}
	if replayed {
		c.Header("Idempotent-Replayed", "true")
	}
	writeJSON(c, http.StatusCreated, depositBody{
		ID: d.ID.String(), AccountID: d.AccountID.String(), Amount: payment.FormatAmount(d.AmountMinor, d.Currency),
		Currency: d.Currency, CreatedAt: payment.FormatTime(d.CreatedAt),
	})
}

// webhookSecretOverlap is how long a replaced webhook secret keeps signing next to the new one.
const webhookSecretOverlap = 24 * time.Hour

type apiKeyCreated struct {
	ID         string `json:"id"`
	MerchantID string `json:"merchant_id"`
	APIKey     string `json:"api_key"`
}

type apiKeyList struct {
	MerchantID string       `json:"merchant_id"`
	APIKeys    []apiKeyBody `json:"api_keys"`
}

type apiKeyBody struct {
	ID        string  `json:"id"`
	CreatedAt string  `json:"created_at"`
	RevokedAt *string `json:"revoked_at"`
}

type webhookSecretCreated struct {
	WebhookSecret           string `json:"webhook_secret"`
	PreviousSecretExpiresAt string `json:"previous_secret_expires_at"`
}

// merchantParam is the merchant of the path; a malformed id is no such merchant.
func merchantParam(c *gin.Context) (uuid.UUID, error) {
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return uuid.Nil, payment.ErrNotFound
	}
	return id, nil
}

// createAPIKey gives a merchant one more API key, shown once; its other keys keep working.
func (s *Server) createAPIKey(c *gin.Context) {
	if !s.queryOK(c) {
		return
	}
	merchantID, err := merchantParam(c)
	if err == nil {
		err = decodeNone(c)
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	apiKey, keyID := payment.NewSecret("sk_"), payment.NewID()
	if err := s.Store.AddAPIKey(c.Request.Context(), merchantID, keyID, apiKey); err != nil {
		s.writeError(c, err)
		return
	}
	writeJSON(c, http.StatusCreated, apiKeyCreated{ID: keyID.String(), MerchantID: merchantID.String(), APIKey: apiKey})
}

// listAPIKeys lists a merchant's keys (never the keys themselves), revoked ones included.
func (s *Server) listAPIKeys(c *gin.Context) {
	if !s.queryOK(c) {
		return
	}
	merchantID, err := merchantParam(c)
	if err != nil {
		s.writeError(c, err)
		return
	}
	keys, err := s.Store.APIKeys(c.Request.Context(), merchantID)
	if err != nil {
		s.writeError(c, err)
		return
	}
	out := apiKeyList{MerchantID: merchantID.String(), APIKeys: make([]apiKeyBody, 0, len(keys))}
	for _, k := range keys {
		out.APIKeys = append(out.APIKeys, apiKeyBody{ID: k.ID.String(), CreatedAt: payment.FormatTime(k.CreatedAt), RevokedAt: optionalTime(k.RevokedAt)})
	}
	writeJSON(c, http.StatusOK, out)
}

// revokeAPIKey revokes one of a merchant's keys: 204, also when it was revoked before; 404 for
// a key that is not the merchant's. This instance refuses the key at once, the others within
// authCacheTTL.
func (s *Server) revokeAPIKey(c *gin.Context) {
	if !s.queryOK(c) {
		return
	}
	merchantID, err := merchantParam(c)
	if err != nil {
		s.writeError(c, err)
		return
	}
	keyID, err := uuid.Parse(c.Param("key_id"))
	if err != nil {
		s.writeError(c, payment.ErrNotFound)
		return
	}
	if err := s.Store.RevokeAPIKey(c.Request.Context(), merchantID, keyID); err != nil {
		s.writeError(c, err)
		return
	}
	s.merchants.forgetMerchant(merchantID)
	c.Status(http.StatusNoContent)
}

// rotateWebhookSecret replaces a merchant's webhook secret, shown once; webhooks carry the old
// secret's signature next to the new one's for webhookSecretOverlap.
func (s *Server) rotateWebhookSecret(c *gin.Context) {
	if !s.queryOK(c, "revoke_previous") {
		return
	}
	merchantID, err := merchantParam(c)
	if err == nil {
		err = decodeNone(c)
	}
	overlap := webhookSecretOverlap
	switch c.Query("revoke_previous") {
	case "", "false":
	case "true": // the old secret leaked: it signs nothing from now on, and is wiped
		overlap = 0
	default:
		err = &payment.ValidationError{Fields: []payment.FieldError{{Field: "revoke_previous", Message: "must be true or false"}}}
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	secret := payment.NewSecret("whsec_")
	until, err := s.Store.RotateWebhookSecret(c.Request.Context(), merchantID, secret, overlap)
	if err != nil {
		s.writeError(c, err)
		return
	}
	writeJSON(c, http.StatusCreated, webhookSecretCreated{WebhookSecret: secret, PreviousSecretExpiresAt: payment.FormatTime(until)})
}

// auditLog is GET /admin/v1/audit: the admin calls, newest first, in keyset pages.
func (s *Server) auditLog(c *gin.Context) {
	if !s.queryOK(c, "limit", "starting_after") {
		return
	}
	q := newListQuery(c)
	limit, after := q.limit(), q.startingAfter("audit entry")
	if err := q.err(); err != nil {
		s.writeError(c, err)
		return
	}
	from := uuid.Nil
	if after != nil {
		from = *after
	}
	entries, more, err := s.Store.AuditLog(c.Request.Context(), limit, from)
	if err != nil {
		s.writeError(c, err)
		return
	}
	out := listPage[auditBody]{Data: make([]auditBody, 0, len(entries)), HasMore: more}
	for _, e := range entries {
		out.Data = append(out.Data, auditBody{ID: e.ID.String(), At: payment.FormatTime(e.At), TokenID: e.TokenID, Method: e.Method,
			Route: e.Route, Target: e.Target, Status: e.Status, RequestID: e.RequestID})
	}
	writeJSON(c, http.StatusOK, out)
}

// auditBody is one admin call as GET /admin/v1/audit answers it: its time rendered as the API
// renders every time (UTC, microseconds), not in the zone the database driver read it in.
type auditBody struct {
	ID        string `json:"id"`
	At        string `json:"at"`
	TokenID   string `json:"token_id"`
	Method    string `json:"method"`
	Route     string `json:"route"`
	Target    string `json:"target"`
	Status    int    `json:"status"`
	RequestID string `json:"request_id"`
}
