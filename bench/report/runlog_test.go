package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// runStart is when the runs in these tests begin.
var runStart = time.Date(2026, 12, 6, 23, 36, 20, 0, time.UTC)

// endedRun copies the fixture (a name under testdata, or "" for no result
// files) and records in it a run of took that began at runStart.
func endedRun(t *testing.T, fixture string, took time.Duration) string {
	t.Helper()
	dir := t.TempDir()
	if fixture != "" {
		dir = copyFixture(t, fixture)
	}
	require.NoError(t, beginRun(dir, "make bench", runStart))
	require.NoError(t, endRun(dir, runStart.Add(took)))
	return dir
}

// appendFor appends the run recorded in dir to dir's run log.
func appendFor(t *testing.T, dir, commit string) {
	t.Helper()
	r, rows, err := judge(dir)
	require.NoError(t, err)
	require.NoError(t, appendRunLog(dir, r, rows, commit))
}

// readRunLog returns dir's run log.
func readRunLog(t *testing.T, dir string) string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(dir, runLogFile))
	require.NoError(t, err)
	return string(text)
}

// tableCells splits a Markdown table line into its trimmed cells.
func tableCells(line string) []string {
	line = strings.TrimSuffix(strings.TrimSpace(line), "|")
	line = strings.TrimPrefix(line, "|")
	cells := strings.Split(line, "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

// lastRow maps the run log's last row by its table's column names.
func lastRow(t *testing.T, text string) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	header := lastHeader(text)
	require.NotEmpty(t, header, "no table header in:\n%s", text)
	names := tableCells(strings.SplitN(header, "\n", 2)[0])
	cells := tableCells(lines[len(lines)-1])
	require.Len(t, cells, len(names), "row %q against header %q", lines[len(lines)-1], names)
	byName := map[string]string{}
	for i, name := range names {
		byName[name] = cells[i]
	}
	return byName
}

func TestRunLogNewFileGetsIntroAndHeaderThenTheRow(t *testing.T) {
	dir := endedRun(t, "met", 13*time.Minute+24*time.Second)
	appendFor(t, dir, "e53933a")

	text := readRunLog(t, dir)
	require.True(t, strings.HasPrefix(text, runLogIntro), "no intro at the top:\n%s", text)
	lines := strings.Split(strings.TrimPrefix(text, runLogIntro), "\n")
	require.Len(t, lines, 4, "want header, separator, one row and the final newline:\n%s", text)

	r, err := loadResults(dir)
	require.NoError(t, err)
	want := []string{"Date (UTC)", "Commit", "Minutes"}
	for _, g := range goals(r) {
		want = append(want, g.ID)
	}
	require.Equal(t, want, tableCells(lines[0]), "header: the run's columns, then every goal in goals.go's order")
	require.Equal(t, strings.Repeat("| --- ", len(want))+"|", lines[1])
	require.True(t, strings.HasPrefix(lines[2], "| 2026-12-06 23:36 | e53933a | 13.4 | met |"), "row %q", lines[2])
	require.Empty(t, lines[3])
}

func TestRunLogAppendKeepsEarlierBytes(t *testing.T) {
	dir := endedRun(t, "met", 10*time.Minute)
	r, rows, err := judge(dir)
	require.NoError(t, err)
	header := runLogHeader(rows)
	earlier := "| 2026-12-05 08:00 | 342af38+dirty | 14.0 |" + strings.Repeat(" not met |", len(rows)) + "\n"
	tests := []struct {
		name      string
		old       string
		newHeader bool // the appended lines start a new table
	}{
		{"rows under today's header, hand-made spacing and a note kept", runLogIntro + header + earlier + "| 2026-12-05  09:00 |  x  | 1.0 |  odd  |\n", false},
		{"last line without its newline", runLogIntro + header + strings.TrimSuffix(earlier, "\n"), false},
		{"a header naming other goals starts a new table", "| Date (UTC) | Commit | Minutes | bulk-16 |\n| --- | --- | --- | --- |\n| 2026-11-01 00:00 | abc | 9.0 | met |\n", true},
		{"text without any table", "# runs\n\nnotes\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, runLogFile)
			require.NoError(t, os.WriteFile(path, []byte(tt.old), 0o644))
			require.NoError(t, appendRunLog(dir, r, rows, "e53933a"))

			text := readRunLog(t, dir)
			require.True(t, strings.HasPrefix(text, tt.old), "earlier bytes changed:\nbefore\n%q\nafter\n%q", tt.old, text)
			added := text[len(tt.old):]
			if !strings.HasSuffix(tt.old, "\n") {
				require.True(t, strings.HasPrefix(added, "\n"), "the unfinished last line not ended first:\n%q", added)
				added = added[1:]
			}
			if tt.newHeader {
				require.True(t, strings.HasPrefix(added, "\n"+header), "no new table for today's goals:\n%q", added)
				added = strings.TrimPrefix(added, "\n"+header)
			}
			require.Equal(t, 1, strings.Count(added, "\n"), "want exactly one appended row:\n%q", added)
			require.True(t, strings.HasPrefix(added, "| 2026-12-06 23:36 | e53933a | 10.0 |"), "appended %q", added)
			require.Equal(t, "met", lastRow(t, text)["bulk-16"])
		})
	}
}

func TestRunLogTwoRunsAppendTwoRowsUnderOneHeader(t *testing.T) {
	dir := endedRun(t, "met", 12*time.Minute)
	appendFor(t, dir, "aaaaaaa")
	first := readRunLog(t, dir)

	require.NoError(t, beginRun(dir, "make bench", runStart.Add(time.Hour)))
	require.NoError(t, endRun(dir, runStart.Add(time.Hour+15*time.Minute)))
	appendFor(t, dir, "bbbbbbb+dirty")

	text := readRunLog(t, dir)
	require.True(t, strings.HasPrefix(text, first), "the first run's bytes changed")
	require.Equal(t, "| 2026-12-07 00:36 | bbbbbbb+dirty | 15.0 |", text[len(first):len(first)+len("| 2026-12-07 00:36 | bbbbbbb+dirty | 15.0 |")])
	require.Equal(t, 1, strings.Count(text, "| Date (UTC) |"), "a second header:\n%s", text)
}

func TestRunLogVerdictsComeFromTheResults(t *testing.T) {
	tests := []struct {
		fixture string
		want    map[string]string // goal ID → the row's cell
	}{
		{"met", map[string]string{"bulk-16": "met", "scale": "met", "soak": "met", "isolation-stall": "no result", "scale-5000": "no result"}},
		{"missed", map[string]string{"bulk-16": "not met", "live-lag": "not met", "exclude-256": "no result", "pgsink": "no result", "soak": "not met"}},
		{"partial", map[string]string{"bulk-16": "met", "bulk-64": "no result", "scale": "no result"}},
		{"", map[string]string{"bulk-16": "no result", "getchanges": "no result", "soak": "no result"}},
	}
	for _, tt := range tests {
		name := tt.fixture
		if name == "" {
			name = "no result files"
		}
		t.Run(name, func(t *testing.T) {
			dir := endedRun(t, tt.fixture, 21*time.Minute)
			appendFor(t, dir, "e53933a")
			got := lastRow(t, readRunLog(t, dir))
			for id, want := range tt.want {
				require.Equal(t, want, got[id], "goal %s", id)
			}
			require.Equal(t, "not met", got["run"], "21 minutes against the run's goal of 20")
			require.Equal(t, "21.0", got["Minutes"])
		})
	}
}

func TestRunLogRefusesARunThatHasNotEnded(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, beginRun(dir, "make bench", runStart))
	r, rows, err := judge(dir)
	require.NoError(t, err)
	require.ErrorContains(t, appendRunLog(dir, r, rows, "e53933a"), "has not finished")
	_, err = os.Stat(filepath.Join(dir, runLogFile))
	require.True(t, os.IsNotExist(err), "a run log written for an unfinished run (stat: %v)", err)
}

func TestFinishRunWritesTheSummaryAndAppendsTheRow(t *testing.T) {
	dir := endedRun(t, "met", 13*time.Minute)
	require.NoError(t, finishRun(dir, "e53933a"))

	summary, err := os.ReadFile(filepath.Join(dir, summaryFile))
	require.NoError(t, err)
	require.Contains(t, string(summary), "| Benchmark program | `make bench`")
	checkPNGs(t, dir)
	row := lastRow(t, readRunLog(t, dir))
	require.Equal(t, "e53933a", row["Commit"])
	require.Equal(t, "met", row["run"])
}

// git runs git in dir for a test's own repository.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=test", "-c", "user.email=test@example.com"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

func TestGitCommitNamesHEADAndDirtyTrackedFilesOutsideTheResults(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git:", err)
	}
	repo := t.TempDir()
	results := filepath.Join(repo, "bench", "results")
	require.NoError(t, os.MkdirAll(results, 0o755))
	write := func(path, text string) {
		require.NoError(t, os.WriteFile(filepath.Join(repo, path), []byte(text), 0o644))
	}
	write("code.go", "package code\n")
	write("bench/results/run.json", "{}\n")
	git(t, repo, "init", "-q")
	git(t, repo, "add", ".")
	git(t, repo, "commit", "-q", "-m", "first")
	head := git(t, repo, "rev-parse", "--short", "HEAD")

	steps := []struct {
		name   string
		change func()
		want   string
	}{
		{"clean tree", func() {}, head},
		{"a tracked result file rewritten by the run", func() { write("bench/results/run.json", `{"date": "x"}`+"\n") }, head},
		{"an untracked file", func() { write("notes.txt", "x\n") }, head},
		{"a tracked file changed", func() { write("code.go", "package code // changed\n") }, head + "+dirty"},
	}
	for _, step := range steps {
		step.change()
		require.Equal(t, step.want, gitCommit(repo, results), step.name)
	}
	require.Equal(t, unknownCommit, gitCommit(t.TempDir(), results), "outside a repository")
	t.Setenv("PATH", "")
	require.Equal(t, unknownCommit, gitCommit(repo, results), "without git")
}
