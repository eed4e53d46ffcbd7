package repocheck

import (
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/tabletflow/tabletflow/config"
)

// Check 3: the config reference (docs/operating.md) has a row for every
// JSON field of the config types, and none for a field they lack.

// configRoot is a config type and the dotted JSON path its fields sit
// under in a stream config ("" for the stream itself, "source" for a
// source adapter's section).
type configRoot struct {
	prefix string
	typ    reflect.Type
}

// configRoots lists the config types whose every JSON field needs a row
// in docs/operating.md's "## Config reference". An adapter's section type
// goes here with the section it fills, e.g.
//
//	{"source", reflect.TypeFor[tabletd.Config]()},
//	{"sink", reflect.TypeFor[jsonl.Config]()},
//
// its rows may sit in the reference's per-kind sub-section ("### Source:
// tabletd"); fields of two roots at the same path (source.kind) need one
// row between them. A root's field that another root goes inside (a
// section the stream types keep as raw JSON) needs no row of its own.
func configRoots() []configRoot {
	roots := []configRoot{{"", reflect.TypeFor[config.Stream]()}}
	for _, section := range []struct {
		name  string
		kinds map[string]config.Kind
	}{{"source", config.SourceKinds()}, {"sink", config.SinkKinds()}} {
		for _, name := range slices.Sorted(maps.Keys(section.kinds)) {
			roots = append(roots, configRoot{section.name, reflect.TypeOf(section.kinds[name].Config)})
		}
	}
	return roots
}

// configField is a JSON field of a config type, by its dotted path
// (exclude[].alias), and the Go field it is (config.Exclusion.Alias).
type configField struct {
	path   string
	goName string
	leaf   bool // a value, not an object or an array of objects
}

var (
	durationType = reflect.TypeFor[config.Duration]()
	timeType     = reflect.TypeFor[time.Time]()
)

// configFields returns the JSON fields of the roots: every path (objects
// and arrays of objects too, which a row may name) and the paths that
// need a row (the values).
func configFields(roots []configRoot) (all map[string]configField, required []configField) {
	all = map[string]configField{}
	for _, r := range roots {
		walkConfig(r.typ, r.prefix, "", all)
	}
	for _, f := range all {
		if !f.leaf {
			continue
		}
		inner := false
		for p := range all { // a value another root goes inside is a section, not a value
			if strings.HasPrefix(p, f.path+".") || strings.HasPrefix(p, f.path+"[]") {
				inner = true
				break
			}
		}
		if !inner {
			required = append(required, f)
		}
	}
	slices.SortFunc(required, func(a, b configField) int { return strings.Compare(a.path, b.path) })
	return all, required
}

// walkConfig adds the fields of t at path to out, as encoding/json sees
// them: exported fields by their json tag's name (the Go name when the
// tag has none), "-" skipped, embedded structs without a name flattened.
// Pointers are followed; structs and slices of structs are entered;
// config.Duration, time.Time, maps and slices of anything else are
// values.
func walkConfig(t reflect.Type, path, goName string, out map[string]configField) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	elem := t // a slice's element; else t itself
	if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
		elem = t.Elem()
		for elem.Kind() == reflect.Pointer {
			elem = elem.Elem()
		}
	}
	isObject := elem.Kind() == reflect.Struct && elem != durationType && elem != timeType
	if path != "" {
		out[path] = configField{path: path, goName: goName, leaf: !isObject}
	}
	if !isObject {
		return
	}
	if elem != t {
		path += "[]"
	}
	for i := range elem.NumField() {
		f := elem.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if name == "" && f.Anonymous && ft.Kind() == reflect.Struct {
			walkConfig(ft, path, goName, out) // promoted fields
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		p := name
		if path != "" {
			p = path + "." + name
		}
		walkConfig(f.Type, p, elem.String()+"."+f.Name, out)
	}
}

var codePathRe = regexp.MustCompile("^`([^`]+)`$")

// checkConfigReference checks docs/operating.md's "## Config reference"
// (its sub-sections included): every table row's first cell is a field's
// dotted JSON path in backticks that the config types have (arrays as
// [], a map as one row), no field has two rows in one (sub-)section, and
// every value field has a row.
func checkConfigReference(root string, roots []configRoot) []string {
	const file, title = "docs/operating.md", "Config reference"
	var p problems
	d, from, to, ok := loadSection(root, file, title, &p)
	if !ok {
		return p
	}
	all, required := configFields(roots)
	documented := map[string]bool{}
	seen := map[string]int{} // sub-section line + path -> the row's line
	for _, row := range d.tableRows(from, to) {
		m := codePathRe.FindStringSubmatch(row.cells[0])
		if m == nil {
			p.add(file, row.line, "row's first cell %q is not a field's dotted JSON path in backticks", row.cells[0])
			continue
		}
		path := strings.TrimSuffix(m[1], "[]")
		if _, ok := all[path]; !ok {
			p.add(file, row.line, "`%s`: no field of the config types (configRoots in internal/repocheck) has this path", m[1])
			continue
		}
		documented[path] = true
		key := fmt.Sprintf("%d %s", subsectionOf(d, row.line), path)
		if first, dup := seen[key]; dup {
			p.add(file, row.line, "`%s`: a second row in this section (the first is on line %d)", m[1], first)
		} else {
			seen[key] = row.line
		}
	}
	for _, f := range required {
		if !documented[f.path] {
			p.add(file, from+1, "`%s` (%s) has no row in \"## %s\"", f.path, f.goName, title)
		}
	}
	return p
}

// subsectionOf returns the line of the last heading at or before line.
func subsectionOf(d *mdDoc, line int) int {
	at := 0
	for _, h := range d.headings {
		if h.line <= line {
			at = h.line
		}
	}
	return at
}
