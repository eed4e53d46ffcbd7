package repocheck

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Tests of the markdown reading the docs checks rest on, each with a small
// inline fixture.

func TestGithubSlug(t *testing.T) {
	for _, tc := range []struct{ heading, slug string }{
		{"Quick start", "quick-start"},
		{"Config reference", "config-reference"},
		{"`exclude`", "exclude"},                                           // a code span: its content
		{"Source: tabletd", "source-tabletd"},                              // ':' dropped, the space stays a '-'
		{"Lifecycle and continue-as-new", "lifecycle-and-continue-as-new"}, // '-' kept
		{"`batch.maxWait` and `tls_ca`", "batchmaxwait-and-tls_ca"},        // '.' dropped, '_' kept
		{"Retry & selection (per tablet)", "retry--selection-per-tablet"},  // each space a '-', even doubled
		{"What's *new*? **Now**", "whats-new-now"},                         // emphasis and punctuation gone
		{"_Emphasised_ snake_case", "emphasised-snake_case"},               // emphasis '_' gone, in-word '_' kept
		{"[Links](x.md) keep their text", "links-keep-their-text"},
		{"Über Größe", "über-größe"}, // letters beyond ASCII kept, lower-cased
		{"Limits — and 2× sizing", "limits--and-2-sizing"},
		{"A <br> tag", "a--tag"},
		{`Escaped \* star`, "escaped--star"},
	} {
		d := parseMarkdown("x.md", "## "+tc.heading+"\n")
		require.Len(t, d.headings, 1, tc.heading)
		require.Equal(t, tc.slug, d.headings[0].slug, tc.heading)
	}
}

func TestSlugsOfRepeatedHeadingsGetSuffixes(t *testing.T) {
	d := parseMarkdown("x.md", "# Setup\n## Setup\n### Setup\n## Setup-1\n## Limits\n## Limits\n")
	var slugs []string
	for _, h := range d.headings {
		slugs = append(slugs, h.slug)
	}
	// github-slugger: the third Setup would be setup-2; "Setup-1" is taken
	// by then, so it becomes setup-1-1.
	require.Equal(t, []string{"setup", "setup-1", "setup-2", "setup-1-1", "limits", "limits-1"}, slugs)
}

func TestHeadings(t *testing.T) {
	d := parseMarkdown("x.md", `# Title #
Setext one
==========

Setext two
---

- a list item
---

| a | b |
|---|---|

`+"```md\n## not a heading (in a fence)\n```\n"+`
####### seven hashes is text
#hashtag is text
  ## indented two is a heading ##
<a id="explicit-anchor"></a>
<!-- ## a commented heading -->
`)
	var got []string
	for _, h := range d.headings {
		got = append(got, h.text)
	}
	require.Equal(t, []string{"Title", "Setext one", "Setext two", "indented two is a heading"}, got)
	require.Equal(t, []int{1, 1, 2, 2}, []int{d.headings[0].level, d.headings[1].level, d.headings[2].level, d.headings[3].level})
	require.True(t, d.anchors["explicit-anchor"])
}

func TestFences(t *testing.T) {
	d := parseMarkdown("x.md", "a\n````md\n```\nin\n```\n````\nb\n~~~\n[x](y.md)\n~~~\nc\n  ```sh\n  make demo\n  ```\n")
	var fenced []bool
	for _, l := range d.lines {
		fenced = append(fenced, l.fenced)
	}
	// A ```` fence is closed by ```` only; ~~~ and indented fences count.
	require.Equal(t, []bool{false, true, true, true, true, true, false, true, true, true, false, true, true, true, false}, fenced)
}

func TestSplitCodeSpans(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []span
	}{
		{"a `b` c", []span{{text: "a ", off: 0, end: 2}, {text: "b", code: true, off: 2, end: 5}, {text: " c", off: 5, end: 7}}},
		{"``a`b``", []span{{text: "a`b", code: true, off: 0, end: 7}}},
		{"`` `x` ``", []span{{text: "`x`", code: true, off: 0, end: 9}}}, // one space trimmed at each end
		{"an ` unclosed", []span{{text: "an ` unclosed", off: 0, end: 13}}},
		{"\\`not code`", []span{{text: "\\`not code`", off: 0, end: 11}}}, // an escaped backtick opens nothing
		{"`a\nb`", []span{{text: "a b", code: true, off: 0, end: 5}}},     // a line ending is a space
	} {
		require.Equal(t, tc.want, splitCodeSpans(tc.in), tc.in)
	}
}

func TestExtractLinks(t *testing.T) {
	block := "See [operating](operating.md), ![diagram](img/d.png \"title\") and\n" +
		"[the quick\nstart](../README.md#quick-start); [angle](<a b.md>), " +
		"[parens](x_(1).md), [same page](#config-reference).\n" +
		"`[in code](nope.md)` [empty]() [ref][r] https://example.com [web](https://example.com/x)\n" +
		"[r]: sinks.md#jsonl\n" +
		`<img src="docs/webui.png"> <a href="production.md#metrics">m</a>` + "\n" +
		`\[not a link](escaped.md) [![badge](b.svg)](target.md)`
	var dests []string
	var lines []int
	for _, l := range extractLinks(block) {
		dests = append(dests, l.dest)
		lines = append(lines, mdBlock{line: 10, text: block}.lineAt(l.off))
	}
	require.Equal(t, []string{"operating.md", "img/d.png", "../README.md#quick-start", "a b.md", "x_(1).md", "#config-reference",
		"https://example.com/x", "target.md", "b.svg", "sinks.md#jsonl", "docs/webui.png", "production.md#metrics"}, dests)
	require.Equal(t, []int{10, 10, 11, 12, 12, 12, 13, 16, 16, 14, 15, 15}, lines)
}

func TestBlocksSkipCodeAndJoinWrappedLines(t *testing.T) {
	d := parseMarkdown("x.md", "one\ntwo\n\n```\n[x](in-fence.md)\n```\nthree\n")
	require.Equal(t, []mdBlock{{line: 1, text: "one\ntwo"}, {line: 7, text: "three"}}, d.blocks(0, len(d.lines)))
}

func TestSections(t *testing.T) {
	d := parseMarkdown("x.md", "# T\n## A\n### A.1\ntext\n## B\nb\n### B.1\n# U\n")
	from, to, ok := d.section(2, "a")
	require.True(t, ok)
	require.Equal(t, [2]int{1, 4}, [2]int{from, to}) // lines 2-4: A up to B
	from, to, ok = d.section(2, "B")
	require.True(t, ok)
	require.Equal(t, [2]int{4, 7}, [2]int{from, to}) // up to the level-1 U
	_, _, ok = d.section(2, "A.1")
	require.False(t, ok)
}

func TestTableRows(t *testing.T) {
	d := parseMarkdown("x.md", `| field | type |
| --- | :-: |
| `+"`batch.maxWait`"+` | duration |
| `+"`a|b`"+` | pipe in code \| and escaped |
not a row

a | b
--|--
c | d
`)
	rows := d.tableRows(0, len(d.lines))
	require.Equal(t, []tableRow{
		{line: 3, cells: []string{"`batch.maxWait`", "duration"}},
		{line: 4, cells: []string{"`a|b`", `pipe in code \| and escaped`}},
		{line: 9, cells: []string{"c", "d"}},
	}, rows)
}
