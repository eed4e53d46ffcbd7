package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// Typed mirror tables (sink.mirrorTypes "source"): a mirror table the sink
// makes for records that carry their source's column types
// (source.Record.Types) has each column of the source's type, where the
// sink's database has a type of that name; otherwise (an enum, a domain or
// an extension's type the sink's database lacks) text, the type's text
// form. Values are written as a given table's are (jsonb_populate_record:
// each as an input of its column's type would take it). As the source's
// table changes, the mirror table follows (followTypes):
//   - a column added gets the source's type;
//   - a column dropped at the source stays, and rows the tablet writes
//     from then on hold NULL in it;
//   - a column whose type changed is altered when every value of the old
//     type is one of the new (widens); a record whose column has a type
//     narrower than the mirror's is written as it is; any other change
//     fails the tablet (ErrBadRecord, naming the table and column), never
//     coercing a value.

// lookUpTypes learns the sink's type for each of a record's source type
// names it has not met (sinkType): the same name where the sink's
// database knows it, otherwise text. Names are looked up once per sink
// (again after forgetMirrors). s.mirrors.mu is held.
func (s *Sink) lookUpTypes(ctx context.Context, types map[string]string) error {
	if s.mirrors.sinkTypes == nil {
		s.mirrors.sinkTypes = map[string]string{}
	}
	var unknown []string
	for _, t := range types {
		if _, ok := s.mirrors.sinkTypes[t]; ok || slices.Contains(unknown, t) {
			continue
		}
		if !typeName.MatchString(t) || strings.Contains(t, "--") || strings.Contains(t, "/*") {
			s.mirrors.sinkTypes[t] = "text" // not a type name format_type gives ("???" for a type dropped since)
			continue
		}
		unknown = append(unknown, t)
	}
	if len(unknown) > 0 {
		var found []bool
		// to_regtype is NULL for a name the database has no type of; a
		// table's row type of that name is not the source's type either.
		err := s.pool.QueryRow(ctx, `SELECT array_agg(COALESCE((SELECT typtype <> 'c' FROM pg_type WHERE oid = to_regtype(t)), false) ORDER BY n)
			FROM unnest($1::text[]) WITH ORDINALITY AS u(t, n)`, unknown).Scan(&found)
		if err != nil {
			return fmt.Errorf("types of the sink's database: %w", classify(err))
		}
		for i, t := range unknown {
			s.mirrors.sinkTypes[t] = "text"
			if i < len(found) && found[i] {
				s.mirrors.sinkTypes[t] = t
			}
		}
	}
	return nil
}

// sinkType is the sink's type for a source's type name that lookUpTypes
// has met. s.mirrors.mu is held.
func (s *Sink) sinkType(source string) string { return s.mirrors.sinkTypes[source] }

// followTypes makes a typed mirror table take a record's columns (cols)
// and types: a column it lacks is added with the source's type, a column
// whose type the record widens is altered to it, and one it would narrow
// or change otherwise is ErrBadRecord. Changes go into edit()'s copy of m;
// m is read, column by column (each column read before it is changed).
// s.mirrors.mu is held.
func (s *Sink) followTypes(ctx context.Context, m *mirror, r source.Record, cols []string, edit func() *mirror) error {
	if err := s.lookUpTypes(ctx, r.Types); err != nil {
		return err
	}
	for _, c := range cols {
		typ, named := r.Types[c]
		if named {
			typ = s.sinkType(typ)
		} else { // a source that names no type for it
			typ = "jsonb"
		}
		col := pgx.Identifier{c}.Sanitize()
		have, ok := m.types[c]
		if ok && (!named || have == typ || widens(typ, have)) {
			continue // the type fits (another shard's records may not have a change yet)
		}
		// Another worker may have changed the column since it was read:
		// the table's lock held, its type now decides.
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `LOCK TABLE `+m.name+` IN SHARE ROW EXCLUSIVE MODE`); err != nil {
				return err
			}
			var live *string
			if err := tx.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
				WHERE attrelid = $1::regclass AND attname = $2 AND attnum > 0 AND NOT attisdropped`, m.name, c).Scan(&live); err != nil && err != pgx.ErrNoRows {
				return err
			}
			switch {
			case live == nil:
				_, err := tx.Exec(ctx, `ALTER TABLE `+m.name+` ADD COLUMN `+col+` `+typ)
				have = typ
				return err
			case *live == typ || widens(typ, *live):
				have = *live
				return nil
			case widens(*live, typ): // an assignment cast, which never cuts a value: no USING
				_, err := tx.Exec(ctx, `ALTER TABLE `+m.name+` ALTER COLUMN `+col+` TYPE `+typ)
				have = typ
				return err
			default:
				return fmt.Errorf("%w: %s at %s: column %s is %s at the source and %s in the mirror table %s, and not every value of one is a value of the other: the sink does not coerce data (alter the mirror table's column by hand, or drop the table and resync the stream's tablets)",
					sink.ErrBadRecord, r.Table, r.Position, c, r.Types[c], *live, m.name)
			}
		})
		if errors.Is(err, sink.ErrBadRecord) {
			return err
		}
		if err != nil {
			return fmt.Errorf("column %s of %s as %s: %w", c, m.name, typ, classify(err))
		}
		e := edit()
		if !ok && !slices.Contains(e.ins, c) {
			e.ins = append(e.ins, c)
		}
		e.cols[c], e.types[c] = true, have
	}
	return nil
}

// droppedAsNull gives an insert or update of a typed mirror table NULL in
// each column the record's table no longer has at the source (dropped
// there): the row is as the source has it, less that column. m is not
// changed (a cached mirror is read without the lock: clone).
func droppedAsNull(m *mirror, r source.Record, cols []string, after map[string]json.RawMessage) []string {
	// A copy's rows carry the columns as its copy began: a column added
	// since is not one dropped.
	if !m.typed || r.Types == nil || r.Op == source.Delete || r.Op == source.Read {
		return cols
	}
	for _, c := range slices.Sorted(maps.Keys(m.cols)) {
		if _, there := r.Types[c]; !there && c != ownerCol && !slices.Contains(cols, c) {
			cols = append(slices.Clip(cols), c)
			after[c] = []byte("null")
		}
	}
	return cols
}

var (
	// typeName: what format_type writes (quoted identifiers, a schema, a
	// modifier, array brackets), and nothing that ends a statement.
	typeName    = regexp.MustCompile(`^[\pL\pN_ ."(),\[\]$]+$`)
	varcharType = regexp.MustCompile(`^character varying(?:\((\d+)\))?$`)
	numericType = regexp.MustCompile(`^numeric(?:\((\d+),(\d+)\))?$`)
)

// integerRank orders the integer types and numeric by the values they
// hold: each holds every value of those before it.
var integerRank = map[string]int{"smallint": 1, "integer": 2, "bigint": 3, "numeric": 4}

// widens tells whether every value of type from (as format_type names it)
// is a value of type to, unchanged: a wider integer, double precision for
// real, a longer or unbounded varchar or text, a numeric with as many
// digits before and after the point (or unconstrained).
func widens(from, to string) bool {
	if from == to {
		return true
	}
	if a, b := integerRank[from], integerRank[to]; a > 0 && b > 0 {
		return a < b
	}
	if from == "real" && to == "double precision" {
		return true
	}
	if v := varcharType.FindStringSubmatch(from); v != nil || from == "text" {
		if to == "text" || to == "character varying" {
			return true
		}
		w := varcharType.FindStringSubmatch(to)
		return v != nil && v[1] != "" && w != nil && w[1] != "" && atoi(w[1]) >= atoi(v[1])
	}
	n := numericType.FindStringSubmatch(from)
	digits := map[string]int{"smallint": 5, "integer": 10, "bigint": 19}[from]
	if n != nil && n[1] != "" || digits > 0 {
		w := numericType.FindStringSubmatch(to)
		switch {
		case w == nil:
			return false
		case w[1] == "":
			return true // unconstrained numeric
		case digits > 0: // an integer into numeric(p, s): fits when it has the digits
			return atoi(w[1])-atoi(w[2]) >= digits
		default:
			return atoi(w[2]) >= atoi(n[2]) && atoi(w[1])-atoi(w[2]) >= atoi(n[1])-atoi(n[2])
		}
	}
	return false
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
