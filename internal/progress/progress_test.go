package progress

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoTerminalDrawsNothing: a buffer, a pipe and /dev/null are no
// terminal, and a bar on them writes nothing at all.
func TestNoTerminalDrawsNothing(t *testing.T) {
	var buf bytes.Buffer
	b := New(&buf, "x", 10)
	b.Set(5)
	b.SetTotal(20)
	b.Describe("y")
	b.Finish(20)
	require.Zero(t, buf.Len())

	r, w, err := os.Pipe()
	require.NoError(t, err)
	require.False(t, IsTerminal(w))
	b = New(w, "x", 10)
	b.Set(10)
	b.Finish(10)
	require.NoError(t, w.Close())
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Empty(t, out)

	null, err := os.Open(os.DevNull)
	require.NoError(t, err)
	defer null.Close()
	require.False(t, IsTerminal(null), "a character device that is not a terminal")

	var nilBar *Bar
	nilBar.Set(1) // a nil bar is a bar that draws nothing
	nilBar.Finish(1)
}
