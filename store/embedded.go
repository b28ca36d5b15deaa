package store

import (
	"embed"
	"strings"
)

// The statements sqlc cannot analyze (see the comment at the top of each file) are kept as
// named query files too, loaded here.
//
//go:embed queries/embedded/*.sql
var embedded embed.FS

var (
	queryClaimDeliveries         = embeddedQuery("claim_deliveries")
	queryClaimMerchantDeliveries = embeddedQuery("claim_merchant_deliveries")
	queryLockWaits               = embeddedQuery("lock_waits")
	queryTableSizes              = embeddedQuery("table_sizes")
)

func embeddedQuery(name string) string {
	b, err := embedded.ReadFile("queries/embedded/" + name + ".sql")
	if err != nil {
		panic(err)
	}
	return strings.TrimSuffix(strings.TrimSpace(string(b)), ";")
}
