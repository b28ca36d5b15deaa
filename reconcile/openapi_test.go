package reconcile

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/kasa-pay/kasa/docs"
)

// The report's mismatch kinds and pending reasons are the ones docs/openapi.yaml lists: a new one
// is part of the admin API's answer, and its clients switch on them.
func TestReportValuesAreInTheOpenAPI(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "report.go", nil, 0)
	require.NoError(t, err)
	consts := map[string][]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Values) != 1 {
			return true
		}
		lit, ok := vs.Values[0].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		for _, prefix := range []string{"Kind", "Reason"} {
			if strings.HasPrefix(vs.Names[0].Name, prefix) {
				v, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				consts[prefix] = append(consts[prefix], v)
			}
		}
		return true
	})
	var spec struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []string `yaml:"enum"`
				} `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(docs.OpenAPI, &spec))
	schemas := spec.Components.Schemas
	require.ElementsMatch(t, consts["Kind"], schemas["SettlementMismatch"].Properties["kind"].Enum)
	require.ElementsMatch(t, consts["Reason"], schemas["SettlementPending"].Properties["reason"].Enum)
}
