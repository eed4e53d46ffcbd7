package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// runFile records one `make bench` run: when its first benchmark started
// and when the report closed it. It is how the run's duration (issue 11:
// make bench within 20 minutes) is measured by the run itself, and how the
// report tells whether issue 11's figures all come from that one run.
const runFile = "run.json"

// goalRunMinutes bounds make bench, from its first benchmark to the
// report; the binaries it needs (make build, the Temporal CLI) are built
// before the clock starts.
const goalRunMinutes = 20.0

// runFiles are the result files make bench writes: the ones whose figures
// must come from the run run.json records.
var runFiles = []string{getChangesFile, throughputFile, reactionFile, scaleFile}

// runRecord is run.json's content; the duration is Finished less Date.
type runRecord struct {
	Date     string `json:"date"` // when the run started, as every result file dates itself
	Command  string `json:"command"`
	Finished string `json:"finished,omitempty"`
}

// beginRun starts a run's record, replacing the previous run's.
func beginRun(dir, command string, now time.Time) error {
	return writeRun(dir, runRecord{Date: now.UTC().Format(time.RFC3339), Command: command})
}

// endRun closes the record beginRun started. A record already closed, or
// none, is an error: the duration would belong to another run.
func endRun(dir string, now time.Time) error {
	raw, err := os.ReadFile(filepath.Join(dir, runFile))
	if err != nil {
		return fmt.Errorf("end of run: %w (make bench begins one with --begin-run)", err)
	}
	var rec runRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return fmt.Errorf("end of run: %s: %w", runFile, err)
	}
	if _, err := time.Parse(time.RFC3339, rec.Date); err != nil {
		return fmt.Errorf("end of run: %s: date: %w", runFile, err)
	}
	if rec.Finished != "" {
		return errors.New("end of run: " + runFile + " is already closed (finished " + rec.Finished + ")")
	}
	rec.Finished = now.UTC().Format(time.RFC3339)
	return writeRun(dir, rec)
}

func writeRun(dir string, rec runRecord) error {
	raw, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, runFile), append(raw, '\n'), 0o644)
}

// runRow judges make bench's duration, and says which of its result files
// were not written by that run (a case run alone since, or left from an
// earlier run), since issue 11 asks for every goal met in one run.
func runRow(r *results) row {
	goal := row{ID: "run", Area: "Benchmark program",
		Measure: "`make bench`, from its first benchmark to the report (binaries built beforehand)",
		Goal:    fmt.Sprintf("≤ %v min", goalRunMinutes)}
	f := r.file(runFile)
	if f.Data == nil {
		return goal.none(fileProblem(f), sourceName(f))
	}
	started, ok := f.date()
	if !ok {
		return goal.none("no start time", f.Name)
	}
	startedText := started.UTC().Format(time.RFC3339)
	finishedText, _ := f.Data.str("finished")
	finished, err := time.Parse(time.RFC3339, finishedText)
	if err != nil {
		return goal.none("the run started "+startedText+" did not finish", f.Name)
	}
	minutes := finished.Sub(started).Minutes()
	details := []string{startedText + " to " + finishedText}
	for _, name := range runFiles {
		date, ok := r.file(name).date()
		switch {
		case !ok:
			details = append(details, name+" has no date")
		case date.Before(started):
			details = append(details, name+" is older than the run")
		}
	}
	return goal.judged(withDetails(near(minutes, goalRunMinutes, 1)+" min", details), atMost(minutes, goalRunMinutes), f.Name)
}
