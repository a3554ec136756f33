package ferry_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docFiles are README.md and every page under docs/, the text a user reads.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, pages, "no pages under docs/")
	return append([]string{"README.md"}, pages...)
}

// docText is the text of file, one of docFiles.
func docText(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	return string(b)
}

// docSection is the section of file under heading (e.g. "## Periodic
// jobs"), up to the next heading of the same or a higher level.
func docSection(t *testing.T, file, heading string) string {
	t.Helper()
	text := "\n" + docText(t, file)
	_, section, ok := strings.Cut(text, "\n"+heading+"\n")
	require.True(t, ok, "%s has no heading %q", file, heading)
	level := strings.Index(heading, " ")
	for _, l := range strings.Split(section, "\n") {
		if n := strings.IndexFunc(l, func(r rune) bool { return r != '#' }); n > 0 && n <= level && l[n] == ' ' {
			section, _, _ = strings.Cut(section, "\n"+l+"\n")
			break
		}
	}
	return section
}

// slug is GitHub's anchor for a heading: lower case, punctuation other
// than - and _ dropped, spaces turned into -.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the heading anchors of a Markdown text, outside code blocks,
// with GitHub's -1, -2 suffixes for repeated headings.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
			continue
		}
		m := regexp.MustCompile(`^#{1,6} (.+)$`).FindStringSubmatch(l)
		if inCode || m == nil {
			continue
		}
		s := slug(strings.ReplaceAll(m[1], "`", ""))
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestDocLinksResolve: every relative link in README.md and docs/*.md
// names a file of the checkout, and every #anchor is a heading of the
// page it points at (GitHub's slug), so a moved section breaks this test.
func TestDocLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, file := range docFiles(t) {
		text := docText(t, file)
		inCode := false
		for i, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "```") {
				inCode = !inCode
			}
			if inCode {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				where := file
				if path != "" {
					where = filepath.Join(filepath.Dir(file), path)
					_, err := os.Stat(where)
					require.NoError(t, err, "%s:%d: link %q: no such file", file, i+1, target)
				}
				if anchor != "" {
					require.True(t, strings.HasSuffix(where, ".md"), "%s:%d: link %q: an anchor into a file that is not Markdown", file, i+1, target)
					require.True(t, anchors(docText(t, where))[anchor], "%s:%d: link %q: %s has no heading with that anchor", file, i+1, target, where)
				}
				checked++
			}
		}
	}
	require.Greater(t, checked, 20, "the docs' links were not found")
}

// TestSlugIsGitHubs pins slug to anchors GitHub gives headings of ours.
func TestSlugIsGitHubs(t *testing.T) {
	for heading, want := range map[string]string{
		"What differs on Kafka, and why":  "what-differs-on-kafka-and-why",
		"Handlers on database/sql":        "handlers-on-databasesql",
		"Find, inspect and cancel a job":  "find-inspect-and-cancel-a-job",
		"The WAL relay":                   "the-wal-relay",
		"Use ferry in your service":       "use-ferry-in-your-service",
		"Per-type options and middleware": "per-type-options-and-middleware",
	} {
		require.Equal(t, want, slug(heading), heading)
	}
}
