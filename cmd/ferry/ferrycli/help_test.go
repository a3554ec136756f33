package ferrycli

import (
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// The version comes from the build information: the module version, the
// VCS revision (12 digits), its time and whether the tree was modified.
func TestVersionLine(t *testing.T) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	bi := &debug.BuildInfo{GoVersion: "go1.26.7", Main: debug.Module{Path: "github.com/ferrymq/ferry", Version: "v1.4.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "23bd54442998c07bf262707a50dd17a4edf5168f"},
			{Key: "vcs.time", Value: "2026-12-01T21:40:07Z"},
			{Key: "vcs.modified", Value: "true"},
		}}
	require.Equal(t, "ferry v1.4.0 revision 23bd54442998 2026-12-01T21:40:07Z modified, go1.26.7 "+platform, versionLine(bi, true))
	bi.Settings[3].Value = "false"
	require.Equal(t, "ferry v1.4.0 revision 23bd54442998 2026-12-01T21:40:07Z, go1.26.7 "+platform, versionLine(bi, true))
	bi = &debug.BuildInfo{GoVersion: "go1.26.7", Main: debug.Module{Version: "(devel)"}}
	hint := " (go run records no commit: `make build && ./ferry version` shows it, or `git log -1` in the checkout)"
	require.Equal(t, "ferry (devel) no VCS information, go1.26.7 "+platform+hint, versionLine(bi, true))
	require.Equal(t, "ferry unknown no VCS information, "+runtime.Version()+" "+platform+hint, versionLine(nil, false))
}

// wrapText never makes a line wider than asked, but for a longer word.
func TestWrapText(t *testing.T) {
	require.Equal(t, "  aaa bbb\n  ccc", wrapText("aaa bbb ccc", 2, 9))
	require.Equal(t, "  abcdefghijk\n  x", wrapText("abcdefghijk x", 2, 9))
}
