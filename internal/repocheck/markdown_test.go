package repocheck

import (
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// This file reads markdown as far as the docs checks need it, and no
// further: fenced code blocks, headings and their GitHub anchors, code
// spans, links and table rows. It follows CommonMark and GitHub where the
// docs could tell the difference and stays simple where they could not
// (a fence may be indented any amount; code spans are paired within one
// paragraph).

// mdDoc is one markdown file.
type mdDoc struct {
	path     string // as problems name it: relative to the repository root
	lines    []mdLine
	headings []mdHeading
	anchors  map[string]bool // heading slugs and explicit HTML ids
}

// mdLine is one line of a file, HTML comments blanked.
type mdLine struct {
	text   string
	fenced bool // in a fenced code block (the fences included)
	fence  bool // an opening or closing fence itself
}

// mdHeading is an ATX (## x) or setext (x / ---) heading.
type mdHeading struct {
	line  int    // 1-based
	level int    // 1 to 6
	raw   string // as written, without the #s
	text  string // as rendered: inline markup gone, code spans' content kept
	slug  string // GitHub's anchor, with -1, -2 for repeated headings
}

// mdBlock is a run of non-blank lines outside code blocks (a paragraph, a
// table, a list item): links and code spans may wrap inside one.
type mdBlock struct {
	line int // of its first line, 1-based
	text string
}

// lineAt is the 1-based line of byte offset off in the block.
func (b mdBlock) lineAt(off int) int { return b.line + strings.Count(b.text[:off], "\n") }

var (
	atxRe      = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$`)
	atxCloseRe = regexp.MustCompile(`(?:^|[ \t]+)#+$`)
	setextRe   = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	// A line a setext underline cannot turn into a heading: a list item, a
	// quote, a table row (the underline is then a thematic break).
	notParagraphRe = regexp.MustCompile(`^\s*(?:[-*+][ \t]|\d+[.)][ \t]|>|\|)`)
	htmlIDRe       = regexp.MustCompile(`(?i)<[a-z][^>]*?\s(?:id|name)\s*=\s*["']([^"']+)["']`)
)

// parseMarkdown reads src; path names the file in problems.
func parseMarkdown(path, src string) *mdDoc {
	d := &mdDoc{path: path, anchors: map[string]bool{}}
	raw := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	var fenceChar byte
	var fenceLen int
	inComment := false
	for _, text := range raw {
		l := mdLine{text: text}
		trimmed := strings.TrimLeft(text, " \t")
		switch {
		case fenceLen > 0:
			l.fenced = true
			if n := runLen(trimmed, fenceChar); n >= fenceLen && strings.TrimSpace(trimmed[n:]) == "" {
				l.fence, fenceLen = true, 0
			}
		case !inComment && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			c := trimmed[0]
			n := runLen(trimmed, c)
			if c == '~' || !strings.Contains(trimmed[n:], "`") { // a backtick fence's info string has no backtick
				l.fenced, l.fence, fenceChar, fenceLen = true, true, c, n
			}
		}
		if !l.fenced {
			l.text, inComment = blankComments(l.text, inComment)
		}
		d.lines = append(d.lines, l)
	}
	d.findHeadings()
	return d
}

func runLen(s string, c byte) int {
	n := 0
	for n < len(s) && s[n] == c {
		n++
	}
	return n
}

// blankComments removes HTML comments from a line; inComment says whether
// the line starts inside one, and the result whether the next does.
func blankComments(s string, inComment bool) (string, bool) {
	var b strings.Builder
	for s != "" {
		if inComment {
			i := strings.Index(s, "-->")
			if i < 0 {
				return b.String(), true
			}
			s, inComment = s[i+3:], false
			continue
		}
		i := strings.Index(s, "<!--")
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		s, inComment = s[i+4:], true
	}
	return b.String(), inComment
}

func (d *mdDoc) findHeadings() {
	slugs := newSlugger()
	add := func(line, level int, raw string) {
		h := mdHeading{line: line, level: level, raw: raw, text: plainText(raw)}
		h.slug = slugs.slug(h.text)
		d.anchors[h.slug] = true
		d.headings = append(d.headings, h)
	}
	underline := map[int]bool{} // lines that underline a setext heading
	for i, l := range d.lines {
		if l.fenced || underline[i] {
			continue
		}
		for _, m := range htmlIDRe.FindAllStringSubmatch(l.text, -1) {
			d.anchors[m[1]] = true
		}
		if m := atxRe.FindStringSubmatch(l.text); m != nil {
			add(i+1, len(m[1]), atxCloseRe.ReplaceAllString(m[2], ""))
			continue
		}
		// A setext heading: a paragraph line underlined with = or -.
		if i+1 == len(d.lines) || d.lines[i+1].fenced || strings.TrimSpace(l.text) == "" || notParagraphRe.MatchString(l.text) {
			continue
		}
		if m := setextRe.FindStringSubmatch(d.lines[i+1].text); m != nil {
			level := 2
			if m[1][0] == '=' {
				level = 1
			}
			add(i+1, level, strings.TrimSpace(l.text))
			underline[i+1] = true
		}
	}
}

// blocks returns the runs of non-blank lines outside code blocks in lines
// [from, to) (0-based).
func (d *mdDoc) blocks(from, to int) []mdBlock {
	var out []mdBlock
	var cur []string
	start := 0
	flush := func() {
		if len(cur) > 0 {
			out = append(out, mdBlock{line: start + 1, text: strings.Join(cur, "\n")})
			cur = nil
		}
	}
	for i := from; i < to; i++ {
		l := d.lines[i]
		if l.fenced || strings.TrimSpace(l.text) == "" {
			flush()
			continue
		}
		if len(cur) == 0 {
			start = i
		}
		cur = append(cur, l.text)
	}
	flush()
	return out
}

// section returns the lines [from, to) (0-based) of the heading of the
// given level whose text is title (case aside), up to the next heading of
// that level or above; ok is false when there is none.
func (d *mdDoc) section(level int, title string) (from, to int, ok bool) {
	for i, h := range d.headings {
		if h.level != level || !strings.EqualFold(h.text, title) {
			continue
		}
		to = len(d.lines)
		for _, next := range d.headings[i+1:] {
			if next.level <= level {
				to = next.line - 1
				break
			}
		}
		return h.line - 1, to, true
	}
	return 0, 0, false
}

// headingsIn returns the headings on lines [from, to) (0-based).
func (d *mdDoc) headingsIn(from, to int) []mdHeading {
	var out []mdHeading
	for _, h := range d.headings {
		if h.line-1 >= from && h.line-1 < to {
			out = append(out, h)
		}
	}
	return out
}

// slugger gives headings GitHub's anchors (github-slugger's algorithm): a
// repeated slug gets -1, -2, ... and a suffixed slug that is taken
// already is skipped.
type slugger struct{ seen map[string]int }

func newSlugger() *slugger { return &slugger{seen: map[string]int{}} }

func (s *slugger) slug(text string) string {
	base := githubSlug(text)
	result := base
	for {
		if _, taken := s.seen[result]; !taken {
			break
		}
		s.seen[base]++
		result = base + "-" + strconv.Itoa(s.seen[base])
	}
	s.seen[result] = 0
	return result
}

// githubSlug is a heading's anchor without the repeat suffix: lower case;
// letters, digits, '-' and '_' kept; each space a '-'; everything else
// (punctuation, symbols, tabs) dropped.
func githubSlug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
