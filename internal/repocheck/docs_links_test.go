package repocheck

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// Check 1: every relative link and #anchor in the docs resolves.

// schemeRe: a URL with a scheme (https:, mailto:, ...), not a repository
// path; such links are not checked.
var schemeRe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)

// checkLinks checks that every relative link in README.md and docs/
// names a file or directory of the repository and that every #anchor
// into a markdown file matches one of its headings (or an HTML id).
// Links outside code are checked; links with a scheme (http, https,
// mailto) are not. An anchor into a file that is not markdown
// (main.go#L10) is not checked: the file must exist.
func checkLinks(root string) []string {
	var p problems
	set, docs := loadDocs(root, &p)
	for _, d := range docs {
		for _, b := range d.blocks(0, len(d.lines)) {
			for _, l := range extractLinks(b.text) {
				if msg := set.resolve(d.path, l.dest); msg != "" {
					p.add(d.path, b.lineAt(l.off), "link %q: %s", l.dest, msg)
				}
			}
		}
	}
	return p
}

// resolve returns what is wrong with a link from the file from, or "".
func (s *docSet) resolve(from, dest string) string {
	if schemeRe.MatchString(dest) || strings.HasPrefix(dest, "//") {
		return ""
	}
	target, frag, hasFrag := strings.Cut(dest, "#")
	target, _, _ = strings.Cut(target, "?")
	target, err := url.PathUnescape(target)
	if err != nil {
		return fmt.Sprintf("bad escape: %v", err)
	}
	switch {
	case target == "":
		target = from
	case strings.HasPrefix(target, "/"):
		return "an absolute path; link relative to this file"
	default:
		target = path.Join(path.Dir(from), target)
		if target == ".." || strings.HasPrefix(target, "../") {
			return "points outside the repository"
		}
	}
	info, err := os.Stat(filepath.Join(s.root, filepath.FromSlash(target)))
	if err != nil {
		return fmt.Sprintf("no file or directory %s in the repository", target)
	}
	if !hasFrag || info.IsDir() || !strings.EqualFold(path.Ext(target), ".md") {
		return ""
	}
	if f, err := url.PathUnescape(frag); err == nil {
		frag = f
	}
	d, err := s.load(target)
	if err != nil {
		return err.Error()
	}
	if d.anchors[frag] {
		return ""
	}
	msg := fmt.Sprintf("no heading of %s has the anchor #%s", target, frag)
	if near := nearestAnchor(d, frag); near != "" {
		msg += fmt.Sprintf(" (did you mean #%s?)", near)
	}
	return msg
}

// nearestAnchor returns the document's anchor closest to frag by edit
// distance, if close enough to be a likely typo or a renamed heading.
func nearestAnchor(d *mdDoc, frag string) string {
	best, bestDist := "", max(3, len(frag)/3)+1
	for _, h := range d.headings {
		if dist := editDistance(h.slug, frag); dist < bestDist || (strings.Contains(h.slug, frag) && best == "") {
			best, bestDist = h.slug, dist
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
