package ferry_test

import (
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
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

	section := docSection(t, "README.md", "## Use ferry in your service")
	require.Contains(t, section, "```go\n"+code+"\n```", "README's code differs from example_service_test.go; copy it over")
}

// TestREADMEShowsTheObservabilityExample keeps docs/library.md's "Metrics and
// logs in your service" code identical to instrument in
// example_observability_test.go, which Example_instrument runs.
func TestREADMEShowsTheObservabilityExample(t *testing.T) {
	src, err := os.ReadFile("example_observability_test.go")
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(src), "// README: observability begin")
	require.True(t, ok, "the README: observability begin marker is missing")
	_, after, _ = strings.Cut(after, "\n")
	code, _, ok := strings.Cut(after, "// README: observability end")
	require.True(t, ok, "the README: observability end marker is missing")
	code = strings.TrimSpace(code)

	section := docSection(t, "docs/library.md", "## Metrics and logs in your service")
	require.Contains(t, section, "```go\n"+code+"\n```", "docs/library.md's code differs from instrument in example_observability_test.go; copy it over")
}

// selectionFlags are the flags of the one-shot commands (dlq, outbox,
// replay) that pick the messages or rows the command acts on, or confirm
// it: by the rule in docs/flags.md they read no environment variable, so that a
// variable left in the environment never picks, confirms or deletes a
// message. Their other flags (--queue, --exchange, the broker's and the
// database's) read the FERRY_<NAME> of the role commands.
var selectionFlags = map[string]bool{
	"id": true, "all": true, "yes": true, "dry-run": true, "since": true,
	"limit": true, "error-contains": true, "app-id": true, "state": true, "type": true,
}

// roleCommands are the commands whose flags read FERRY_<NAME>; demo and
// bench read FERRY_DEMO_<NAME> and FERRY_BENCH_<NAME> for flags of their
// own.
var roleCommands = []string{"migrate", "api", "relay", "worker", "run"}

// visibleCommands returns every command of the ferry CLI that its help
// lists, by its full name ("dlq list"), subcommands included.
func visibleCommands() map[string]*cli.Command {
	out := map[string]*cli.Command{}
	var walk func(prefix string, cmds []*cli.Command)
	walk = func(prefix string, cmds []*cli.Command) {
		for _, c := range cmds {
			if c.Hidden {
				continue
			}
			name := strings.TrimSpace(prefix + " " + c.Name)
			out[name] = c
			walk(name, c.Subcommands)
		}
	}
	a := ferrycli.NewApp(io.Discard, io.Discard)
	a.Setup() // adds the help command, as Run does
	walk("", a.Commands)
	return out
}

// envName is FERRY_ plus name in upper case with _ for -.
func envName(prefix, name string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// wantEnv is the environment variable the README's rule gives flag name
// of command cmd, "" for none.
func wantEnv(cmds map[string]*cli.Command, cmd, name string) string {
	top, _, _ := strings.Cut(cmd, " ")
	if (top == "dlq" || top == "outbox" || top == "replay" || top == "jobs") && selectionFlags[name] {
		return ""
	}
	for _, r := range roleCommands {
		for _, f := range cmds[r].Flags {
			if slices.Contains(f.Names(), name) {
				return envName("FERRY_", name)
			}
		}
	}
	switch top {
	case "demo":
		return envName("FERRY_DEMO_", name)
	case "bench":
		return envName("FERRY_BENCH_", name)
	}
	return envName("FERRY_", name)
}

// TestEveryFlagReadsTheVariableTheREADMESays checks the rule of docs/flags.md for
// environment variables on every flag of every command the help lists,
// and that every variable docs/flags.md's flag table names is the one the
// flag reads.
func TestEveryFlagReadsTheVariableTheREADMESays(t *testing.T) {
	cmds := visibleCommands()
	envOf := map[string]string{} // flag name -> its variable, on the role commands
	for name, c := range cmds {
		for _, f := range c.Flags {
			flag := f.Names()[0]
			ef, ok := f.(interface{ GetEnvVars() []string })
			require.True(t, ok, "ferry %s --%s: flag type %T", name, flag, f)
			got := ef.GetEnvVars()
			want := wantEnv(cmds, name, flag)
			if want == "" {
				require.Empty(t, got, "ferry %s --%s chooses what the command acts on: it reads no variable", name, flag)
				continue
			}
			require.Equal(t, []string{want}, got, "ferry %s --%s", name, flag)
			envOf[flag] = want
		}
	}

	flags := docText(t, "docs/flags.md")
	for _, s := range []string{"FERRY_DEMO_", "FERRY_BENCH_", "`--yes`", "`--id`"} {
		require.True(t, strings.Contains(flags, s), "docs/flags.md states the rule for %s", s)
	}
	rows := 0
	for _, line := range strings.Split(flags, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.Contains(cells[1], "`--") {
			continue
		}
		rows++
		names := regexp.MustCompile("`--([a-z0-9-]+)`").FindAllStringSubmatch(cells[1], -1)
		envs := regexp.MustCompile("`(FERRY_[A-Z0-9_]+)`").FindAllStringSubmatch(cells[2], -1)
		for i, n := range names {
			env, ok := envOf[n[1]]
			require.True(t, ok, "docs/flags.md's flag table lists --%s, which no command has", n[1])
			if len(envs) == len(names) {
				require.Equal(t, env, envs[i][1], "docs/flags.md's flag table: the variable of --%s", n[1])
			}
		}
	}
	require.Greater(t, rows, 20, "docs/flags.md's flag table was not found")
}

// TestDLQExchangeHelpNamesEveryBroker: the help of the dlq commands'
// --exchange says what it does on every broker the CLI wires.
func TestDLQExchangeHelpNamesEveryBroker(t *testing.T) {
	cmds := visibleCommands()
	for _, name := range []string{"dlq list", "dlq replay", "dlq purge"} {
		var usage string
		for _, f := range cmds[name].Flags {
			if sf, ok := f.(*cli.StringFlag); ok && sf.Name == "exchange" {
				usage = strings.ToLower(sf.Usage)
			}
		}
		require.NotEmpty(t, usage, "ferry %s has --exchange", name)
		for _, b := range ferrycli.BrokerNames() {
			require.Contains(t, usage, b, "ferry %s --exchange's help says what it does on %s", name, b)
		}
	}
}

// TestREADMECommandsExist parses every `ferry ...` command README.md and
// docs/*.md show, in code blocks and in inline code: each command and subcommand
// exists (a|b lists alternatives) and each --flag is one of its flags.
func TestREADMECommandsExist(t *testing.T) {
	cmds := visibleCommands()
	var lines []string
	inCode := false
	var text string
	for _, file := range docFiles(t) {
		text += docText(t, file) + "\n"
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			lines = append(lines, line)
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(line, -1) {
			lines = append(lines, m[1])
		}
	}
	checked := 0
	for _, line := range lines {
		line, _, _ = strings.Cut(line, "#")
		fields := strings.Fields(line)
		if len(fields) > 2 && fields[0] == "go" && fields[1] == "run" && fields[2] == "./cmd/ferry" {
			fields = append([]string{"ferry"}, fields[3:]...)
		}
		if len(fields) < 2 || fields[0] != "ferry" || strings.HasPrefix(fields[1], "<") || fields[1] == "..." {
			continue
		}
		checkCommandLine(t, cmds, line, fields[1:])
		checked++
	}
	require.Greater(t, checked, 20, "the README's ferry commands were not found")
}

// checkCommandLine checks one README command line, args after "ferry".
func checkCommandLine(t *testing.T, cmds map[string]*cli.Command, line string, args []string) {
	t.Helper()
	paths := []string{""}
	i := 0
	for ; i < len(args) && !strings.ContainsAny(args[i][:1], "-[(<"); i++ {
		var next []string
		for _, p := range paths {
			for _, alt := range strings.Split(args[i], "|") {
				name := strings.TrimSpace(p + " " + alt)
				if _, ok := cmds[name]; ok {
					next = append(next, name)
				}
			}
		}
		if len(next) == 0 {
			if paths[0] != "" && len(cmds[paths[0]].Subcommands) == 0 {
				break // an argument, not a command
			}
			t.Errorf("README: %q: no command %q", line, strings.TrimSpace(paths[0]+" "+args[i]))
			return
		}
		paths = next
	}
	for _, p := range paths {
		require.NotEmpty(t, p, "README: %q", line)
		for _, a := range args[i:] {
			a = strings.Trim(a, "[()]")
			name, ok := strings.CutPrefix(a, "--")
			if !ok || name == "" {
				continue
			}
			name, _, _ = strings.Cut(name, "=")
			if name == "help" || name == "version" {
				continue
			}
			found := false
			for _, f := range cmds[p].Flags {
				found = found || slices.Contains(f.Names(), name)
			}
			require.True(t, found, "README: %q: ferry %s has no flag --%s", line, p, name)
		}
	}
}

// TestREADMEShowsThePeriodicAndSQLExamples: docs/library.md's code for
// periodic jobs and database/sql handlers is the code that
// Example_periodic and Example_sqlHandler run.
func TestREADMEShowsThePeriodicAndSQLExamples(t *testing.T) {
	library := docText(t, "docs/library.md")
	for file, tag := range map[string]string{"example_periodic_test.go": "periodic", "example_sql_test.go": "database/sql"} {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		begin, end := "// README "+tag+": begin", "// README "+tag+": end"
		_, rest, ok := strings.Cut(string(src), begin)
		require.True(t, ok, "%s: no %q", file, begin)
		code, _, ok := strings.Cut(rest, end)
		require.True(t, ok, "%s: no %q", file, end)
		require.Contains(t, library, "```go\n"+strings.Trim(code, "\n")+"\n```", "docs/library.md's code differs from %s; copy it over", file)
	}
}

// TestLibraryShowsTheWorkflowExample keeps docs/library.md's "Workflows"
// code identical to fulfil in example_workflow_test.go, which
// ExampleEnqueueWorkflow runs.
func TestLibraryShowsTheWorkflowExample(t *testing.T) {
	src, err := os.ReadFile("example_workflow_test.go")
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(src), "// README: workflow begin")
	require.True(t, ok, "the README: workflow begin marker is missing")
	_, after, _ = strings.Cut(after, "\n")
	code, _, ok := strings.Cut(after, "// README: workflow end")
	require.True(t, ok, "the README: workflow end marker is missing")
	code = strings.TrimSpace(code)

	section := docSection(t, "docs/library.md", "## Workflows")
	require.Contains(t, section, "```go\n"+code+"\n```", "docs/library.md's code differs from fulfil in example_workflow_test.go; copy it over")
}
