package schema

import (
	"io/fs"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
)

// lastUnguarded is the newest migration that alters a table without a lock_timeout of its own:
// every later one that does sets TryLockWait, so that its try never queues a table's queries
// behind it for longer.
const lastUnguarded = 28

var lockTimeout = regexp.MustCompile(`(?i)lock_timeout\s*=\s*'([^']*)'`)

// Every lock_timeout a migration sets is one try's wait (Migrate tries again), and a migration
// newer than lastUnguarded that alters a table the running release uses sets one.
func TestMigrationsWaitOneTryForTheirLocks(t *testing.T) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	require.NoError(t, err)
	want := TryLockWait.String() // "1s", as PostgreSQL reads it
	for _, n := range names {
		b, err := fs.ReadFile(migrations, n)
		require.NoError(t, err)
		up, _, _ := strings.Cut(string(b), "-- +goose Down")
		for _, m := range lockTimeout.FindAllStringSubmatch(string(b), -1) {
			require.Equal(t, want, m[1], "%s: a lock_timeout other than one try's wait (schema.TryLockWait)", n)
		}
		v, err := goose.NumericComponent(path.Base(n))
		require.NoError(t, err)
		if v > lastUnguarded && regexp.MustCompile(`(?i)\bALTER\s+TABLE\b`).MatchString(up) {
			require.Regexp(t, lockTimeout, up, "%s alters a table without SET LOCAL lock_timeout = '%s'", n, want)
		}
	}
}
