package api

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// What a manual payment's row refuses before its workflow is asked: a capture past capture_before
// is refused even while the row still says requires_capture (the workflow has not voided it yet).
func TestRefusalOfACommand(t *testing.T) {
	end := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	waiting := payment.Payment{Status: payment.StatusRequiresCapture, CaptureManual: true, CaptureBefore: end,
		AmountMinor: 5_000, Currency: "TRY"}
	captured := waiting
	captured.Status = payment.StatusSucceeded
	var exceeds *payment.CaptureExceedsError
	tests := []struct {
		name   string
		kind   payment.Command
		p      payment.Payment
		amount int64
		now    time.Time
		want   func(error) bool
	}{
		{"capture in the window", payment.CommandCapture, waiting, 5_000, end.Add(-time.Second), func(err error) bool { return err == nil }},
		{"capture of more than capturable", payment.CommandCapture, waiting, 5_001, end.Add(-time.Second), func(err error) bool { return errors.As(err, &exceeds) }},
		{"capture at capture_before", payment.CommandCapture, waiting, 5_000, end, func(err error) bool { return errors.Is(err, payment.ErrNotCapturable) }},
		{"capture after capture_before", payment.CommandCapture, waiting, 1_000, end.Add(time.Minute), func(err error) bool { return errors.Is(err, payment.ErrNotCapturable) }},
		{"capture of a captured payment", payment.CommandCapture, captured, 1_000, end.Add(-time.Hour), func(err error) bool { return errors.Is(err, payment.ErrNotCapturable) }},
		{"cancel in the window", payment.CommandCancel, waiting, 0, end.Add(-time.Second), func(err error) bool { return err == nil }},
		{"cancel of a captured payment", payment.CommandCancel, captured, 0, end.Add(-time.Hour), func(err error) bool { return errors.Is(err, payment.ErrNotCancelable) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := refusal(tt.kind, tt.p, tt.amount, tt.now)
			require.True(t, tt.want(err), "%v", err)
		})
	}
}

// capture_before is stamped by the database's clock, and the row's refusal is judged by it: an
// API host whose clock runs ahead would refuse a capture the window still allows, and the
// authorization would be voided with the merchant's capture refused.
func TestRefusalOfACaptureByTheDatabasesClock(t *testing.T) {
	for _, tt := range []struct {
		name    string
		skew    time.Duration // the database's clock ahead of this host's
		left    time.Duration // until capture_before, by the database's clock
		refused bool
	}{
		{"this host two minutes ahead, a minute left", -2 * time.Minute, time.Minute, false},
		{"this host two minutes ahead, past capture_before", -2 * time.Minute, -time.Second, true},
		{"this host two minutes behind, past capture_before", 2 * time.Minute, -time.Second, true},
		{"same clocks, a minute left", 0, time.Minute, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeStore()
			f.skew = tt.skew
			s := &Server{Options: Options{Store: f}}
			p := payment.Payment{Status: payment.StatusRequiresCapture, CaptureManual: true,
				CaptureBefore: time.Now().Add(tt.skew + tt.left), AmountMinor: 5_000, Currency: "TRY"}
			err := s.refused(context.Background(), payment.CommandCapture, p, 5_000)
			if tt.refused {
				require.ErrorIs(t, err, payment.ErrNotCapturable)
				return
			}
			require.NoError(t, err)
		})
	}
}
