package ferry_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestREADMEShowsTheExample keeps the README's "Use ferry in your service"
// code identical to example_service_test.go, which Example runs on every
// broker: the README cannot show code that does not run.
func TestREADMEShowsTheExample(t *testing.T) {
	src, err := os.ReadFile("example_service_test.go")
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(src), "// README: begin")
	require.True(t, ok, "the README: begin marker is missing")
	_, after, _ = strings.Cut(after, "\n")
	code, _, ok := strings.Cut(after, "// README: end")
	require.True(t, ok, "the README: end marker is missing")
	code = strings.TrimSpace(code)

	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## Use ferry in your service\n")
	require.True(t, ok, "README has no section \"Use ferry in your service\"")
	section, _, _ = strings.Cut(section, "\n## ")
	require.Contains(t, section, "```go\n"+code+"\n```", "README's code differs from example_service_test.go; copy it over")
}
