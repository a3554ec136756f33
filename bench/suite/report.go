package suite

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// write writes results.json, results.md and the charts to dir.
func write(dir string, res *Results) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: results.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	charts, err := writeCharts(dir, res)
	if err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "results.md"))
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer f.Close()
	WriteMarkdown(f, res, charts)
	return f.Close()
}

// formatValue prints a figure with the precision its size calls for:
// whole numbers as they are, at least 3 significant digits below 100
// (0.49 stays 0.490, 0.0039 is 0.00390), none from 100 on.
func formatValue(v float64) string {
	switch a := math.Abs(v); {
	case v == math.Trunc(v) && a < 1e15:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	case a >= 0.001:
		return strconv.FormatFloat(v, 'f', 2-int(math.Floor(math.Log10(a))), 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// FormatSeconds prints a duration given in seconds with a unit and the
// precision its size calls for: "490 ms" rather than "0 s", "3.5 ms",
// "2.08 s", "15.7 s", "319 s". ferry bench's messages and notes use it.
func FormatSeconds(sec float64) string {
	switch a := math.Abs(sec); {
	case sec == 0:
		return "0 s"
	case a < 0.01:
		return fmt.Sprintf("%.1f ms", sec*1000)
	case a < 1:
		return fmt.Sprintf("%.0f ms", sec*1000)
	case a < 10:
		return fmt.Sprintf("%.2f s", sec)
	case a < 100:
		return fmt.Sprintf("%.1f s", sec)
	default:
		return fmt.Sprintf("%.0f s", sec)
	}
}

// WriteMarkdown writes the results as Markdown: the machine and versions,
// then one table per scenario (a row per broker and variant, a column per
// figure) followed by its chart when charts names one.
func WriteMarkdown(w io.Writer, res *Results, charts map[string]string) {
	fmt.Fprintf(w, "# ferry bench results\n\n")
	if res.Command != "" {
		fmt.Fprintf(w, "Command: `%s`, started %s, took %s.\n\n", res.Command, res.Started.Format("2006-01-02 15:04 UTC"), FormatSeconds(res.Seconds))
	}
	h := res.Host
	fmt.Fprintf(w, "Machine: %s, %d cores, %.1f GiB, %s, %s, load average %s at the start.\n\n", h.CPU, h.Cores, float64(h.MemoryBytes)/(1<<30), h.Kernel, h.Go, h.LoadAverage)
	fmt.Fprintf(w, "Servers: %s.\n\n", joinMap(res.Servers))
	fmt.Fprintf(w, "Clients: %s.\n\n", joinMap(res.Clients))
	fmt.Fprintf(w, "Settings: %s.\n", joinMap(stringify(res.Settings)))
	for _, sc := range Scenarios {
		var rows []Result
		for _, r := range res.Results {
			if r.Scenario == sc {
				rows = append(rows, r)
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n## %s\n\n", sc)
		var cols []string
		units := map[string]string{}
		for _, r := range rows {
			for _, f := range r.Figures {
				if !slices.Contains(cols, f.Name) {
					cols = append(cols, f.Name)
					units[f.Name] = f.Unit
				}
			}
		}
		fmt.Fprintf(w, "| broker | relay | variant | status |")
		for _, c := range cols {
			if units[c] != "" {
				fmt.Fprintf(w, " %s (%s) |", c, units[c])
			} else {
				fmt.Fprintf(w, " %s |", c)
			}
		}
		fmt.Fprintf(w, " note |\n|---|---|---|---|%s---|\n", strings.Repeat("---:|", len(cols)))
		for _, r := range rows {
			fmt.Fprintf(w, "| %s | %s | %s | %s |", r.Broker, r.RelayMode, r.Variant, r.Status)
			for _, c := range cols {
				if v, ok := r.figure(c); ok {
					fmt.Fprintf(w, " %s |", formatValue(v))
				} else {
					fmt.Fprintf(w, " |")
				}
			}
			fmt.Fprintf(w, " %s |\n", strings.ReplaceAll(r.Note, "|", "/"))
		}
		if c, ok := charts[sc]; ok {
			fmt.Fprintf(w, "\n![%s](%s)\n", sc, c)
		}
		if c, ok := charts[PeerCPUChart]; ok && sc == ScenarioPeer {
			fmt.Fprintf(w, "\n![%s](%s)\n", PeerCPUChart, c)
		}
	}
	var ops strings.Builder
	writeOps(&ops, res)
	fmt.Fprint(w, ops.String())
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func stringify(m map[string]any) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}

func joinMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + " " + m[k]
	}
	return strings.Join(parts, ", ")
}
