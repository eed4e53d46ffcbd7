package repocheck

import (
	"regexp"
	"strings"
)

// Inline markdown, for the docs checks: code spans, the plain text of a
// heading, link destinations, table rows.

var (
	imageRe      = regexp.MustCompile(`!\[[^\]]*\]\([^)]*\)`)
	inlineLinkRe = regexp.MustCompile(`\[([^\]]*)\](?:\([^)]*\)|\[[^\]]*\])`)
	htmlTagRe    = regexp.MustCompile(`</?[A-Za-z][^>]*>`)
	escapeRe     = regexp.MustCompile("\\\\([!-/:-@\\[-`{-~])")
	// Emphasis with underscores, which (unlike an underscore inside a
	// word) the slug would otherwise keep.
	underscoreEmRe = regexp.MustCompile(`(^|[\s\pP])_+([^\s_](?:[^_]*[^\s_])?)_+([\s\pP]|$)`)
)

// plainText renders a heading's inline markdown as GitHub's anchor sees
// it: code spans' content verbatim; links by their text; images, HTML tags
// and emphasis markers gone; backslash escapes resolved.
func plainText(s string) string {
	var b strings.Builder
	for _, sp := range splitCodeSpans(s) {
		if sp.code {
			b.WriteString(sp.text)
			continue
		}
		t := imageRe.ReplaceAllString(sp.text, "")
		t = inlineLinkRe.ReplaceAllString(t, "$1")
		t = htmlTagRe.ReplaceAllString(t, "")
		t = underscoreEmRe.ReplaceAllString(t, "$1$2$3")
		t = strings.NewReplacer("**", "", "*", "", "~~", "").Replace(t)
		b.WriteString(escapeRe.ReplaceAllString(t, "$1"))
	}
	return strings.TrimSpace(b.String())
}

// span is a piece of inline text: a code span's content, or the text
// between code spans; off is where it starts in the input (the code
// span's opening backticks).
type span struct {
	text string
	code bool
	off  int
	end  int // offset just past it (past a code span's closing backticks)
}

// splitCodeSpans cuts s into text and code spans. A run of n backticks
// opens a code span that the next run of exactly n closes; one with no
// closing run is literal text. A code span's content loses one space at
// each end when it has one at both; line endings count as spaces.
func splitCodeSpans(s string) []span {
	var out []span
	textStart := 0
	for i := 0; i < len(s); {
		switch {
		case s[i] == '\\':
			i += 2 // an escaped backtick opens nothing
			continue
		case s[i] != '`':
			i++
			continue
		}
		n := runLen(s[i:], '`')
		closeAt := -1
		for j := i + n; j < len(s); {
			if s[j] != '`' {
				j++
				continue
			}
			m := runLen(s[j:], '`')
			if m == n {
				closeAt = j
				break
			}
			j += m
		}
		if closeAt < 0 {
			i += n
			continue
		}
		if textStart < i {
			out = append(out, span{text: s[textStart:i], off: textStart, end: i})
		}
		content := strings.ReplaceAll(s[i+n:closeAt], "\n", " ")
		if len(content) >= 2 && content[0] == ' ' && content[len(content)-1] == ' ' && strings.TrimSpace(content) != "" {
			content = content[1 : len(content)-1]
		}
		out = append(out, span{text: content, code: true, off: i, end: closeAt + n})
		i = closeAt + n
		textStart = i
	}
	if textStart < len(s) {
		out = append(out, span{text: s[textStart:], off: textStart, end: len(s)})
	}
	return out
}

// maskCode returns s with every code span's bytes (backticks included)
// replaced by fill, line endings kept, so offsets still index s.
func maskCode(s string, fill byte) string {
	b := []byte(s)
	for _, sp := range splitCodeSpans(s) {
		if !sp.code {
			continue
		}
		for i := sp.off; i < sp.end; i++ {
			if b[i] != '\n' {
				b[i] = fill
			}
		}
	}
	return string(b)
}

// mdLink is a link destination as written, and where.
type mdLink struct {
	dest string
	off  int // in the block
}

var (
	refDefRe   = regexp.MustCompile(`(?m)^ {0,3}\[([^\]^][^\]]*)\]:[ \t]*(?:<([^>\n]*)>|(\S+))`)
	htmlLinkRe = regexp.MustCompile(`(?i)<(?:a|img|source)\b[^>]*?\s(?:href|src)\s*=\s*["']([^"']*)["']`)
)

// extractLinks returns a block's link destinations: inline links and
// images ([x](dest), ![x](dest)), reference definitions ([x]: dest) and
// HTML href/src attributes. Text in code spans holds none.
func extractLinks(block string) []mdLink {
	s := maskCode(block, 'x')
	var out []mdLink
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '[':
			j := closingBracket(s, i)
			if j < 0 || j+1 >= len(s) || s[j+1] != '(' {
				continue
			}
			if dest, ok := linkDest(s, j+2); ok && dest != "" {
				out = append(out, mdLink{dest: dest, off: i})
			}
		}
	}
	for _, m := range refDefRe.FindAllStringSubmatchIndex(s, -1) {
		dest := ""
		if m[4] >= 0 {
			dest = s[m[4]:m[5]]
		} else {
			dest = s[m[6]:m[7]]
		}
		out = append(out, mdLink{dest: dest, off: m[0]})
	}
	for _, m := range htmlLinkRe.FindAllStringSubmatchIndex(s, -1) {
		out = append(out, mdLink{dest: s[m[2]:m[3]], off: m[0]})
	}
	return out
}

// closingBracket returns the index of the ']' that closes the '[' at i,
// or -1.
func closingBracket(s string, i int) int {
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '[':
			depth++
		case ']':
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return -1
}

// linkDest parses "dest "title")" from k, just past a link's '(': the
// destination (in <> or bare, with balanced parentheses), an optional
// title, then ')'.
func linkDest(s string, k int) (string, bool) {
	skip := func() {
		for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n') {
			k++
		}
	}
	skip()
	var dest string
	if k < len(s) && s[k] == '<' {
		end := strings.IndexAny(s[k:], ">\n")
		if end < 0 || s[k+end] != '>' {
			return "", false
		}
		dest, k = s[k+1:k+end], k+end+1
	} else {
		start, depth := k, 0
	loop:
		for ; k < len(s); k++ {
			switch c := s[k]; {
			case c == '\\':
				k++
			case c == '(':
				depth++
			case c == ')' && depth == 0:
				break loop
			case c == ')':
				depth--
			case c <= ' ':
				break loop
			}
		}
		dest = s[start:min(k, len(s))]
	}
	skip()
	if k < len(s) && (s[k] == '"' || s[k] == '\'' || s[k] == '(') {
		closer := s[k]
		if closer == '(' {
			closer = ')'
		}
		end := strings.IndexByte(s[k+1:], closer)
		if end < 0 {
			return "", false
		}
		k += end + 2
		skip()
	}
	if k >= len(s) || s[k] != ')' {
		return "", false
	}
	return escapeRe.ReplaceAllString(dest, "$1"), true
}

// tableRow is a body row of a markdown table: its cells, trimmed, as
// written.
type tableRow struct {
	line  int // 1-based
	cells []string
}

var tableSepRe = regexp.MustCompile(`^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$`)

// tableRows returns the body rows of the tables on lines [from, to)
// (0-based): the lines after a delimiter row (|---|---|) that hold a '|',
// until one that does not.
func (d *mdDoc) tableRows(from, to int) []tableRow {
	var out []tableRow
	inTable := false
	for i := from; i < to; i++ {
		l := d.lines[i]
		switch {
		case l.fenced || !strings.Contains(l.text, "|"):
			inTable = false
		case tableSepRe.MatchString(l.text) && strings.Contains(l.text, "-") && i > from && strings.Contains(d.lines[i-1].text, "|"):
			inTable = true
		case inTable:
			out = append(out, tableRow{line: i + 1, cells: splitRow(l.text)})
		}
	}
	return out
}

// splitRow cuts a table row into cells at each '|' that is neither
// escaped nor in a code span.
func splitRow(row string) []string {
	row = strings.TrimSpace(row)
	masked := maskCode(row, 'x')
	var cells []string
	start := 0
	for i := 0; i < len(masked); i++ {
		switch masked[i] {
		case '\\':
			i++
		case '|':
			cells = append(cells, strings.TrimSpace(row[start:i]))
			start = i + 1
		}
	}
	cells = append(cells, strings.TrimSpace(row[start:]))
	if strings.HasPrefix(row, "|") {
		cells = cells[1:]
	}
	if strings.HasSuffix(row, "|") && len(cells) > 0 {
		cells = cells[:len(cells)-1]
	}
	return cells
}

// codeSpan is a code span's content and line.
type codeSpan struct {
	line int
	text string
}

// codeSpans returns the code spans on lines [from, to) (0-based) outside
// code blocks.
func (d *mdDoc) codeSpans(from, to int) []codeSpan {
	var out []codeSpan
	for _, b := range d.blocks(from, to) {
		for _, sp := range splitCodeSpans(b.text) {
			if sp.code {
				out = append(out, codeSpan{line: b.lineAt(sp.off), text: sp.text})
			}
		}
	}
	return out
}
