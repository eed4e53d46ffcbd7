package main

import (
	"fmt"
	"strings"
)

// goalTable renders the goals as one Markdown table.
func goalTable(rows []row) string {
	var b strings.Builder
	b.WriteString("| Area | What is measured | Goal | Measured | Verdict | Result file |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n",
			cell(r.Area), cell(r.Measure), cell(r.Goal), cell(r.Measured), r.Verdict, cell(r.Source))
	}
	return b.String()
}

// fileLines lists every result file with its date and, when it records
// one, the command that produced it, so a reader can tell how fresh each
// figure is and how to measure it again.
func fileLines(r *results) string {
	var b strings.Builder
	for _, name := range r.sortedNames() {
		f := r.Files[name]
		switch {
		case f.missing():
			fmt.Fprintf(&b, "- `%s`: not found\n", name)
			continue
		case f.Data == nil:
			fmt.Fprintf(&b, "- `%s`: unreadable (%v)\n", name, f.Err)
			continue
		}
		date, ok := f.Data.str("date")
		if !ok {
			date = "no date"
		}
		line := fmt.Sprintf("- `%s`: %s", name, date)
		if command, ok := f.Data.str("command"); ok {
			line += fmt.Sprintf(", `%s`", command)
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// summaryMarkdown is the whole of summary.md. It carries no generation
// time, so running the report twice on the same results changes nothing.
func summaryMarkdown(r *results, rows []row) string {
	var b strings.Builder
	b.WriteString("# Benchmark summary\n\n")
	b.WriteString("Made by `go run ./bench/report` from `bench/results/*.json`. " +
		"Issue 11's goals are judged on this 2-core machine; a goal is met only if the unrounded figure is within its bound.\n\n")
	b.WriteString(goalTable(rows))
	b.WriteString("\nResult files (date, and the command that made them when recorded):\n\n")
	b.WriteString(fileLines(r))
	return b.String()
}
