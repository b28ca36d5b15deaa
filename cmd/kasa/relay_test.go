package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// The relay waits for a broker it cannot dial, and gives up at once on one that refuses its
// settings: no wait mends credentials or TLS.
func TestNATSUnreachable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		wait bool
	}{
		{"connection refused", fmt.Errorf("nats nats://127.0.0.1:4222: %w", nats.ErrNoServers), true},
		{"no such host", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "nats"}}, true},
		{"authorization", fmt.Errorf("nats nats://127.0.0.1:4222: %w", nats.ErrAuthorization), false},
		{"TLS alert", &net.OpError{Op: "remote error", Err: tls.AlertError(42)}, false},
		{"anything else", errors.New("nats: invalid connection"), false},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.wait, natsUnreachable(tc.err)) })
	}
}
