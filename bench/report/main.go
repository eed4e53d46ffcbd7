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
// A missing result file or field makes a goal "not measured"; a goal is
// "met" only when the unrounded figure is within its bound.
//
//	go run ./bench/report [--results bench/results] [--readme README.md]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// summaryFile is the Markdown summary's name in the results directory.
const summaryFile = "summary.md"

func main() {
	resultsDir := flag.String("results", "bench/results", "directory holding the benchmarks' *.json results; summary.md and the plots are written there")
	readme := flag.String("readme", "", "also replace the table between the bench-summary markers of this file (empty: touch no README)")
	flag.Parse()
	if err := run(*resultsDir, *readme); err != nil {
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
