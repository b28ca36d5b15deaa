package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A pipelined transaction commits both batches or neither, and never leaves a transaction open.
func TestPipelinedTransactionIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	require.NoError(t, db.Exec(ctx, `CREATE TABLE IF NOT EXISTS pipetx_test (id int PRIMARY KEY)`))
	t.Cleanup(func() { _ = db.Exec(ctx, `DROP TABLE pipetx_test`) })
	rows := func() []int {
		var ids []int
		require.NoError(t, db.QueryRow(ctx, `SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM pipetx_test`, nil, &ids))
		return ids
	}
	insert := func(id int) string { return fmt.Sprintf(`INSERT INTO pipetx_test VALUES (%d)`, id) }
	for _, tc := range []struct {
		name    string
		fn      func(send, commit func(string) error, nothingToCommit func()) error
		wantErr string
		want    []int
	}{
		{name: "both batches commit", want: []int{1, 2},
			fn: func(send, commit func(string) error, _ func()) error {
				if err := send(insert(1)); err != nil {
					return err
				}
				return commit(insert(2))
			}},
		{name: "the second batch fails", wantErr: "division by zero", want: []int{1, 2},
			fn: func(send, commit func(string) error, _ func()) error {
				if err := send(insert(3)); err != nil {
					return err
				}
				return commit(`SELECT 1/0`)
			}},
		{name: "the first batch fails", wantErr: "duplicate key", want: []int{1, 2},
			fn: func(send, commit func(string) error, _ func()) error {
				if err := send(insert(1)); err != nil {
					return err
				}
				return commit(insert(4))
			}},
		// Whether COMMIT is already prepared on the connection decides which error says so.
		{name: "a failure the caller ignored aborts the commit", wantErr: "rolled back at commit|transaction is aborted", want: []int{1, 2},
			fn: func(send, commit func(string) error, _ func()) error {
				_ = send(insert(5))
				_ = send(`SELECT 1/0`)
				return commit(insert(6))
			}},
		// pgx prepares a batch's new statements before sending it: one that does not parse stops
		// the first batch before its BEGIN, and nothing after may run outside a transaction.
		{name: "a first batch that does not parse stops everything", wantErr: "multiple commands", want: []int{1, 2},
			fn: func(send, commit func(string) error, _ func()) error {
				_ = send(insert(9) + `; SELECT 1`)
				_ = send(insert(10))
				return commit(insert(11))
			}},
		{name: "the caller fails between batches", wantErr: "caller", want: []int{1, 2},
			fn: func(send, _ func(string) error, _ func()) error {
				if err := send(insert(7)); err != nil {
					return err
				}
				return errors.New("caller")
			}},
		{name: "no commit is a mistake", wantErr: "without commit", want: []int{1, 2},
			fn: func(send, _ func(string) error, _ func()) error { return send(insert(8)) }},
		{name: "a read that needs no change", want: []int{1, 2},
			fn: func(send, _ func(string) error, nothingToCommit func()) error {
				if err := send(`SELECT 1`); err != nil {
					return err
				}
				nothingToCommit()
				return nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := db.Pipelined(ctx, tc.fn)
			if tc.wantErr == "" {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
				require.Regexp(t, tc.wantErr, err.Error())
			}
			require.Equal(t, tc.want, rows())
			var open int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`, nil, &open))
			require.Zero(t, open, "a transaction was left open")
		})
	}
}
