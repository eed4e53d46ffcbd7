package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rowsFor judges the goals against one fixture directory.
func rowsFor(t *testing.T, dir string) map[string]row {
	t.Helper()
	r, err := loadResults(dir)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]row{}
	for _, g := range goals(r) {
		if _, dup := byID[g.ID]; dup {
			t.Fatalf("two goals have the ID %q", g.ID)
		}
		byID[g.ID] = g
	}
	return byID
}

// TestGoalVerdicts checks each goal's verdict, figure and source over the
// fixtures: testdata/met holds figures within (or exactly at) every bound,
// testdata/missed figures just past them, testdata/partial missing and
// unreadable files, testdata/pairs a throughput.json of several pairs
// per case, testdata/idle one with an idle window,
// testdata/older-exclude a reaction-exclude.json older
// than reaction.json and isolation in a reaction-isolation.json.
func TestGoalVerdicts(t *testing.T) {
	tests := []struct {
		name     string
		dir      string
		id       string
		want     verdict
		measured string // a substring the Measured text must hold
		source   string // the Source text, exactly
	}{
		// Met, including figures exactly at an inclusive bound.
		{"bulk ratio above bound", "met", "bulk-16", met, "0.95", throughputFile},
		{"bulk ratio at bound, from the cases array", "met", "bulk-64", met, "0.90", throughputFile},
		{"bulk row names its case's backlog, 16 tablets", "backlog", "bulk-16", met, "backlog 2,400,000 records", throughputFile},
		{"bulk row names its case's backlog, 64 tablets", "backlog", "bulk-64", met, "backlog 4,800,000 records", throughputFile},
		{"live CPU from the two per-1k figures", "met", "live-cpu", met, "2.50 × bulk", throughputFile},
		{"live lag ignores the bulk phase's 999", "met", "live-lag", met, "0.500 s", throughputFile},
		{"newer reaction-exclude.json wins for exclude 64, median from the file", "met", "exclude-64", met, "2.000 s (median 1.500 s; 4 trials)", reactionExcludeFile},
		{"newer reaction-exclude.json wins for exclude 256", "met", "exclude-256", met, "1.800 s", reactionExcludeFile},
		{"mismatch p99 at bound", "met", "mismatch", met, "1.000 s", reactionFile},
		{"down p99 from samples directly under the key", "met", "down", met, "1.900 s", reactionFile},
		{"isolation, old shape with one ratio", "met", "isolation", met, "0.970 (one pair", reactionFile},
		{"isolation stall absent from the old shape", "met", "isolation-stall", notMeasured, "no `isolation`", reactionFile + ", " + reactionExcludeFile},
		{"scale judged on the peak RSS, at bound", "met", "scale", met, "1,024.0 KiB", scaleFile},
		{"getchanges at bound", "met", "getchanges", met, "200,000 records/s", getChangesFile},
		{"pgsource at bound", "met", "pgsource", met, "0.80", pgSourceFile},
		{"pgsink above bound", "met", "pgsink", met, "0.93", pgSinkFile},
		{"vitess at bound, with the pairs' range, rates, backlog and memory", "met", "vitess", met,
			"0.80 (median of 3 pairs, which ranged from 0.44 to 0.97; 80,842 against 101,052 records/s; backlog 799,988 records; steady state 0.85; worker peak RSS 62.2 MiB)", vitessFile},
		{"soak passed", "met", "soak", met, "pass", soakFile},

		// Missed by a hair: never shown as a pass.
		{"bulk ratio 0.899 against 0.9", "missed", "bulk-16", notMet, "0.899 (", throughputFile},
		{"bulk ratio computed from rates, 0.8999999", "missed", "bulk-64", notMet, "0.8999999", throughputFile},
		{"live CPU 3.00001 × though the file's rounded ratio says 3", "missed", "live-cpu", notMet, "3.00001 × bulk", throughputFile},
		{"live lag just over 1 s", "missed", "live-lag", notMet, "1.0001 s", throughputFile},
		{"mismatch p99 from the samples, not the file's p99", "missed", "mismatch", notMet, "1.001 s", reactionFile},
		{"down p99 without samples", "missed", "down", notMet, "2.0004 s", reactionFile},
		{"exclude 64 just over 2 s", "missed", "exclude-64", notMet, "2.001 s", reactionFile},
		{"exclude 256 in neither file", "missed", "exclude-256", notMeasured, "no `" + keyExclude256 + "`", reactionFile + ", " + reactionExcludeFile + " (missing)"},
		{"isolation, new shape judged on ratio_min not the median", "missed", "isolation", notMet, "0.949 (worst of 3 pairs; median 0.990; max 1.000; spread 0.051)", reactionFile},
		{"isolation stall equal to half the retention", "missed", "isolation-stall", notMet, "1,800.000 s", reactionFile},
		{"scale just over 1 MiB per tablet", "missed", "scale", notMet, "1,024.5 KiB", scaleFile},
		{"getchanges against our bound, not the file's", "missed", "getchanges", notMet, "199,999.9 records/s", getChangesFile},
		{"pgsource against our bound, not the file's", "missed", "pgsource", notMet, "0.7999", pgSourceFile},
		{"pgsink without its ratio field", "missed", "pgsink", notMeasured, "no ratio", pgSinkFile},
		{"vitess against our bound, not the file's", "missed", "vitess", notMet, "0.7999", vitessFile},
		{"soak failed", "missed", "soak", notMet, "fail", soakFile},

		// Missing and unreadable files and fields.
		{"bulk ratio computed when the field is absent", "partial", "bulk-16", met, "0.91", throughputFile},
		{"no 64-tablet case", "partial", "bulk-64", notMeasured, "no 64-tablet case", throughputFile},
		{"no live phase", "partial", "live-cpu", notMeasured, "no bulk and live CPU", throughputFile},
		{"no reaction files", "partial", "exclude-64", notMeasured, "no `", reactionFile + " (missing), " + reactionExcludeFile + " (missing)"},
		{"no isolation without reaction files", "partial", "isolation", notMeasured, "no `isolation`", reactionFile + " (missing), " + reactionExcludeFile + " (missing)"},
		{"unreadable scale.json", "partial", "scale", notMeasured, "scale.json unreadable", scaleFile + " (unreadable)"},
		{"missing getchanges.json", "partial", "getchanges", notMeasured, "getchanges.json not found", getChangesFile + " (missing)"},
		{"missing soak.json", "partial", "soak", notMeasured, "soak.json not found", soakFile + " (missing)"},
		{"missing vitess.json", "partial", "vitess", notMeasured, "vitess.json not found", vitessFile + " (missing)"},

		// bench/throughput's pairs: the median pair judged, the range said.
		{"bulk ratio of several pairs says the pairs' range", "pairs", "bulk-64", met, "median of 3 pairs, which ranged from 0.88 to 0.95", throughputFile},
		{"live CPU over the pairs' median bulk figure, not the median pair's", "pairs", "live-cpu", met, "2.50 × bulk", throughputFile},
		// The idle window: what caught-up tablets cost, beside the live goal.
		{"live CPU row says what idle tablets cost", "idle", "live-cpu", met, "idle: 16 tablets caught up cost the worker 1.6 % of a core (3.2 reads/s)", throughputFile},

		// reaction.json newer than reaction-exclude.json keeps its case.
		{"newer reaction.json wins, median of an even count as bench/reaction takes it", "older-exclude", "exclude-64", met, "1.500 s (median 1.500 s; 2 trials)", reactionFile},
		{"case only in reaction-exclude.json, samples directly under the key", "older-exclude", "exclude-256", met, "1.900 s", reactionExcludeFile},
		{"isolation from a newer reaction-isolation.json over reaction.json's", "older-exclude", "isolation", met, "0.960 (worst of 2 pairs", "reaction-isolation.json"},
		{"stall from reaction-isolation.json", "older-exclude", "isolation-stall", met, "1.400 s", "reaction-isolation.json"},
	}
	cache := map[string]map[string]row{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, ok := cache[tt.dir]
			if !ok {
				rows = rowsFor(t, filepath.Join("testdata", tt.dir))
				cache[tt.dir] = rows
			}
			got, ok := rows[tt.id]
			if !ok {
				t.Fatalf("no goal %q", tt.id)
			}
			if got.Verdict != tt.want {
				t.Errorf("verdict %v, want %v (measured %q)", got.Verdict, tt.want, got.Measured)
			}
			if !strings.Contains(got.Measured, tt.measured) {
				t.Errorf("measured %q, want it to contain %q", got.Measured, tt.measured)
			}
			if got.Source != tt.source {
				t.Errorf("source %q, want %q", got.Source, tt.source)
			}
		})
	}
}

// TestNoResultsAtAll: an empty directory judges nothing, and says so for
// every goal rather than failing.
func TestNoResultsAtAll(t *testing.T) {
	rows := rowsFor(t, t.TempDir())
	if len(rows) == 0 {
		t.Fatal("no goals listed")
	}
	for id, g := range rows {
		if g.Verdict != notMeasured {
			t.Errorf("%s: verdict %v with no result files, want not measured", id, g.Verdict)
		}
	}
}

// TestNear: figures next to their bound keep the digits that show on
// which side they fall.
func TestNear(t *testing.T) {
	tests := []struct {
		value, bound float64
		decimals     int
		want         string
	}{
		{0.899, 0.9, 2, "0.899"},
		{0.8999999, 0.9, 2, "0.8999999"},
		{0.85, 0.9, 2, "0.85"},
		{0.9, 0.9, 2, "0.90"},
		{199_999.9, 200_000, 0, "199,999.9"},
		{862_076, 200_000, 0, "862,076"},
		{2.0004, 2, 3, "2.0004"},
	}
	for _, tt := range tests {
		if got := near(tt.value, tt.bound, tt.decimals); got != tt.want {
			t.Errorf("near(%v, %v, %d) = %q, want %q", tt.value, tt.bound, tt.decimals, got, tt.want)
		}
	}
}

// copyFixture copies a testdata directory to a temporary one, since run
// writes its outputs beside the results.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("testdata", name, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// checkPNGs fails unless every plot is in dir and decodes as a PNG.
func checkPNGs(t *testing.T, dir string) {
	t.Helper()
	for _, c := range charts {
		data, err := os.ReadFile(filepath.Join(dir, c.File))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(bytes.NewReader(data)); err != nil {
			t.Errorf("%s: %v", c.File, err)
		}
	}
}

// TestRun: the program writes summary.md (table, then each file's date and
// command) and the three plots, and, without --end-run (as make
// bench-postgres runs it after make bench), no run log row even though
// run.json holds a finished run; with no results it still writes them all.
func TestRun(t *testing.T) {
	dir := copyFixture(t, "met")
	if err := beginRun(dir, "make bench", runStart); err != nil {
		t.Fatal(err)
	}
	if err := endRun(dir, runStart.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := run(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, runLogFile)); !os.IsNotExist(err) {
		t.Errorf("a report without --end-run wrote %s (stat: %v)", runLogFile, err)
	}
	summary, err := os.ReadFile(filepath.Join(dir, summaryFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| Bulk throughput | tabletflow end to end / raw loop, records/s, 16 tablets | ≥ 0.9 | 0.95",
		"- `throughput.json`: 2026-12-01T10:00:00Z, `go run ./bench/throughput --out met/throughput.json`\n",
		"- `getchanges.json`: 2026-11-30T02:00:00Z\n", // no command recorded
		// The Vitess goal is judged on 0.8 and names its aim of 0.9.
		"| Other (not issue 11) | Vitess source: tabletflow / raw VStream loop, records/s, one shard | ≥ 0.8 (aim 0.9) | 0.80 (median of 3 pairs",
	} {
		if !strings.Contains(string(summary), want) {
			t.Errorf("summary.md lacks %q:\n%s", want, summary)
		}
	}
	checkPNGs(t, dir)

	empty := t.TempDir()
	if err := run(empty); err != nil {
		t.Fatalf("no results: %v", err)
	}
	checkPNGs(t, empty)
}

// TestSummaryListsMissingResultFilesButNotTheOptionalExclusionRun: the
// summary's list of result files names a missing one as such, except
// reaction-exclude.json, which only a separate exclusion run writes.
func TestSummaryListsMissingResultFilesButNotTheOptionalExclusionRun(t *testing.T) {
	r, err := loadResults(filepath.Join("testdata", "partial"))
	if err != nil {
		t.Fatal(err)
	}
	_, s, _ := strings.Cut(summaryMarkdown(r, goals(r)), "Result files")
	for _, name := range []string{soakFile, vitessFile} {
		if !strings.Contains(s, "- `"+name+"`: not found") {
			t.Errorf("a missing %s is not listed:\n%s", name, s)
		}
	}
	if strings.Contains(s, reactionExcludeFile) {
		t.Errorf("the optional %s is listed:\n%s", reactionExcludeFile, s)
	}
}
