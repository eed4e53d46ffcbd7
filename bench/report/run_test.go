package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeDated writes a result file dated at.
func writeDated(t *testing.T, dir, name string, at time.Time) {
	t.Helper()
	text := `{"date": "` + at.UTC().Format(time.RFC3339) + `"}`
	if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runRowIn judges the run goal over dir.
func runRowIn(t *testing.T, dir string) row {
	t.Helper()
	r, err := loadResults(dir)
	if err != nil {
		t.Fatal(err)
	}
	return runRow(r)
}

// TestRunDuration: make bench's duration is judged from run.json against
// 20 minutes, a second over is a miss, and a result file the run did not
// write is named.
func TestRunDuration(t *testing.T) {
	start := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		took     time.Duration
		want     verdict
		measured []string
	}{
		{"within", 19 * time.Minute, met, []string{"19.0 min", "2026-12-06T01:00:00Z to 2026-12-06T01:19:00Z"}},
		{"at the bound", 20 * time.Minute, met, []string{"20.0 min"}},
		{"a second over", 20*time.Minute + time.Second, notMet, []string{"20.02 min"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := beginRun(dir, "make bench", start); err != nil {
				t.Fatal(err)
			}
			for _, name := range runFiles {
				writeDated(t, dir, name, start.Add(time.Minute))
			}
			if err := endRun(dir, start.Add(tt.took)); err != nil {
				t.Fatal(err)
			}
			got := runRowIn(t, dir)
			if got.Verdict != tt.want {
				t.Errorf("verdict %v, want %v (measured %q)", got.Verdict, tt.want, got.Measured)
			}
			for _, want := range tt.measured {
				if !strings.Contains(got.Measured, want) {
					t.Errorf("measured %q, want it to contain %q", got.Measured, want)
				}
			}
			if strings.Contains(got.Measured, "older") || strings.Contains(got.Measured, "no date") {
				t.Errorf("measured %q names a file as not from the run, though all are", got.Measured)
			}
		})
	}
}

// TestRunNamesFilesFromElsewhere: a result file older than the run, or
// without a date, is said in the row, so a table mixing runs cannot pass
// for one run.
func TestRunNamesFilesFromElsewhere(t *testing.T) {
	start := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	if err := beginRun(dir, "make bench", start); err != nil {
		t.Fatal(err)
	}
	writeDated(t, dir, throughputFile, start.Add(time.Minute))
	writeDated(t, dir, reactionFile, start.Add(-time.Hour))
	if err := os.WriteFile(filepath.Join(dir, scaleFile), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := endRun(dir, start.Add(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	got := runRowIn(t, dir)
	for _, want := range []string{"reaction.json is older than the run", "scale.json has no date", "getchanges.json has no date"} {
		if !strings.Contains(got.Measured, want) {
			t.Errorf("measured %q, want it to contain %q", got.Measured, want)
		}
	}
	if strings.Contains(got.Measured, throughputFile) {
		t.Errorf("measured %q names throughput.json, which the run wrote", got.Measured)
	}
}

// TestRunUnfinished: a run begun and not ended (make bench failed or was
// stopped) has no duration, and cannot be ended twice.
func TestRunUnfinished(t *testing.T) {
	start := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	if got := runRowIn(t, dir); got.Verdict != notMeasured || !strings.Contains(got.Measured, "run.json not found") {
		t.Errorf("no run.json: %v %q, want not measured, run.json not found", got.Verdict, got.Measured)
	}
	if err := endRun(dir, start); err == nil {
		t.Error("ending a run never begun succeeded")
	}
	if err := beginRun(dir, "make bench", start); err != nil {
		t.Fatal(err)
	}
	if got := runRowIn(t, dir); got.Verdict != notMeasured || !strings.Contains(got.Measured, "did not finish") {
		t.Errorf("run begun only: %v %q, want not measured, did not finish", got.Verdict, got.Measured)
	}
	if err := endRun(dir, start.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := endRun(dir, start.Add(2*time.Minute)); err == nil {
		t.Error("a run ended twice")
	}
}
