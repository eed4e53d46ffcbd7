// Command report turns the benchmark results in bench/results/*.json into
// a summary of the performance goals and plots:
//
//   - summary.md: one Markdown table of the goals (issue 11's, and the other
//     benchmarks' beside them), each with the measured figure and a verdict,
//     then the date and command of every result file;
//   - throughput.png, reroute.png and cpu.png (gonum.org/v1/plot).
//
// With --readme PATH it also puts the table between the lines
// "<!-- bench-summary:begin -->" and "<!-- bench-summary:end -->" of PATH.
//
// make bench brackets its benchmarks with --begin-run (which only records
// the start in run.json) and --end-run (which records the end, then
// reports), so the run's duration is a goal in the table like the others.
//
// A missing result file or field makes a goal "not measured"; a goal is
// "met" only when the unrounded figure is within its bound.
//
//	go run ./bench/report [--results bench/results] [--readme README.md] [--end-run]
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
	resultsDir := flag.String("results", "bench/results", "directory holding the benchmarks' *.json results; summary.md and the plots are written there")
	readme := flag.String("readme", "", "also replace the table between the bench-summary markers of this file (empty: touch no README)")
	begin := flag.String("begin-run", "", "record in run.json that a run of this command starts now, and write nothing else")
	end := flag.Bool("end-run", false, "record in run.json that the run begun with --begin-run ends now, then report")
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
		}
		return run(*resultsDir, *readme)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

// run writes the summary and the plots for the results in dir, and the
// table into readme when it is not empty. The README is checked for its
// markers before anything is written, so a wrong path fails without
// leaving half the outputs renewed.
func run(dir, readme string) error {
	info, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if readme != "" {
		if err := checkReadme(readme); err != nil {
			return err
		}
	}
	r, err := loadResults(dir)
	if err != nil {
		return err
	}
	rows := goals(r)
	if err := os.WriteFile(filepath.Join(dir, summaryFile), []byte(summaryMarkdown(r, rows)), 0o644); err != nil {
		return err
	}
	if err := writePlots(r, dir); err != nil {
		return err
	}
	if readme != "" {
		return updateReadme(readme, goalTable(rows))
	}
	return nil
}

// checkReadme fails when the README cannot take the table.
func checkReadme(path string) error {
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if _, err := replaceBetweenMarkers(string(text), ""); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
