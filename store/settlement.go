package store

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// A merchant's settlement account is credited by every payment to the merchant, so its balance
// lives in shards (rows of settlement_shards), the account's balance being their sum: each
// payment credits one, and payments to one merchant seldom wait for each other's row lock.
// Holds and debits (refunds) lock every shard of the account in shard order, so they see the
// sum; a credit locks one shard and nothing after it, so neither waits for the other in a cycle.

// settlementShards is how many shards a settlement account's credits spread over: enough that
// the clients of one busy merchant seldom meet on one, few enough that a refund's lock of all
// of them stays cheap. Changing it is safe: holds and debits use whatever shards exist.
const settlementShards = 16

// shardOf is the shard a payment credits: the random tail of its UUIDv7 id, so a repeated
// step picks the same one.
func shardOf(operationID uuid.UUID) int16 {
	return int16(binary.BigEndian.Uint16(operationID[14:]) % settlementShards)
}

// holdSettlement reserves amount on a settlement account whose shards the transaction locked
// (LockShards), from them in shard order, each giving what it has available. It reports false,
// holding nothing, when their sum is too small.
func holdSettlement(ctx context.Context, q *dbsqlc.Queries, account uuid.UUID, shards []dbsqlc.LockShardsRow, amount int64) (bool, error) {
	plan, ok := planShards(shards, amount, func(s dbsqlc.LockShardsRow) int64 { return s.Balance - s.Reserved })
	if !ok {
		return false, nil
	}
	for _, p := range plan {
		n, err := q.ShardReserve(ctx, dbsqlc.ShardReserveParams{Amount: p.amount, AccountID: account, Shard: p.shard})
		if err != nil {
			return false, err
		}
		if n != 1 {
			return false, fmt.Errorf("%w: shard %d of %s refused a hold of %d it had room for", ErrInconsistent, p.shard, account, p.amount)
		}
	}
	return true, nil
}

// unholdSettlement ends a hold of amount on a settlement account: released, or, when debit, paid
// out of the account. Holds are not tied to shards, only their sum is: it takes amount from the
// shards' reserved amounts in shard order, which leaves each shard's available amount as it was.
func unholdSettlement(ctx context.Context, q *dbsqlc.Queries, account uuid.UUID, amount int64, debit bool) error {
	shards, err := q.LockShards(ctx, account)
	if err != nil {
		return err
	}
	plan, ok := planShards(shards, amount, func(s dbsqlc.LockShardsRow) int64 { return s.Reserved })
	if !ok {
		return fmt.Errorf("%w: settlement account %s holds less than %d", ErrInconsistent, account, amount)
	}
	for _, p := range plan {
		arg := dbsqlc.ShardUnreserveParams{Amount: p.amount, AccountID: account, Shard: p.shard}
		var n int64
		if debit {
			n, err = q.ShardCapture(ctx, dbsqlc.ShardCaptureParams(arg))
		} else {
			n, err = q.ShardUnreserve(ctx, arg)
		}
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("%w: shard %d of %s holds less than %d", ErrInconsistent, p.shard, account, p.amount)
		}
	}
	return nil
}

type shardTake struct {
	shard  int16
	amount int64
}

// planShards takes amount from the shards in order, from each what room gives it; false when
// they have too little.
func planShards(shards []dbsqlc.LockShardsRow, amount int64, room func(dbsqlc.LockShardsRow) int64) ([]shardTake, bool) {
	var plan []shardTake
	for _, s := range shards {
		if amount == 0 {
			break
		}
		if take := min(room(s), amount); take > 0 {
			plan = append(plan, shardTake{s.Shard, take})
			amount -= take
		}
	}
	return plan, amount == 0
}
