package api

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/kasa-pay/kasa/docs"
	"github.com/kasa-pay/kasa/payment"
)

// httpMethods are the operation keys of an OpenAPI path item.
var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// ginParam matches gin's ":name" and "*name" path segments.
var ginParam = regexp.MustCompile(`[:*]([A-Za-z0-9_]+)`)

// loadSpec parses the embedded OpenAPI document into plain maps and slices.
func loadSpec(t *testing.T) map[string]any {
	t.Helper()
	var raw any
	require.NoError(t, yaml.Unmarshal(docs.OpenAPI, &raw), "docs/openapi.yaml does not parse")
	spec, ok := asMap(raw)
	require.True(t, ok, "docs/openapi.yaml is not a mapping")
	return spec
}

// asMap returns v as a string-keyed map; YAML keys that are not strings (say an unquoted 200)
// are rendered with fmt so that they still compare as OpenAPI expects.
func asMap(v any) (map[string]any, bool) {
	switch m := v.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, val := range m {
			out[fmt.Sprint(k)] = val
		}
		return out, true
	}
	return nil, false
}

// specOperations returns every "METHOD /path" of the spec, with each operation object.
func specOperations(t *testing.T, spec map[string]any) map[string]map[string]any {
	t.Helper()
	paths, ok := asMap(spec["paths"])
	require.True(t, ok, "spec has no paths mapping")
	ops := map[string]map[string]any{}
	for path, item := range paths {
		require.True(t, strings.HasPrefix(path, "/"), "path %q does not start with /", path)
		pi, ok := asMap(item)
		require.True(t, ok, "path item %s is not a mapping", path)
		for _, m := range httpMethods {
			op, present := pi[m]
			if !present {
				continue
			}
			opm, ok := asMap(op)
			require.True(t, ok, "%s %s is not a mapping", strings.ToUpper(m), path)
			ops[strings.ToUpper(m)+" "+path] = opm
		}
	}
	return ops
}

// routerOperations returns every route the server registers, as "METHOD /path/{param}".
func routerOperations() map[string]bool {
	s := New(Options{}) // routes are only listed: New never touches Store or Workflows
	out := map[string]bool{}
	for _, r := range s.Routes() {
		out[ginParam.ReplaceAllString(r, "{$1}")] = true
	}
	return out
}

func sortedDiff(a map[string]bool, b func(string) bool) []string {
	var out []string
	for k := range a {
		if !b(k) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	spec := loadSpec(t)
	require.Equal(t, "3.1.0", fmt.Sprint(spec["openapi"]), "the spec must be OpenAPI 3.1")

	ops := specOperations(t, spec)
	routes := routerOperations()
	require.NotEmpty(t, routes)

	inSpec := map[string]bool{}
	for k := range ops {
		inSpec[k] = true
	}
	undocumented := sortedDiff(routes, func(k string) bool { return inSpec[k] })
	unserved := sortedDiff(inSpec, func(k string) bool { return routes[k] })
	require.True(t, len(undocumented) == 0 && len(unserved) == 0,
		"router and docs/openapi.yaml disagree\n  served but not in the spec:\n    %s\n  in the spec but not served:\n    %s",
		strings.Join(orNone(undocumented), "\n    "), strings.Join(orNone(unserved), "\n    "))
}

func orNone(s []string) []string {
	if len(s) == 0 {
		return []string{"(none)"}
	}
	return s
}

func TestOpenAPIOperationsAreComplete(t *testing.T) {
	spec := loadSpec(t)
	ops := specOperations(t, spec)
	require.NotEmpty(t, ops)

	var schemes map[string]any
	if comps, ok := asMap(spec["components"]); ok {
		schemes, _ = asMap(comps["securitySchemes"])
	}
	pathParam := regexp.MustCompile(`\{([^}]+)\}`)
	seenIDs := map[string]string{}
	for name, op := range ops {
		id, _ := op["operationId"].(string)
		require.NotEmpty(t, id, "%s has no operationId", name)
		if prev, dup := seenIDs[id]; dup {
			t.Errorf("operationId %q is used by both %s and %s", id, prev, name)
		}
		seenIDs[id] = name

		responses, ok := asMap(op["responses"])
		require.True(t, ok && len(responses) > 0, "%s has no responses", name)
		for code := range responses {
			if code == "default" {
				continue
			}
			n, err := strconv.Atoi(code)
			require.True(t, err == nil && n >= 100 && n <= 599, "%s: response key %q is not an HTTP status", name, code)
		}

		// Every {param} of the path is declared as a required path parameter.
		declared := map[string]bool{}
		params, _ := op["parameters"].([]any)
		for _, p := range params {
			pm, ok := asMap(p)
			require.True(t, ok, "%s: a parameter is not a mapping", name)
			if ref, isRef := pm["$ref"].(string); isRef {
				target, err := resolveRef(spec, ref)
				require.NoError(t, err, "%s: parameter %s", name, ref)
				pm, _ = asMap(target)
			}
			if pm["in"] == "path" {
				require.Equal(t, true, pm["required"], "%s: path parameter %v must be required", name, pm["name"])
				declared[fmt.Sprint(pm["name"])] = true
			}
		}
		path := name[strings.IndexByte(name, ' ')+1:]
		for _, m := range pathParam.FindAllStringSubmatch(path, -1) {
			require.True(t, declared[m[1]], "%s: path parameter {%s} is not declared", name, m[1])
		}

		// Every security requirement names a declared scheme.
		if sec, ok := op["security"].([]any); ok {
			for _, req := range sec {
				rm, _ := asMap(req)
				for scheme := range rm {
					_, ok := schemes[scheme]
					require.True(t, ok, "%s: unknown security scheme %q", name, scheme)
				}
			}
		}
	}
}

func TestOpenAPIRefsResolve(t *testing.T) {
	spec := loadSpec(t)
	var refs []string
	collectRefs(spec, &refs)
	require.NotEmpty(t, refs, "the spec uses no $ref at all")
	var broken []string
	for _, ref := range refs {
		if _, err := resolveRef(spec, ref); err != nil {
			broken = append(broken, err.Error())
		}
	}
	sort.Strings(broken)
	require.Empty(t, broken, "unresolvable $refs:\n  %s", strings.Join(broken, "\n  "))
}

// collectRefs appends the value of every "$ref" key in the document.
func collectRefs(v any, out *[]string) {
	if m, ok := asMap(v); ok {
		for k, val := range m {
			if k == "$ref" {
				s, _ := val.(string)
				*out = append(*out, s)
				continue
			}
			collectRefs(val, out)
		}
		return
	}
	if l, ok := v.([]any); ok {
		for _, e := range l {
			collectRefs(e, out)
		}
	}
}

// resolveRef follows a local JSON pointer reference ("#/a/b~1c") through the document.
func resolveRef(doc map[string]any, ref string) (any, error) {
	ptr, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("%q is not a reference within the document", ref)
	}
	var cur any = doc
	for _, tok := range strings.Split(ptr, "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil, fmt.Errorf("%q: no element %q", ref, tok)
			}
			cur = c[i]
		default:
			m, ok := asMap(cur)
			if !ok {
				return nil, fmt.Errorf("%q: %q is inside a scalar", ref, tok)
			}
			next, ok := m[tok]
			if !ok {
				return nil, fmt.Errorf("%q: no key %q", ref, tok)
			}
			cur = next
		}
	}
	return cur, nil
}

func TestOpenAPIServedVerbatim(t *testing.T) {
	s := New(Options{})
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "application/yaml", rec.Header().Get("Content-Type"))
	require.Equal(t, docs.OpenAPI, rec.Body.Bytes(), "GET /openapi.yaml must serve the embedded document byte for byte")
}

// GET /v1/payments documents both of its forms: the parameters the handler takes (each
// optional, the list's bounds as the handler applies them) and a 200 that is either the
// payment an idempotency key created or a page of payments shaped as the handler writes it.
func TestOpenAPIListsPayments(t *testing.T) {
	spec := loadSpec(t)
	op := specOperations(t, spec)["GET /v1/payments"]
	require.NotNil(t, op, "GET /v1/payments is not in the spec")

	params := map[string]map[string]any{}
	ops, _ := op["parameters"].([]any)
	for _, p := range ops {
		pm, _ := asMap(p)
		if ref, isRef := pm["$ref"].(string); isRef {
			target, err := resolveRef(spec, ref)
			require.NoError(t, err)
			pm, _ = asMap(target)
		}
		if pm["in"] == "query" {
			require.NotEqual(t, true, pm["required"], "query parameter %v is optional", pm["name"])
			params[fmt.Sprint(pm["name"])], _ = asMap(pm["schema"])
		}
	}
	var names []string
	for n := range params {
		names = append(names, n)
	}
	sort.Strings(names)
	want := append([]string{"idempotency_key"}, paymentListParams...)
	sort.Strings(want)
	require.Equal(t, want, names, "the query parameters the handlers take")
	limit := params["limit"]
	require.Equal(t, []any{1, maxListLimit, defaultListLimit}, []any{limit["minimum"], limit["maximum"], limit["default"]}, "limit's bounds")
	var statuses []string
	enum, _ := params["status"]["enum"].([]any)
	for _, s := range enum {
		statuses = append(statuses, fmt.Sprint(s))
	}
	require.Equal(t, paymentStatuses, statuses)

	responses, _ := asMap(op["responses"])
	ok, _ := asMap(responses["200"])
	content, _ := asMap(ok["content"])
	js, _ := asMap(content["application/json"])
	schema, _ := asMap(js["schema"])
	var refs []string
	oneOf, _ := schema["oneOf"].([]any)
	for _, s := range oneOf {
		sm, _ := asMap(s)
		refs = append(refs, fmt.Sprint(sm["$ref"]))
	}
	require.ElementsMatch(t, []string{"#/components/schemas/Payment", "#/components/schemas/PaymentList"}, refs)

	list, err := resolveRef(spec, "#/components/schemas/PaymentList")
	require.NoError(t, err)
	lm, _ := asMap(list)
	props, _ := asMap(lm["properties"])
	data, _ := asMap(props["data"])
	items, _ := asMap(data["items"])
	require.Equal(t, "#/components/schemas/Payment", items["$ref"])
	_, h := listFixture(t)
	rec := getList(h, "")
	require.Equal(t, http.StatusOK, rec.Code)
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	var keys, declared []string
	for k := range body {
		keys = append(keys, k)
	}
	for k := range props {
		declared = append(declared, k)
	}
	required, _ := lm["required"].([]any)
	require.ElementsMatch(t, declared, keys, "the answer's fields are the schema's")
	require.Len(t, required, len(keys), "every field is always there")
}

// The Refund and Payment schemas describe exactly the JSON the resources marshal to: the same
// fields, all required (a resource always carries every field), and a null allowed exactly
// where the Go field is a pointer.
func TestOpenAPIResourceSchemasMatchTheirTypes(t *testing.T) {
	spec := loadSpec(t)
	for _, tc := range []struct {
		schema string
		typ    reflect.Type
	}{
		{"Refund", reflect.TypeFor[payment.RefundResource]()},
		{"Payment", reflect.TypeFor[payment.Resource]()},
	} {
		t.Run(tc.schema, func(t *testing.T) {
			raw, err := resolveRef(spec, "#/components/schemas/"+tc.schema)
			require.NoError(t, err)
			schema, _ := asMap(raw)
			props, _ := asMap(schema["properties"])

			var fields, nullable, always []string
			for i := range tc.typ.NumField() {
				f := tc.typ.Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
				fields = append(fields, name)
				if opts != "omitempty" {
					always = append(always, name)
				}
				if f.Type.Kind() == reflect.Pointer {
					nullable = append(nullable, name)
				}
			}
			var declared, required, declaredNullable []string
			for name, p := range props {
				declared = append(declared, name)
				if schemaAllowsNull(t, spec, p) {
					declaredNullable = append(declaredNullable, name)
				}
			}
			for _, r := range asSlice(schema["required"]) {
				required = append(required, fmt.Sprint(r))
			}
			require.ElementsMatch(t, fields, declared, "the schema's properties are the resource's JSON fields")
			require.Equal(t, always, required, "every field but the omitted ones is required, listed in the order the resource writes them")
			require.ElementsMatch(t, nullable, declaredNullable, "null is allowed exactly for the pointer fields")
		})
	}
	// A page of refunds holds refunds, and a refund's statuses are an automatic payment's.
	refund, err := resolveRef(spec, "#/components/schemas/Refund")
	require.NoError(t, err)
	rm, _ := asMap(refund)
	rprops, _ := asMap(rm["properties"])
	status, _ := asMap(rprops["status"])
	var statuses []string
	for _, s := range asSlice(status["enum"]) {
		statuses = append(statuses, fmt.Sprint(s))
	}
	require.Equal(t, paymentStatuses[:4], statuses)
	list, err := resolveRef(spec, "#/components/schemas/RefundList")
	require.NoError(t, err)
	lm, _ := asMap(list)
	props, _ := asMap(lm["properties"])
	data, _ := asMap(props["data"])
	items, _ := asMap(data["items"])
	require.Equal(t, "#/components/schemas/Refund", items["$ref"])
	require.ElementsMatch(t, []any{"data", "has_more"}, asSlice(lm["required"]))
}

// schemaAllowsNull says whether a property schema (a $ref, allOf or oneOf of them, or a type
// list) admits null.
func schemaAllowsNull(t *testing.T, spec map[string]any, v any) bool {
	t.Helper()
	m, _ := asMap(v)
	if ref, ok := m["$ref"].(string); ok {
		target, err := resolveRef(spec, ref)
		require.NoError(t, err)
		return schemaAllowsNull(t, spec, target)
	}
	for _, typ := range append(asSlice(m["type"]), m["type"]) {
		if typ == "null" {
			return true
		}
	}
	for _, key := range []string{"oneOf", "anyOf"} {
		for _, alt := range asSlice(m[key]) {
			if schemaAllowsNull(t, spec, alt) {
				return true
			}
		}
	}
	return false
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// Every route answers a query parameter it does not take as its handler does (400 on the /v1
// and /admin/v1 routes), and the spec lists that answer among the operation's responses.
func TestOpenAPIListsTheAnswerToAnUnknownParameter(t *testing.T) {
	t.Parallel()
	ops := specOperations(t, loadSpec(t))
	st := newFakeStore()
	h := New(Options{Store: st, Workflows: &fakeWorkflows{st: st}, AdminToken: "adm", SyncWait: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}).Handler()
	var names []string
	for name := range ops {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		method, path, _ := strings.Cut(name, " ")
		if method != http.MethodGet || !strings.HasPrefix(path, "/v1/") && !strings.HasPrefix(path, "/admin/v1/") {
			continue
		}
		target := regexp.MustCompile(`\{[^}]+\}`).ReplaceAllString(path, fakeID(1).String()) + "?bogus=1"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request{method: method, path: target}.build())
		responses, _ := asMap(ops[name]["responses"])
		_, listed := responses[strconv.Itoa(rec.Code)]
		require.True(t, listed, "%s answers %d to an unknown parameter, which docs/openapi.yaml does not list: %s", name, rec.Code, rec.Body)
	}
}
