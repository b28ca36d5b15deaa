package main

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
)

// A worker waits for a Temporal that is not there yet, and gives up at once on settings no wait
// mends: TLS against a plain server, a certificate the server refuses or cannot verify, or a
// client certificate the server requires and was not given.
func TestTemporalWaitReason(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		reason string // "": no waiting
	}{
		{"namespace not found", serviceerror.NewNamespaceNotFound("default"), "namespace not found"},
		{"connection refused", serviceerror.NewUnavailable("connection error: dial tcp 127.0.0.1:7233: connect: connection refused"), "unreachable"},
		{"deadline", context.DeadlineExceeded, "unreachable"},
		{"TLS to a plain server", serviceerror.NewUnavailable(`connection error: desc = "transport: authentication handshake failed: tls: first record does not look like a TLS handshake"`), ""},
		{"client certificate required", serviceerror.NewUnavailable(`connection error: desc = "error reading server preface: remote error: tls: certificate required"`), ""},
		{"unknown authority", serviceerror.NewUnavailable(`connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"`), ""},
		{"bad certificate", serviceerror.NewUnavailable(`connection error: desc = "error reading server preface: remote error: tls: bad certificate"`), ""},
		{"reset in the handshake (a restarting server)", serviceerror.NewUnavailable(`connection error: desc = "transport: authentication handshake failed: read tcp 10.0.0.2:51234->10.0.0.3:7233: read: connection reset by peer"`), "unreachable"},
		{"EOF in the handshake", serviceerror.NewUnavailable(`connection error: desc = "transport: authentication handshake failed: EOF"`), "unreachable"},
		{"anything else", errors.New("permission denied"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason, wait := temporalWaitReason(tc.err)
			require.Equal(t, tc.reason != "", wait)
			require.Equal(t, tc.reason, reason)
		})
	}
}
