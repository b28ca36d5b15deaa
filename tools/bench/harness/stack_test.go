package harness

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// A start that lost a port to another process is tried again, up to the limit; any other
// failure, or a success, ends the tries at once.
func TestAgainIfPortTaken(t *testing.T) {
	taken := errors.New("banksim exited before it answered\nlisten tcp 127.0.0.1:17018: bind: address already in use")
	tests := []struct {
		name    string
		answers []error
		calls   int
		wantErr error
	}{
		{"started", []error{nil}, 1, nil},
		{"taken once", []error{taken, nil}, 2, nil},
		{"PostgreSQL's words", []error{errors.New(`could not bind IPv4 address "127.0.0.1": Address already in use`), nil}, 2, nil},
		{"taken every time", []error{taken, taken, taken, nil}, 3, taken},
		{"another failure", []error{errors.New("migrations failed"), nil}, 1, errors.New("migrations failed")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			_, err := againIfPortTaken(3, func() (int, error) {
				calls++
				return calls, tt.answers[calls-1]
			})
			require.Equal(t, tt.calls, calls)
			require.Equal(t, tt.wantErr, err)
		})
	}
}
