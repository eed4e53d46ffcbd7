package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Check 2: every make target the docs name is a target of the Makefile.

// checkMakeTargets checks that every `make <target>` the docs name is a
// target of the Makefile.
func checkMakeTargets(root string) []string {
	var p problems
	src, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		p.add("Makefile", 0, "%v", err)
		return p
	}
	targets := makefileTargets(string(src))
	_, docs := loadDocs(root, &p)
	for _, d := range docs {
		for _, m := range makeMentions(d) {
			switch {
			case targets[m.target]:
			case !m.prose:
				p.add(d.path, m.line, "make %s: the Makefile has no target %q", m.target, m.target)
			case looksLikeTarget(m.target, targets):
				p.add(d.path, m.line, "make %s: the Makefile has no target %q (if this is the verb, reword it or add %q to englishAfterMake in internal/repocheck)", m.target, m.target, m.target)
			}
		}
	}
	return p
}

// looksLikeTarget reports whether a word after "make" in running text,
// not a target, still reads as a meant one rather than as English ("make
// inconsistent storage fit"): a name with a '-', '_' or digit in it
// (demo-pg), or one letter away from a target (tset).
func looksLikeTarget(word string, targets map[string]bool) bool {
	if strings.ContainsAny(word, "-_0123456789") {
		return true
	}
	for t := range targets {
		if len(word) >= 4 && editDistance(word, t) <= 1 {
			return true
		}
	}
	return false
}

// makefileTargets returns the targets of a Makefile's rules: the names
// before the ':' of each rule line, less special targets (.PHONY) and
// names made of variables or patterns ($(BIN)/temporal, %.o). Recipe
// lines, assignments (=, :=, ::=, ?=, +=, !=), conditionals, define
// bodies and comments are not rules.
func makefileTargets(src string) map[string]bool {
	targets := map[string]bool{}
	var logical []string
	var cur strings.Builder
	for _, line := range strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n") {
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	inDefine := false
	for _, line := range logical {
		first, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch {
		case inDefine:
			inDefine = first != "endef"
			continue
		case first == "define" || (first == "export" || first == "override") && strings.HasPrefix(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), first)), "define"):
			inDefine = true
			continue
		case strings.HasPrefix(line, "\t"), strings.TrimSpace(line) == "", strings.HasPrefix(strings.TrimSpace(line), "#"):
			continue
		}
		switch first {
		case "ifeq", "ifneq", "ifdef", "ifndef", "else", "endif", "include", "-include", "sinclude", "vpath", "unexport":
			continue
		}
		line, _, _ = strings.Cut(line, "#")
		colon := strings.IndexByte(line, ':')
		eq := strings.IndexByte(line, '=')
		if colon < 0 || (eq >= 0 && eq < colon) || strings.HasPrefix(line[colon:], ":=") || strings.HasPrefix(line[colon:], "::=") || strings.HasPrefix(line[colon:], ":::=") {
			continue // no rule, or an assignment
		}
		for _, name := range strings.Fields(line[:colon]) {
			if !strings.HasPrefix(name, ".") && !strings.ContainsAny(name, "$%") {
				targets[name] = true
			}
		}
	}
	return targets
}

// makeMention is a make target a doc names.
type makeMention struct {
	line   int
	target string
	// prose: read from running text (or a comment), where "make" may be
	// the verb: a word that is not a target is reported only when it
	// looks like one (looksLikeTarget).
	prose bool
}

var (
	makeWordRe     = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])make(?:[ \t\n]+|$)`)
	envAssignRe    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*[:+?]?=`)
	targetRe       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_./-]*$`)
	proseWordRe    = regexp.MustCompile(`^[a-z][a-z0-9_.-]*`)
	shellCommentRe = regexp.MustCompile(`(?:^|\s)#`)
)

// englishAfterMake: words that follow the verb "make" in running text
// ("make sure", "make the tables"); there they are not targets.
var englishAfterMake = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`a an the it its it's them they this that these those one ones some any
		all each every both either no none more most less fewer few many much other others another
		our your their his her him us me you we sure up use room sense progress way certain clear
		changes change for to of so such and or but with without in on at by as if when then than
		there here what which who how whatever whichever new own target targets is are be do does
		calls call copies copy room space time way work workers tablets records about`) {
		englishAfterMake[w] = true
	}
}

// makeMentions returns the make targets a doc names: in code spans and
// code blocks (`make demo`, `make bench FUZZTIME=5m`,
// `X=y make demo-postgres`, `cd x && make test`: every target after make,
// its variables and flags skipped), and in running text and shell
// comments ("run make demo"), where only the word after make counts and a
// common English word after the verb ("make sure") does not. A make with
// -C or -f runs another Makefile and is passed over.
func makeMentions(d *mdDoc) []makeMention {
	var out []makeMention
	for i, l := range d.lines {
		if l.fenced && !l.fence {
			out = append(out, codeMakeMentions(l.text, i+1)...)
		}
	}
	for _, b := range d.blocks(0, len(d.lines)) {
		for _, sp := range splitCodeSpans(b.text) {
			if sp.code {
				out = append(out, codeMakeMentions(sp.text, b.lineAt(sp.off))...)
			}
		}
		prose := maskCode(b.text, 0)
		for _, m := range makeWordRe.FindAllStringIndex(prose, -1) {
			if t := proseTarget(prose[m[1]:]); t != "" {
				out = append(out, makeMention{line: b.lineAt(makeAt(prose, m)), target: t, prose: true})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b makeMention) int { return a.line - b.line })
	return out
}

// codeMakeMentions reads the make commands of a line of code.
func codeMakeMentions(text string, line int) []makeMention {
	var out []makeMention
	for _, m := range makeWordRe.FindAllStringIndex(text, -1) {
		rest := text[m[1]:]
		if !commandPosition(text[:makeAt(text, m)]) {
			if t := proseTarget(rest); t != "" {
				out = append(out, makeMention{line: line, target: t, prose: true})
			}
			continue
		}
		for _, t := range commandTargets(rest) {
			out = append(out, makeMention{line: line, target: t})
		}
	}
	return out
}

// makeAt returns where the word make starts in a match of makeWordRe,
// which may include the character before it.
func makeAt(s string, m []int) int { return m[0] + strings.Index(s[m[0]:m[1]], "make") }

// commandPosition reports whether a command starts after prefix: at the
// start of the line or a prompt, after a shell operator, or after
// variable assignments or sudo/env/time before it. Not in a comment.
func commandPosition(prefix string) bool {
	if shellCommentRe.MatchString(prefix) {
		return false
	}
	words := strings.Fields(prefix)
	for len(words) > 0 {
		w := words[len(words)-1]
		if !envAssignRe.MatchString(w) && w != "sudo" && w != "env" && w != "time" && w != "nohup" && w != "exec" {
			break
		}
		words = words[:len(words)-1]
	}
	if len(words) == 0 {
		return true
	}
	w := words[len(words)-1]
	for _, op := range []string{"&&", "||", ";", "|", "(", "{"} {
		if strings.HasSuffix(w, op) {
			return true
		}
	}
	return w == "$" || w == ">" || w == "then" || w == "do" || w == "else"
}

// commandTargets returns the targets of a make command's arguments, up to
// the end of the command.
func commandTargets(args string) []string {
	var out []string
	toks := strings.Fields(args)
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if strings.HasPrefix(t, "&&") || strings.HasPrefix(t, "||") || strings.ContainsAny(t[:1], ";|#)><`") || strings.HasPrefix(t, "2>") {
			break
		}
		last := strings.IndexAny(t, ";)|&") > 0
		if last {
			t = t[:strings.IndexAny(t, ";)|&")]
		}
		switch {
		case t == "-C" || t == "-f" || strings.HasPrefix(t, "--directory") || strings.HasPrefix(t, "--file") || strings.HasPrefix(t, "--makefile") || strings.HasPrefix(t, "-C") || strings.HasPrefix(t, "-f"):
			return nil // another Makefile
		case t == "-j" || t == "-l":
			if i+1 < len(toks) && strings.Trim(toks[i+1], "0123456789.") == "" {
				i++
			}
		case t == "-o" || t == "-W" || t == "-I":
			i++
		case strings.HasPrefix(t, "-"), envAssignRe.MatchString(t):
		default:
			if t = strings.TrimRight(t, ".,:"); targetRe.MatchString(t) {
				out = append(out, t)
			}
		}
		if last {
			break
		}
	}
	return out
}

// proseTarget returns the word after "make" in running text when it may
// be a target: lower case, not a common English word after the verb.
func proseTarget(rest string) string {
	for {
		rest = strings.TrimLeft(rest, " \t\n")
		tok, _, _ := strings.Cut(rest, " ")
		if !envAssignRe.MatchString(tok) {
			break
		}
		rest = rest[len(tok):]
	}
	w := strings.TrimRight(proseWordRe.FindString(rest), ".-_")
	if w == "" || englishAfterMake[w] {
		return ""
	}
	return w
}
