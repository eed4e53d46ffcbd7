package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// runLogFile is the run log in the results directory: one row per
// `make bench` run, appended at --end-run. Rows already in it are never
// rewritten, so it is the history that summary.md, which holds only the
// latest figures, is not.
const runLogFile = "runs.md"

// runLogIntro opens a new run log, above its table.
const runLogIntro = "# `make bench` runs\n\n" +
	"One row per run, appended by `go run ./bench/report --end-run` as `make bench` ends; " +
	"rows already here are never rewritten. " +
	"Date: the run's start (UTC). " +
	"Commit: HEAD's short hash at the run's end, \"+dirty\" when tracked files outside bench/results had uncommitted changes, " +
	"\"unknown\" without git. " +
	"Minutes: from the first benchmark to the report. " +
	"Then one column per goal, named by its ID in bench/report/goals.go (summary.md has the latest run's figures): " +
	"met, not met, or no result.\n\n"

// unknownCommit stands for the commit when git cannot tell it.
const unknownCommit = "unknown"

// runLogVerdict is a verdict as the run log writes it.
func runLogVerdict(v verdict) string {
	switch v {
	case met:
		return "met"
	case notMet:
		return "not met"
	}
	return "no result"
}

// runLogHeader is the table header (and its separator line) for the goals
// in rows, in their order.
func runLogHeader(rows []row) string {
	cells := []string{"Date (UTC)", "Commit", "Minutes"}
	for _, r := range rows {
		cells = append(cells, cell(r.ID))
	}
	seps := make([]string, len(cells))
	for i := range seps {
		seps[i] = "---"
	}
	return "| " + strings.Join(cells, " | ") + " |\n| " + strings.Join(seps, " | ") + " |\n"
}

// runLogRow is the table row of the run run.json records, which must be
// finished: its start, commit, minutes, and each goal's verdict in rows.
func runLogRow(r *results, rows []row, commit string) (string, error) {
	f := r.file(runFile)
	if f.Data == nil {
		return "", fmt.Errorf("run log: %s", fileProblem(f))
	}
	started, ok := f.date()
	if !ok {
		return "", errors.New("run log: " + runFile + " has no start date")
	}
	finishedText, _ := f.Data.str("finished")
	finished, err := time.Parse(time.RFC3339, finishedText)
	if err != nil {
		return "", errors.New("run log: the run in " + runFile + " has not finished")
	}
	cells := []string{
		started.UTC().Format("2006-01-02 15:04"),
		cell(commit),
		fixed(finished.Sub(started).Minutes(), 1),
	}
	for _, g := range rows {
		cells = append(cells, runLogVerdict(g.Verdict))
	}
	return "| " + strings.Join(cells, " | ") + " |\n", nil
}

// appendRunLog appends the finished run's row to runs.md in dir. A new file
// gets the intro and the table header first; a file whose last header
// names other goals (goals.go changed since) gets a new table after a
// blank line, so no column ever holds another goal's verdicts. Either way
// the bytes already in the file stay as they are.
func appendRunLog(dir string, r *results, rows []row, commit string) error {
	line, err := runLogRow(r, rows, commit)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, runLogFile)
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	header := runLogHeader(rows)
	var add strings.Builder
	switch {
	case len(bytes.TrimSpace(old)) == 0:
		add.WriteString(runLogIntro + header)
	default:
		if !bytes.HasSuffix(old, []byte("\n")) {
			add.WriteString("\n")
		}
		if lastHeader(string(old)) != header {
			add.WriteString("\n" + header)
		}
	}
	add.WriteString(line)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(add.String()); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// lastHeader returns the last table header in text, with its separator
// line, as runLogHeader writes them, or "" when there is none.
func lastHeader(text string) string {
	lines := strings.SplitAfter(text, "\n")
	for i := len(lines) - 2; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "| Date (UTC) |") && strings.HasPrefix(lines[i+1], "| --- |") {
			return lines[i] + lines[i+1]
		}
	}
	return ""
}

// gitCommit names the code a run measured: the short hash of HEAD in the
// repository holding repoDir ("" for the working directory), with "+dirty"
// when tracked files had uncommitted changes. Changes under resultsDir do
// not count: they are the run's own outputs, written before this is asked.
// Without git, or outside a repository, it is "unknown".
func gitCommit(repoDir, resultsDir string) string {
	hash, err := gitOutput(repoDir, "rev-parse", "--short", "HEAD")
	if err != nil || hash == "" {
		return unknownCommit
	}
	args := []string{"status", "--porcelain", "--untracked-files=no", "--", ":/"}
	if rel, ok := relativeInside(repoDir, resultsDir); ok && rel != "." {
		args = append(args, ":(exclude)"+rel)
	}
	status, err := gitOutput(repoDir, args...)
	switch {
	case err != nil:
		return unknownCommit
	case status != "":
		return hash + "+dirty"
	}
	return hash
}

// gitOutput runs git in dir and returns its trimmed standard output.
func gitOutput(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// relativeInside returns path relative to base ("" for the working
// directory) when it lies inside base.
func relativeInside(base, path string) (string, bool) {
	absBase, err := filepath.Abs(base)
	if err != nil {
		return "", false
	}
	absPath, err := filepath.Abs(path)
	if err != nil {
		return "", false
	}
	rel, err := filepath.Rel(absBase, absPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", false
	}
	return filepath.ToSlash(rel), true
}
