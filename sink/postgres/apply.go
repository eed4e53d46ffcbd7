package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// Apply mode keeps, for each source table, a mirror table holding the
// source's current rows. By default it is a table the sink makes in its
// schema: one jsonb column per field of the records' key and after images,
// the key's fields as its primary key, columns added as records bring
// them. A source table given in the config (sink.tables) goes instead into
// that existing table, with its own column types and primary key: each
// value is converted from the record's JSON to its column's type, and
// records that do not fit it (another key, a column it lacks) are refused,
// the table never altered. Inserts and reads (a snapshot's rows) set a
// row, updates set the columns their after image carries (an unchanged
// TOAST value left out keeps its value), deletes remove it.
//
// Tables and columns are made in transactions of their own before the
// batch's; the rows are written in the batch's transaction, beside the
// checkpoint, so a batch whose rows do not fit (a mirror table keyed
// otherwise, a column of another type, a value its column's type or a
// constraint refuses) writes no row and moves no checkpoint; a table or
// column it made stays, empty.

// mirror is what the sink knows of one mirror table.
type mirror struct {
	name string   // quoted, qualified
	key  []string // primary key columns, in order
	cols map[string]bool
	// given: a table of the config's sink.tables (given, its entry there):
	// typed columns, never altered by the sink.
	given string
}

// mirrors caches the sink's mirror tables (per Sink instance).
type mirrors struct {
	mu sync.Mutex
	m  map[string]*mirror // by source table
}

// mirrorName is the mirror table of a source table: "public.orders" →
// public__orders, lower case, characters other than a-z, 0-9 and _ as _.
func mirrorName(table string) string {
	b := []byte(strings.ToLower(strings.ReplaceAll(table, ".", "__")))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	return string(b)
}

// fields returns a JSON object's keys in order, and its values.
func fields(raw json.RawMessage) ([]string, map[string]json.RawMessage, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, fmt.Errorf("not a JSON object")
	}
	var keys []string
	vals := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		k := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, err
		}
		if _, dup := vals[k]; !dup {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	return keys, vals, nil
}

// mirrorOf returns the mirror of a source table, making it (or the
// columns it lacks) when needed. Tables and columns are made in
// transactions of their own (IF NOT EXISTS: concurrent tablets may race to
// make them), so a batch's transaction only writes rows; a batch that then
// fails leaves at most an empty table or column behind.
func (s *Sink) mirrorOf(ctx context.Context, r source.Record, keyCols, cols []string) (*mirror, error) {
	s.mirrors.mu.Lock()
	defer s.mirrors.mu.Unlock()
	if s.mirrors.m == nil {
		s.mirrors.m = map[string]*mirror{}
	}
	m := s.mirrors.m[r.Table]
	if m == nil {
		var err error
		if target, ok := s.given[r.Table]; ok {
			m, err = s.loadGiven(ctx, r.Table, target)
		} else {
			m, err = s.makeMirror(ctx, r.Table, keyCols, cols)
		}
		if err != nil {
			return nil, err
		}
		s.mirrors.m[r.Table] = m
	}
	if m.given != "" {
		return m, m.fits(r.Table, keyCols, cols)
	}
	if !slices.Equal(m.key, keyCols) {
		return nil, fmt.Errorf("%w: mirror table %s is keyed by (%s), records of %s by (%s)",
			sink.ErrBadRecord, m.name, strings.Join(m.key, ", "), r.Table, strings.Join(keyCols, ", "))
	}
	for _, c := range cols {
		if m.cols[c] {
			continue
		}
		if _, err := s.pool.Exec(ctx, `ALTER TABLE `+m.name+` ADD COLUMN IF NOT EXISTS `+pgx.Identifier{c}.Sanitize()+` jsonb`); err != nil && !madeMeanwhile(err) {
			return nil, fmt.Errorf("add column %s to %s: %w", c, m.name, classify(err))
		}
		m.cols[c] = true
	}
	return m, nil
}

// makeMirror returns the sink's own mirror table of a source table,
// making it if it is not there.
func (s *Sink) makeMirror(ctx context.Context, table string, keyCols, cols []string) (*mirror, error) {
	name := pgx.Identifier{s.schema, mirrorName(table)}.Sanitize()
	m, err := s.loadMirror(ctx, name)
	if err != nil || len(m.cols) > 0 {
		return m, err
	}
	defs := make([]string, 0, len(cols)+1)
	for _, c := range cols {
		defs = append(defs, pgx.Identifier{c}.Sanitize()+" jsonb")
	}
	defs = append(defs, "PRIMARY KEY ("+quoteAll(keyCols)+")")
	if _, err := s.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+name+` (`+strings.Join(defs, ", ")+`)`); err != nil && !madeMeanwhile(err) {
		return nil, fmt.Errorf("create mirror table %s: %w", name, classify(err))
	}
	return s.loadMirror(ctx, name)
}

// loadGiven reads the table the config gives for a source table
// (target: schema.table, as config.Validate checked it). A table that is
// not there, or has no primary key to upsert on, is ErrBadRecord: the
// sink makes and alters only its own tables.
func (s *Sink) loadGiven(ctx context.Context, table, target string) (*mirror, error) {
	schema, name, _ := strings.Cut(target, ".")
	m, err := s.loadMirror(ctx, pgx.Identifier{schema, name}.Sanitize())
	if err != nil {
		return nil, err
	}
	m.given = fmt.Sprintf("sink.tables[%q]", table)
	switch {
	case len(m.cols) == 0:
		return nil, fmt.Errorf("%w: table %s of %s does not exist (or the sink's role cannot see it)", sink.ErrBadRecord, m.name, m.given)
	case len(m.key) == 0:
		return nil, fmt.Errorf("%w: table %s of %s has no primary key: records of %s are upserted by their key", sink.ErrBadRecord, m.name, m.given, table)
	}
	return m, nil
}

// fits checks that records of table, keyed by keyCols and carrying cols,
// fit a given table: its primary key is the records' key (the same
// columns, in any order), and it has every column they carry.
func (m *mirror) fits(table string, keyCols, cols []string) error {
	if !slices.Equal(slices.Sorted(slices.Values(m.key)), slices.Sorted(slices.Values(keyCols))) {
		return fmt.Errorf("%w: table %s of %s has the primary key (%s), records of %s are keyed by (%s)",
			sink.ErrBadRecord, m.name, m.given, strings.Join(m.key, ", "), table, strings.Join(keyCols, ", "))
	}
	var missing []string
	for _, c := range cols {
		if !m.cols[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: table %s of %s has no column %s for records of %s (the sink never alters a given table)",
			sink.ErrBadRecord, m.name, m.given, strings.Join(missing, ", "), table)
	}
	return nil
}

// loadMirror reads a mirror table's columns and primary key (none: the
// table does not exist).
func (s *Sink) loadMirror(ctx context.Context, name string) (*mirror, error) {
	m := &mirror{name: name, cols: map[string]bool{}}
	// indkey is an int2vector, numbered from 0.
	rows, err := s.pool.Query(ctx, `SELECT a.attname, array_position(i.indkey::int2[], a.attnum)
		FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, name)
	if err != nil {
		return nil, fmt.Errorf("read mirror table %s: %w", name, classify(err))
	}
	keyAt := map[int]string{}
	for rows.Next() {
		var col string
		var pos *int
		if err := rows.Scan(&col, &pos); err != nil {
			return nil, err
		}
		m.cols[col] = true
		if pos != nil {
			keyAt[*pos] = col
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range len(keyAt) {
		m.key = append(m.key, keyAt[i])
	}
	return m, nil
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// forgetMirrors drops the cached mirrors after a failed commit: a table
// may have changed under the cache (dropped, altered by hand), so the next
// batch reads them again.
func (s *Sink) forgetMirrors() {
	s.mirrors.mu.Lock()
	s.mirrors.m = nil
	s.mirrors.mu.Unlock()
}

// applyBatch makes the mirror tables and columns the records need and
// returns the statements that apply them, for the commit's transaction to
// send, and for each statement the record it applies (for errors). It
// runs before that transaction begins: making a table takes a connection
// of its own, which a writer must not wait for while it holds one in a
// transaction (with every connection of the pool held so, none would
// come).
func (s *Sink) applyBatch(ctx context.Context, recs []source.Record) (*pgx.Batch, []string, error) {
	b := &pgx.Batch{}
	what := make([]string, 0, len(recs))
	for _, r := range recs {
		keyCols, key, err := fields(r.Key)
		if err != nil || len(keyCols) == 0 {
			return nil, nil, fmt.Errorf("%w: key of %s at %s is not a JSON object with fields", sink.ErrBadRecord, r.Table, r.Position)
		}
		cols, after, err := fields(r.After)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: after of %s at %s: %v", sink.ErrBadRecord, r.Table, r.Position, err)
		}
		for _, k := range keyCols { // the key's fields are columns too
			if _, ok := after[k]; !ok && r.Op != source.Delete {
				cols = append(cols, k)
				if after == nil {
					after = map[string]json.RawMessage{}
				}
				after[k] = key[k]
			}
		}
		m, err := s.mirrorOf(ctx, r, keyCols, cols)
		if err != nil {
			return nil, nil, err
		}
		what = append(what, fmt.Sprintf("%s of %s at %s into %s", r.Op, r.Table, r.Position, m.name))
		if m.given != "" {
			q, arg, err := givenStatement(m, r.Op, keyCols, cols, key, after)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: %s at %s: %v", sink.ErrBadRecord, r.Table, r.Position, err)
			}
			b.Queue(q, arg)
			continue
		}
		where := make([]string, len(keyCols))
		args := make([]any, len(keyCols))
		for i, k := range keyCols {
			where[i] = fmt.Sprintf("%s = $%d::jsonb", pgx.Identifier{k}.Sanitize(), i+1)
			args[i] = string(key[k])
		}
		if r.Op == source.Delete {
			b.Queue(`DELETE FROM `+m.name+` WHERE `+strings.Join(where, " AND "), args...)
			continue
		}
		names := make([]string, len(cols))
		vals := make([]string, len(cols))
		args = args[:0]
		for i, c := range cols {
			names[i], vals[i] = pgx.Identifier{c}.Sanitize(), fmt.Sprintf("NULLIF($%d::jsonb, 'null'::jsonb)", i+1) // JSON null: SQL NULL
			args = append(args, string(after[c]))
		}
		b.Queue(`INSERT INTO `+m.name+` (`+strings.Join(names, ", ")+`) VALUES (`+strings.Join(vals, ", ")+`)`+onConflict(keyCols, cols), args...)
	}
	return b, what, nil
}

// onConflict is an upsert's ON CONFLICT clause: the key's row gets the
// other columns.
func onConflict(keyCols, cols []string) string {
	var sets []string
	for _, c := range cols {
		if !slices.Contains(keyCols, c) {
			q := pgx.Identifier{c}.Sanitize()
			sets = append(sets, q+" = EXCLUDED."+q)
		}
	}
	if len(sets) == 0 {
		return " ON CONFLICT (" + quoteAll(keyCols) + ") DO NOTHING"
	}
	return " ON CONFLICT (" + quoteAll(keyCols) + ") DO UPDATE SET " + strings.Join(sets, ", ")
}

// givenStatement is the statement that applies one record to a given
// table, and its one argument, a JSON object of the record's columns.
// jsonb_populate_record converts each field to its column's type as an
// input of that type would (the table's row type: its column types with
// their modifiers, so a string too long for a varchar(n) is an error where
// an explicit cast would cut it; a JSON array into an array column); a
// json or jsonb column takes the JSON value itself, and a JSON null is SQL
// NULL. A value its column's type does not take fails the statement (a
// class 22 error: ErrBadRecord).
func givenStatement(m *mirror, op source.Op, keyCols, cols []string, key, after map[string]json.RawMessage) (string, string, error) {
	row := "jsonb_populate_record(NULL::" + m.name + ", $1::jsonb) AS r"
	if op == source.Delete {
		where := make([]string, len(keyCols))
		for i, k := range keyCols {
			q := pgx.Identifier{k}.Sanitize()
			where[i] = "m." + q + " = r." + q
		}
		arg, err := json.Marshal(key)
		return `DELETE FROM ` + m.name + ` AS m USING ` + row + ` WHERE ` + strings.Join(where, " AND "), string(arg), err
	}
	names := make([]string, len(cols))
	vals := make([]string, len(cols))
	for i, c := range cols {
		names[i] = pgx.Identifier{c}.Sanitize()
		vals[i] = "r." + names[i]
	}
	arg, err := json.Marshal(after)
	return `INSERT INTO ` + m.name + ` (` + strings.Join(names, ", ") + `) SELECT ` + strings.Join(vals, ", ") +
		` FROM ` + row + onConflict(keyCols, cols), string(arg), err
}
