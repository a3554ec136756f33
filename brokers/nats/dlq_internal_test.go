package nats

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDecodeName: decodeName inverts encodeName, so the DLQ lookup can
// name the exchanges it searched.
func TestDecodeName(t *testing.T) {
	for _, s := range []string{"a.b", "a_b", "a-b", "a__b", "a._b", "a_.b", "a-u", "a_", "a.", "a-hb", "a-.b", "notifications", "x-h-u_.y"} {
		require.Equal(t, s, decodeName(encodeName(s)), "encoded %q", encodeName(s))
	}
}
