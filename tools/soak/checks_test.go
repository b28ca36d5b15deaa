package soak

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A kasa verify that fails without a word is still a violation, named by its error, never an
// empty example.
func TestCheckVerifyNamesASilentFailure(t *testing.T) {
	s := &stack{dir: t.TempDir(), o: Options{Binary: "/bin/false"}}
	c := s.checkVerify(context.Background())
	require.False(t, c.OK)
	require.Equal(t, 1, c.Violations)
	require.Len(t, c.Examples, 1)
	require.Contains(t, c.Examples[0], "exit status 1")
}
