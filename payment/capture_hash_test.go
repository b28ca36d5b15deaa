package payment

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// "capture" is part of the request hash (docs/api.md, idempotency). The same key sent again with another
// capture mode is another request (422 idempotency_key_reused), never a replay of the first.
func TestCaptureModeIsPartOfTheRequestHash(t *testing.T) {
	t.Parallel()
	base := `{"invoice_id":"45982","amount":"1000.00","currency":"TRY","account_id":"` + acct + `"`
	parse := func(extra string) Request {
		r, err := ParseRequest([]byte(base + extra + `}`))
		require.NoError(t, err, extra)
		return r
	}
	auto, explicit, manual := parse(``), parse(`,"capture":"automatic"`), parse(`,"capture":"manual"`)
	require.True(t, manual.CaptureManual)
	require.Equal(t, auto.Hash(), explicit.Hash(), "automatic is the default")
	require.NotEqual(t, auto.Hash(), manual.Hash(), "a manual payment is another request than an automatic one")
}
