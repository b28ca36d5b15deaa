package outbox

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/kasa-pay/kasa/docs"
)

// The admin API's delivery resource names every event type a merchant can receive: a client
// that checks answers against docs/openapi.yaml would otherwise reject a manual payment's.
func TestOpenAPIDeliveryListsEveryWebhookType(t *testing.T) {
	var spec struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []any `yaml:"enum"`
				} `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(docs.OpenAPI, &spec))
	var declared []string
	for _, e := range spec.Components.Schemas["Delivery"].Properties["event_type"].Enum {
		declared = append(declared, fmt.Sprint(e))
	}
	var types []string
	for typ := range webhookTypes {
		types = append(types, typ)
	}
	slices.Sort(types)
	require.ElementsMatch(t, types, declared, "Delivery.event_type in docs/openapi.yaml")
}
