// Package docs embeds kasa's published documents, so the API can serve them.
package docs

import _ "embed"

// OpenAPI is the merchant and admin API specification (served at /openapi.yaml).
//
//go:embed openapi.yaml
var OpenAPI []byte
