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

// Apply mode keeps, for each source table, a mirror table in the sink's
// schema holding the source's current rows: one jsonb column per field of
// the records' key and after images, the key's fields as its primary key.
// Inserts and reads (a snapshot's rows) set a row, updates set the columns
// their after image carries (an unchanged TOAST value left out keeps its
// value), deletes remove it. Tables and columns are made as records bring
// them; the rows are written in the batch's transaction, so a batch that
// does not fit (a mirror table keyed otherwise, a column of another type)
// fails whole, no row written.

// mirror is what the sink knows of one mirror table.
type mirror struct {
	name string   // quoted, qualified
	key  []string // primary key columns, in order
	cols map[string]bool
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
		name := pgx.Identifier{s.schema, mirrorName(r.Table)}.Sanitize()
		var err error
		if m, err = s.loadMirror(ctx, name); err != nil {
			return nil, err
		}
		if len(m.cols) == 0 { // a new table
			defs := make([]string, 0, len(cols)+1)
			for _, c := range cols {
				defs = append(defs, pgx.Identifier{c}.Sanitize()+" jsonb")
			}
			defs = append(defs, "PRIMARY KEY ("+quoteAll(keyCols)+")")
			if _, err := s.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+name+` (`+strings.Join(defs, ", ")+`)`); err != nil && !madeMeanwhile(err) {
				return nil, fmt.Errorf("create mirror table %s: %w", name, classify(err))
			}
			if m, err = s.loadMirror(ctx, name); err != nil {
				return nil, err
			}
		}
		s.mirrors.m[r.Table] = m
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

// forget drops the cached mirrors (after a failed transaction, whose DDL
// was rolled back).
func (s *Sink) forgetMirrors() {
	s.mirrors.mu.Lock()
	s.mirrors.m = nil
	s.mirrors.mu.Unlock()
}

// applyBatch makes the mirror tables and columns the records need and
// returns the statements that apply them, for the commit's transaction to
// send. It runs before that transaction begins: making a table takes a
// connection of its own, which a writer must not wait for while it holds
// one in a transaction (with every connection of the pool held so, none
// would come).
func (s *Sink) applyBatch(ctx context.Context, recs []source.Record) (*pgx.Batch, error) {
	b := &pgx.Batch{}
	for _, r := range recs {
		keyCols, key, err := fields(r.Key)
		if err != nil || len(keyCols) == 0 {
			return nil, fmt.Errorf("%w: key of %s at %s is not a JSON object with fields", sink.ErrBadRecord, r.Table, r.Position)
		}
		cols, after, err := fields(r.After)
		if err != nil {
			return nil, fmt.Errorf("%w: after of %s at %s: %v", sink.ErrBadRecord, r.Table, r.Position, err)
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
			return nil, err
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
		sets := make([]string, 0, len(cols))
		args = args[:0]
		for i, c := range cols {
			q := pgx.Identifier{c}.Sanitize()
			names[i], vals[i] = q, fmt.Sprintf("NULLIF($%d::jsonb, 'null'::jsonb)", i+1) // JSON null: SQL NULL
			args = append(args, string(after[c]))
			if !slices.Contains(keyCols, c) {
				sets = append(sets, q+" = EXCLUDED."+q)
			}
		}
		conflict := " ON CONFLICT (" + quoteAll(keyCols) + ") DO NOTHING"
		if len(sets) > 0 {
			conflict = " ON CONFLICT (" + quoteAll(keyCols) + ") DO UPDATE SET " + strings.Join(sets, ", ")
		}
		b.Queue(`INSERT INTO `+m.name+` (`+strings.Join(names, ", ")+`) VALUES (`+strings.Join(vals, ", ")+`)`+conflict, args...)
	}
	return b, nil
}
