package ferrycli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/urfave/cli/v2"
)

// HelpWidth is the width in columns that no line of ferry's help exceeds
// (but for a single word longer than that, which is never cut): usage
// texts and descriptions are wrapped at it, and every flag is printed as
// its names on one line and its usage, indented, on the next.
const HelpWidth = 100

// helpFlagIndent and helpUsageIndent are the columns where a flag's names
// and its usage text start.
const (
	helpFlagIndent  = 3
	helpUsageIndent = 7
)

func init() {
	// urfave/cli's documented way to wrap the help (its HelpPrinterCustom
	// takes a "wrapAt" function) and to add template functions: ferry's
	// templates print the flags with flagHelp instead of urfave/cli's one
	// line per flag, whose tab-aligned columns widen every line to the
	// longest flag name (a repeatable flag is shown twice).
	cli.HelpPrinter = func(w io.Writer, templ string, data any) {
		cli.HelpPrinterCustom(w, templ, data, map[string]any{
			"wrapAt":   func() int { return HelpWidth },
			"flagHelp": flagHelp,
		})
	}
	cli.VersionPrinter = func(c *cli.Context) { fmt.Fprintln(c.App.Writer, VersionLine()) }
}

// appHelpTemplate is `ferry --help` and `ferry help`.
const appHelpTemplate = `NAME:
   {{template "helpNameTemplate" .}}

USAGE:
   {{.HelpName}} command [command options]{{if .Description}}

DESCRIPTION:
   {{template "descriptionTemplate" .}}{{end}}{{if .VisibleCommands}}

COMMANDS:{{template "visibleCommandTemplate" .}}{{end}}{{if .VisibleFlags}}

GLOBAL OPTIONS:
{{flagHelp .VisibleFlags}}{{end}}
`

// commandHelpTemplate is `ferry COMMAND --help` of a command without
// subcommands.
const commandHelpTemplate = `NAME:
   {{template "helpNameTemplate" .}}

USAGE:
   {{template "usageTemplate" .}}{{if .Description}}

DESCRIPTION:
   {{template "descriptionTemplate" .}}{{end}}{{if .VisibleFlags}}

OPTIONS:
{{flagHelp .VisibleFlags}}{{end}}
`

// subcommandHelpTemplate is `ferry COMMAND --help` of a command with
// subcommands (dlq, outbox).
const subcommandHelpTemplate = `NAME:
   {{template "helpNameTemplate" .}}

USAGE:
   {{.HelpName}} command [command options]{{if .Description}}

DESCRIPTION:
   {{template "descriptionTemplate" .}}{{end}}{{if .VisibleCommands}}

COMMANDS:{{template "visibleCommandTemplate" .}}{{end}}{{if .VisibleFlags}}

OPTIONS:
{{flagHelp .VisibleFlags}}{{end}}
`

// useHelpTemplates sets ferry's help templates on cmds and their
// subcommands.
func useHelpTemplates(cmds []*cli.Command) {
	for _, c := range cmds {
		if len(c.Subcommands) > 0 {
			c.CustomHelpTemplate = subcommandHelpTemplate
		} else {
			c.CustomHelpTemplate = commandHelpTemplate
		}
		useHelpTemplates(c.Subcommands)
	}
}

// flagHelp renders flags for the help, grouped by their Category in the
// order the command lists them (flags without a category first): per
// flag, its names, placeholder and environment variable on one line,
// then its usage and default wrapped at HelpWidth.
func flagHelp(flags []cli.Flag) string {
	var order []string
	groups := map[string][]cli.Flag{}
	for _, f := range flags {
		cat := ""
		if cf, ok := f.(cli.CategorizableFlag); ok {
			cat = cf.GetCategory()
		}
		if _, seen := groups[cat]; !seen {
			order = append(order, cat)
		}
		groups[cat] = append(groups[cat], f)
	}
	// Uncategorized flags (a subcommand's own, --help) come first.
	for i, cat := range order {
		if cat == "" {
			order = append([]string{""}, append(order[:i:i], order[i+1:]...)...)
			break
		}
	}
	var b strings.Builder
	pad := strings.Repeat(" ", helpFlagIndent)
	for i, cat := range order {
		if i > 0 {
			b.WriteString("\n")
		}
		if cat != "" {
			b.WriteString(pad + cat + ":\n")
		}
		for _, f := range groups[cat] {
			b.WriteString(pad + flagTitle(f) + "\n")
			if u := flagUsage(f); u != "" {
				b.WriteString(wrapText(u, helpUsageIndent, HelpWidth) + "\n")
			}
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

// flagTitle is "--name, -n value (repeatable)  [$ENV]".
func flagTitle(f cli.Flag) string {
	var names []string
	for _, n := range f.Names() {
		if len(n) == 1 {
			names = append(names, "-"+n)
		} else {
			names = append(names, "--"+n)
		}
	}
	s := strings.Join(names, ", ")
	df, ok := f.(cli.DocGenerationFlag)
	if !ok {
		return s
	}
	if df.TakesValue() {
		s += " value"
	}
	if sf, ok := f.(cli.DocGenerationSliceFlag); ok && sf.IsSliceFlag() {
		s += " (repeatable)"
	}
	if envs := df.GetEnvVars(); len(envs) > 0 {
		s += "  [$" + strings.Join(envs, ", $") + "]"
	}
	return s
}

// flagUsage is f's usage followed by "(default: ...)" when it has one.
func flagUsage(f cli.Flag) string {
	df, ok := f.(cli.DocGenerationFlag)
	if !ok {
		return ""
	}
	u := df.GetUsage()
	def := df.GetDefaultText()
	if _, isBool := f.(*cli.BoolFlag); isBool && def == "false" {
		def = ""
	}
	if def != "" {
		u += " (default: " + def + ")"
	}
	return strings.TrimSpace(u)
}

// wrapText wraps s into lines of at most width columns, each indented by
// indent spaces; a word longer than a line stays whole.
func wrapText(s string, indent, width int) string {
	pad := strings.Repeat(" ", indent)
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = pad + w
		case len([]rune(line))+1+len([]rune(w)) > width:
			lines = append(lines, line)
			line = pad + w
		default:
			line += " " + w
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// VersionLine is what `ferry version` and `ferry --version` print, from the
// binary's build information (runtime/debug.ReadBuildInfo): the main
// module's version ("(devel)" for a build from a checkout), the VCS
// revision, its commit time (not the build time) and whether the work
// tree had changes (vcs.revision, vcs.time, vcs.modified, recorded by go
// build in a Git checkout), the Go version and the platform; without a
// recorded commit (go run) it says how to get one. For example:
//
//	ferry (devel) revision 23bd544c0a1e 2026-12-01T21:40:07Z modified, go1.26.7 linux/amd64
func VersionLine() string {
	return versionLine(debug.ReadBuildInfo())
}

// versionLine formats bi (ok: bi is the binary's build information).
func versionLine(bi *debug.BuildInfo, ok bool) string {
	version, vcs := "unknown", noVCS
	goVersion := runtime.Version()
	if ok && bi != nil {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		var rev, at, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			vcs = "revision " + rev
			if at != "" {
				vcs += " " + at
			}
			if modified == "true" {
				vcs += " modified"
			}
		}
	}
	line := fmt.Sprintf("ferry %s %s, %s %s/%s", version, vcs, goVersion, runtime.GOOS, runtime.GOARCH)
	if vcs == noVCS {
		line += noVCSHint
	}
	return line
}

// noVCS and noVCSHint are what versionLine says of a binary without a
// recorded commit: go run records none (go build does, in a Git checkout).
const (
	noVCS     = "no VCS information"
	noVCSHint = " (go run records no commit: `make build && ./ferry version` shows it, or `git log -1` in the checkout)"
)

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print ferry's version (module version, VCS revision and its commit time, Go version)",
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("version: unexpected argument %q", c.Args().First())
			}
			fmt.Fprintln(c.App.Writer, VersionLine())
			return nil
		},
	}
}
