// Command report turns the benchmark results in bench/results/*.json into
// a summary of the performance goals, a run log and plots:
//
//   - summary.md: one Markdown table of the goals (issue 11's, and the other
//     benchmarks' beside them), each with the measured figure and a verdict,
//     then the date and command of every result file;
//   - runs.md: one row appended per `make bench` run (at --end-run): its
//     date, commit and minutes, and each goal's verdict;
//   - throughput.png, reroute.png and cpu.png (gonum.org/v1/plot).
//
// It writes nothing outside the results directory.
//
// make bench brackets its benchmarks with --begin-run (which only records
// the start in run.json) and --end-run (which records the end, then
// reports and appends the run's row to runs.md), so the run's duration is
// a goal in the table like the others.
//
// A missing result file or field makes a goal "not measured"; a goal is
// "met" only when the unrounded figure is within its bound.
//
//	go run ./bench/report [--results bench/results] [--end-run]
//	go run ./bench/report --results bench/results --begin-run "make bench"
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// summaryFile is the Markdown summary's name in the results directory.
const summaryFile = "summary.md"

func main() {
	resultsDir := flag.String("results", "bench/results", "directory holding the benchmarks' *.json results; summary.md, runs.md and the plots are written there")
	begin := flag.String("begin-run", "", "record in run.json that a run of this command starts now, and write nothing else")
	end := flag.Bool("end-run", false, "record in run.json that the run begun with --begin-run ends now, report, and append the run's row to runs.md")
	flag.Parse()
	err := func() error {
		switch {
		case *begin != "" && *end:
			return errors.New("--begin-run and --end-run are two steps of a run, not one")
		case *begin != "":
			return beginRun(*resultsDir, *begin, time.Now())
		case *end:
			if err := endRun(*resultsDir, time.Now()); err != nil {
				return err
			}
			return finishRun(*resultsDir, gitCommit("", *resultsDir))
		}
		return run(*resultsDir)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

// run writes the summary and the plots for the results in dir.
func run(dir string) error {
	r, rows, err := judge(dir)
	if err != nil {
		return err
	}
	return writeOutputs(dir, r, rows)
}

// finishRun reports on a run that endRun has just closed: the summary,
// the run's row appended to the run log (commit naming the code it ran),
// then the plots.
func finishRun(dir, commit string) error {
	r, rows, err := judge(dir)
	if err != nil {
		return err
	}
	if err := appendRunLog(dir, r, rows, commit); err != nil {
		return err
	}
	return writeOutputs(dir, r, rows)
}

// judge loads the results in dir and judges every goal.
func judge(dir string) (*results, []row, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return nil, nil, err
	}
	if !info.IsDir() {
		return nil, nil, fmt.Errorf("%s is not a directory", dir)
	}
	r, err := loadResults(dir)
	if err != nil {
		return nil, nil, err
	}
	return r, goals(r), nil
}

// writeOutputs writes summary.md and the plots into dir.
func writeOutputs(dir string, r *results, rows []row) error {
	if err := os.WriteFile(filepath.Join(dir, summaryFile), []byte(summaryMarkdown(r, rows)), 0o644); err != nil {
		return err
	}
	return writePlots(r, dir)
}
