-- The capture or cancel a manual payment's workflow took is marked in the transaction that moves
-- its money: a key whose request never reached the workflow learns, when retried, that another
-- command decided the payment, and is refused instead of answered with that one's effect.
-- +goose Up
ALTER TABLE payment_commands ADD COLUMN IF NOT EXISTS taken boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE payment_commands DROP COLUMN IF EXISTS taken;
