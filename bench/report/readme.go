package main

import (
	"fmt"
	"os"
	"strings"
)

// The lines that fence the generated table in a README. Everything between
// them belongs to the report; everything else is left as written.
const (
	beginMarker = "<!-- bench-summary:begin -->"
	endMarker   = "<!-- bench-summary:end -->"
)

// replaceBetweenMarkers returns text with the lines between the marker
// lines replaced by table, keeping the marker lines themselves. Each marker
// must be a line of its own and appear exactly once, begin before end:
// anything else means the README was edited in a way the report cannot
// safely guess at.
func replaceBetweenMarkers(text, table string) (string, error) {
	lines := strings.SplitAfter(text, "\n")
	begin, err := markerLine(lines, beginMarker)
	if err != nil {
		return "", err
	}
	end, err := markerLine(lines, endMarker)
	if err != nil {
		return "", err
	}
	if end < begin {
		return "", fmt.Errorf("%q comes before %q", endMarker, beginMarker)
	}
	if !strings.HasSuffix(table, "\n") {
		table += "\n"
	}
	var b strings.Builder
	for _, line := range lines[:begin+1] {
		b.WriteString(line)
	}
	b.WriteString(table)
	for _, line := range lines[end:] {
		b.WriteString(line)
	}
	return b.String(), nil
}

// markerLine returns the index of the one line that is marker (surrounding
// spaces allowed).
func markerLine(lines []string, marker string) (int, error) {
	found := -1
	for i, line := range lines {
		if strings.TrimSpace(line) != marker {
			continue
		}
		if found >= 0 {
			return 0, fmt.Errorf("marker line %q appears more than once", marker)
		}
		found = i
	}
	if found < 0 {
		return 0, fmt.Errorf("marker line %q not found", marker)
	}
	return found, nil
}

// updateReadme rewrites the table between the markers of the file at path.
func updateReadme(path, table string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	updated, err := replaceBetweenMarkers(string(text), table)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(updated), info.Mode().Perm())
}
