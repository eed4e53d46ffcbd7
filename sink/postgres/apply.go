package postgres

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
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
// TOAST value left out keeps its value), deletes remove it. An update
// whose before image holds another key than its key moves the row: the
// row at the old key is deleted and its values, overlaid with the after
// image, set at the new key. Records of a table without a key (an empty
// key object: a source table without a primary key, REPLICA IDENTITY
// FULL) go into a mirror table without a primary key, a multiset of rows:
// an insert adds a row, a delete removes one row equal to its before
// image, an update does both.
//
// Every row the sink writes into its mirror tables records the tablet that
// wrote it last, in the column tabletflow_tablet (a given table's too, if
// it has that column), so that a truncate removes that tablet's rows of
// the table and only those: other shards' rows of the same table stay;
// and so that a resync of a tablet removes, once its copy is complete,
// the tablet's rows the copy did not give (resync.go).
//
// Tables and columns are made in transactions of their own before the
// batch's; the rows are written in the batch's transaction, beside the
// checkpoint, so a batch whose rows do not fit (a mirror table keyed
// otherwise, a column of another type, a value its column's type or a
// constraint refuses) writes no row and moves no checkpoint; a table or
// column it made stays, empty.

// ownerCol is the column of a mirror table that holds the tablet that
// wrote each row last. A source column of that name is refused.
const ownerCol = "tabletflow_tablet"

// mirror is what the sink knows of one mirror table.
type mirror struct {
	name string   // quoted, qualified
	key  []string // primary key columns, in order
	cols map[string]bool
	// ins: the columns an INSERT may set (not generated, not GENERATED
	// ALWAYS AS IDENTITY), in order, as the table was read.
	ins []string
	// given: a table of the config's sink.tables (given, its entry there):
	// typed columns, never altered by the sink.
	given string
	// types: each column's type, as format_type names it; typed: under
	// sink.mirrorTypes "source", a mirror table with a column other than
	// tabletflow_tablet that is not jsonb (made with the source's types),
	// written as a given table is and altered as the source's types
	// change (typed.go).
	types map[string]string
	typed bool
}

// clone is a copy of m to change: a mirror in the cache is never changed
// once there, as the tablets' batches read it without the lock; a change
// caches a changed copy in its place.
func (m *mirror) clone() *mirror {
	c := *m
	c.key, c.ins = slices.Clone(m.key), slices.Clone(m.ins)
	c.cols, c.types = maps.Clone(m.cols), maps.Clone(m.types)
	return &c
}

// mirrors caches the sink's mirror tables (per Sink instance).
type mirrors struct {
	mu sync.Mutex
	m  map[string]*mirror // by source table
	// sinkTypes: the sink's type for a source's type name (typed.go).
	sinkTypes map[string]string
}

// A source table's mirror table has a name of its own: distinct source
// tables never share one. A plain name keeps its readable fold, as every
// version made it (public.orders → public__orders; tabletd's orders →
// orders): a schema and a table of a-z, 0-9 and _, beginning with a
// letter, the schema without "__" and not ending in "_", at most 63 bytes
// together, and not the sink's own changes or checkpoints; such folds are
// distinct for distinct names. Any other name (upper case, other
// characters, past 63 bytes) gets a tagged name: _<16 hex digits of a
// hash of the exact name>_<its fold, cut>, which no plain name's fold
// begins with. Each mirror table's comment names its source table
// ("tabletflow mirror of public.Orders"), so that a mirror table an
// earlier version made under a fold that several source tables shared
// (public.Orders and public.orders both folded to public__orders) is the
// first one's that writes to it after the upgrade, and never another's.

// mirrorClaim begins a mirror table's comment; the source table follows.
const mirrorClaim = "tabletflow mirror of "

var (
	plainPart  = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	plainTable = regexp.MustCompile(`^[a-z0-9_]+$`)
)

// fold is the mirror table name every earlier version gave a source table:
// "public.orders" → public__orders, lower case, characters other than a-z,
// 0-9 and _ as _, cut at 63 bytes.
func fold(table string) string {
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

// plain tells whether a source table's fold is its mirror table's name:
// no other plain name folds to it.
func plain(table string) bool {
	schema, name, dotted := strings.Cut(table, ".")
	if !dotted {
		return plainPart.MatchString(table) && !strings.Contains(table, "__") && len(table) <= 63 &&
			table != "changes" && table != "checkpoints"
	}
	return plainPart.MatchString(schema) && !strings.Contains(schema, "__") && !strings.HasSuffix(schema, "_") &&
		plainTable.MatchString(name) && len(schema)+2+len(name) <= 63
}

// taggedMirror is a source table's tagged mirror table name.
func taggedMirror(table string) string {
	sum := sha256.Sum256([]byte(table))
	t := "_" + hex.EncodeToString(sum[:8]) + "_"
	f := fold(table)
	return t + f[:min(len(f), 63-len(t))]
}

// mirrorNames are the names a source table's mirror table may have, in
// the order they are looked for: a plain table's fold, then its tagged
// name (its fold taken by another source table); any other table's tagged
// name, then the fold an earlier version gave it.
func mirrorNames(table string) []string {
	switch f := fold(table); {
	case plain(table):
		return []string{f, taggedMirror(table)}
	case f == "changes" || f == "checkpoints": // the sink's own: never a mirror
		return []string{taggedMirror(table)}
	default:
		return []string{taggedMirror(table), f}
	}
}

// mirrorTable returns the name of a source table's mirror table in the
// sink's schema: the first of mirrorNames that is there and is the
// table's (its comment names it, or names nothing: made by an earlier
// version, it is claimed now). None: with create, the table is made
// (defs: its columns and key) under the first name that is free of those
// the table may have (a plain table's fold, else its tagged name), and
// claimed; without, "".
func (s *Sink) mirrorTable(ctx context.Context, table string, defs func() string) (string, error) {
	cands := mirrorNames(table)
	rows, err := s.pool.Query(ctx, `SELECT c.relname::text, COALESCE(obj_description(c.oid, 'pg_class'), '')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = ANY($2)`, s.schema, cands)
	if err != nil {
		return "", fmt.Errorf("mirror table of %s: %w", table, classify(err))
	}
	claims := map[string]string{}
	for rows.Next() {
		var name, comment string
		if err := rows.Scan(&name, &comment); err != nil {
			return "", err
		}
		claims[name], _ = strings.CutPrefix(comment, mirrorClaim)
		if !strings.HasPrefix(comment, mirrorClaim) {
			claims[name] = "" // no comment, or not ours
		}
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("mirror table of %s: %w", table, classify(err))
	}
	for _, name := range cands {
		if claim, ok := claims[name]; ok && (claim == table || claim == "") {
			if mine, err := s.claimMirror(ctx, name, table, ""); err != nil || mine {
				return name, err
			}
		}
	}
	if defs == nil {
		return "", nil
	}
	for _, name := range cands {
		if _, taken := claims[name]; taken || name == fold(table) && !plain(table) {
			continue
		}
		mine, err := s.claimMirror(ctx, name, table, defs())
		if err != nil || mine {
			return name, err
		}
	}
	return "", fmt.Errorf("%w: mirror table of %s: every name it may have (%s) is another source table's", sink.ErrBadRecord, table, strings.Join(cands, ", "))
}

// claimMirror makes the mirror table name (when defs is not empty: CREATE
// TABLE IF NOT EXISTS with them) and claims it for the source table, in
// one transaction under a lock on the name: a table whose comment names no
// source table gets this one's. It tells whether the table is the source
// table's.
func (s *Sink) claimMirror(ctx context.Context, name, table, defs string) (bool, error) {
	q := pgx.Identifier{s.schema, name}.Sanitize()
	var mine bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('tabletflow mirror'), hashtext($1))`, q); err != nil {
			return err
		}
		if defs != "" {
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+q+` (`+defs+`)`); err != nil {
				return err
			}
		}
		var comment *string
		var there bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, obj_description(to_regclass($1), 'pg_class')`, q).Scan(&there, &comment); err != nil {
			return err
		}
		if !there {
			return nil
		}
		if comment != nil && strings.HasPrefix(*comment, mirrorClaim) {
			mine = strings.TrimPrefix(*comment, mirrorClaim) == table
			return nil
		}
		if _, err := tx.Exec(ctx, `COMMENT ON TABLE `+q+` IS `+quoteLiteral(mirrorClaim+table)); err != nil {
			return err
		}
		mine = true
		return nil
	})
	if err != nil && !madeMeanwhile(err) {
		return false, fmt.Errorf("mirror table %s of %s: %w", q, table, classify(err))
	}
	if err != nil { // made at the same moment by a sink without the lock (an earlier version)
		return s.claimMirror(ctx, name, table, "")
	}
	return mine, nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

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

// cachedMirror returns the sink's table for a source table from the cache,
// or loads it: the given table of sink.tables, else what load gives (nil
// and no error: none, and nothing is cached). s.mirrors.mu is held.
func (s *Sink) cachedMirror(ctx context.Context, table string, load func() (*mirror, error)) (*mirror, error) {
	if m := s.mirrors.m[table]; m != nil {
		return m, nil
	}
	var m *mirror
	var err error
	if target, ok := s.given[table]; ok {
		m, err = s.loadGiven(ctx, table, target)
	} else {
		m, err = load()
	}
	if err != nil || m == nil {
		return nil, err
	}
	if s.mirrors.m == nil {
		s.mirrors.m = map[string]*mirror{}
	}
	s.mirrors.m[table] = m
	return m, nil
}

// mirrorOf returns the mirror of a source table, making it (or the
// columns it lacks) when needed. Tables and columns are made in
// transactions of their own (IF NOT EXISTS: concurrent tablets may race to
// make them), so a batch's transaction only writes rows; a batch that then
// fails leaves at most an empty table or column behind.
func (s *Sink) mirrorOf(ctx context.Context, r source.Record, keyCols, cols []string) (*mirror, error) {
	s.mirrors.mu.Lock()
	defer s.mirrors.mu.Unlock()
	m, err := s.cachedMirror(ctx, r.Table, func() (*mirror, error) { return s.makeMirror(ctx, r, keyCols, cols) })
	if err != nil {
		return nil, err
	}
	if m.given != "" {
		return m, m.fits(r.Table, keyCols, cols)
	}
	if !slices.Equal(m.key, keyCols) {
		return nil, fmt.Errorf("%w: mirror table %s is keyed by %s, records of %s by %s",
			sink.ErrBadRecord, m.name, keyDesc(m.key), r.Table, keyDesc(keyCols))
	}
	// A change goes into a copy, cached in the mirror's place (clone),
	// made at the first change: most records change nothing.
	changed := false
	edit := func() *mirror {
		if !changed {
			m, changed = m.clone(), true
			s.mirrors.m[r.Table] = m
		}
		return m
	}
	if !m.cols[ownerCol] {
		if err := s.addOwner(ctx, edit()); err != nil {
			return nil, err
		}
	}
	if m.typed {
		err := s.followTypes(ctx, m, r, cols, edit)
		return m, err // m: the copy, if followTypes changed it
	}
	for _, c := range cols {
		if m.cols[c] {
			continue
		}
		if _, err := s.pool.Exec(ctx, `ALTER TABLE `+m.name+` ADD COLUMN IF NOT EXISTS `+pgx.Identifier{c}.Sanitize()+` jsonb`); err != nil && !madeMeanwhile(err) {
			return nil, fmt.Errorf("add column %s to %s: %w", c, m.name, classify(err))
		}
		edit().cols[c] = true
	}
	return m, nil
}

// addOwner gives a mirror table the sink made its tabletflow_tablet column
// if it lacks it (one made by an earlier version: its rows there have
// none).
func (s *Sink) addOwner(ctx context.Context, m *mirror) error {
	if m.cols[ownerCol] || m.given != "" {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `ALTER TABLE `+m.name+` ADD COLUMN IF NOT EXISTS `+ownerCol+` text`); err != nil && !madeMeanwhile(err) {
		return fmt.Errorf("add column %s to %s: %w", ownerCol, m.name, classify(err))
	}
	m.cols[ownerCol] = true
	return nil
}

// truncatable returns the mirror of a source table for a truncate of it,
// nil when there is none yet (nothing to remove; a truncate makes no
// table). A table whose rows do not all say which tablet wrote them (a
// given table without the column, rows an earlier version wrote) cannot
// tell the tablet's rows from other shards': ErrBadRecord, naming what
// to do.
func (s *Sink) truncatable(ctx context.Context, r source.Record) (*mirror, error) {
	s.mirrors.mu.Lock()
	defer s.mirrors.mu.Unlock()
	m, err := s.cachedMirror(ctx, r.Table, func() (*mirror, error) {
		// A truncate makes no table: only one already there is loaded.
		name, err := s.mirrorTable(ctx, r.Table, nil)
		if err != nil || name == "" {
			return nil, err
		}
		m, err := s.loadMirror(ctx, pgx.Identifier{s.schema, name}.Sanitize())
		if err != nil || len(m.cols) == 0 {
			return nil, err
		}
		return m, nil
	})
	if err != nil || m == nil {
		return nil, err
	}
	if !m.cols[ownerCol] {
		m = m.clone()
		s.mirrors.m[r.Table] = m
		if m.given != "" {
			return nil, fmt.Errorf("%w: truncate of %s at %s: table %s of %s has no column %s to tell this tablet's rows from other shards' (add it, of type text, and the sink fills it)",
				sink.ErrBadRecord, r.Table, r.Position, m.name, m.given, ownerCol)
		}
		if err := s.addOwner(ctx, m); err != nil {
			return nil, err
		}
	}
	var unowned bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+m.name+` WHERE `+ownerCol+` IS NULL)`).Scan(&unowned); err != nil {
		return nil, fmt.Errorf("truncate of %s: read %s: %w", r.Table, m.name, classify(err))
	}
	if unowned {
		return nil, fmt.Errorf("%w: truncate of %s at %s: table %s holds rows without their tablet in %s (written before the sink recorded it), so it cannot tell this tablet's: set it on them, then retry the tablet",
			sink.ErrBadRecord, r.Table, r.Position, m.name, ownerCol)
	}
	return m, nil
}

// keyDesc names a key's columns for an error: "(a, b)", or "no key".
func keyDesc(cols []string) string {
	if len(cols) == 0 {
		return "no key"
	}
	return "(" + strings.Join(cols, ", ") + ")"
}

// makeMirror returns the sink's own mirror table of a record's source
// table, making it if it is not there: typed like the source when the
// config asks for it (sink.mirrorTypes), the record carries the source's
// types and the table has a key; otherwise every column jsonb.
func (s *Sink) makeMirror(ctx context.Context, r source.Record, keyCols, cols []string) (*mirror, error) {
	colType := func(string) string { return "jsonb" }
	if s.mirrorTypes == MirrorSource && r.Types != nil && len(keyCols) > 0 {
		if err := s.lookUpTypes(ctx, r.Types); err != nil {
			return nil, err
		}
		colType = func(c string) string {
			if t, ok := r.Types[c]; ok {
				return s.sinkType(t)
			}
			return "jsonb"
		}
		// The table's columns as the source has them, those the record
		// leaves out (an unchanged TOAST value) too.
		for _, c := range slices.Sorted(maps.Keys(r.Types)) {
			if !slices.Contains(cols, c) {
				cols = append(slices.Clip(cols), c)
			}
		}
	}
	name, err := s.mirrorTable(ctx, r.Table, func() string {
		defs := make([]string, 0, len(cols)+2)
		for _, c := range cols {
			defs = append(defs, pgx.Identifier{c}.Sanitize()+" "+colType(c))
		}
		defs = append(defs, ownerCol+" text")
		if len(keyCols) > 0 {
			defs = append(defs, "PRIMARY KEY ("+quoteAll(keyCols)+")")
		}
		return strings.Join(defs, ", ")
	})
	if err != nil {
		return nil, err
	}
	return s.loadMirror(ctx, pgx.Identifier{s.schema, name}.Sanitize())
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
		return fmt.Errorf("%w: table %s of %s has the primary key %s, records of %s are keyed by %s",
			sink.ErrBadRecord, m.name, m.given, keyDesc(m.key), table, keyDesc(keyCols))
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
	m := &mirror{name: name, cols: map[string]bool{}, types: map[string]string{}}
	// indkey is an int2vector, numbered from 0.
	rows, err := s.pool.Query(ctx, `SELECT a.attname, array_position(i.indkey::int2[], a.attnum), a.attgenerated = '' AND a.attidentity <> 'a',
			format_type(a.atttypid, a.atttypmod)
		FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, name)
	if err != nil {
		return nil, fmt.Errorf("read mirror table %s: %w", name, classify(err))
	}
	keyAt := map[int]string{}
	for rows.Next() {
		var col, typ string
		var pos *int
		var insertable bool
		if err := rows.Scan(&col, &pos, &insertable, &typ); err != nil {
			return nil, err
		}
		m.cols[col], m.types[col] = true, typ
		m.typed = m.typed || s.mirrorTypes == MirrorSource && col != ownerCol && typ != "jsonb"
		if insertable {
			m.ins = append(m.ins, col)
		}
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
	s.mirrors.m, s.mirrors.sinkTypes = nil, nil
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
		if r.Op.Marker() {
			tables, err := s.resyncTables(ctx, r)
			if err != nil {
				return nil, nil, err
			}
			what = append(what, queueResync(b, r, tables)...)
			continue
		}
		if r.Op == source.Truncate {
			m, err := s.truncatable(ctx, r)
			if err != nil {
				return nil, nil, err
			}
			if m == nil {
				continue
			}
			what = append(what, fmt.Sprintf("truncate of %s at %s in %s", r.Table, r.Position, m.name))
			if m.given != "" {
				b.Queue(`DELETE FROM `+m.name+` WHERE `+ownerCol+` = (jsonb_populate_record(NULL::`+m.name+`, $1::jsonb)).`+ownerCol,
					fmt.Sprintf(`{%q:%q}`, ownerCol, r.Tablet))
			} else {
				b.Queue(`DELETE FROM `+m.name+` WHERE `+ownerCol+` = $1`, r.Tablet)
			}
			continue
		}
		keyCols, key, err := fields(r.Key)
		if err != nil || key == nil {
			return nil, nil, fmt.Errorf("%w: key of %s at %s is not a JSON object", sink.ErrBadRecord, r.Table, r.Position)
		}
		cols, after, err := fields(r.After)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: after of %s at %s: %v", sink.ErrBadRecord, r.Table, r.Position, err)
		}
		beforeCols, before, err := fields(r.Before)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: before of %s at %s: %v", sink.ErrBadRecord, r.Table, r.Position, err)
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
		if slices.Contains(cols, ownerCol) || slices.Contains(keyCols, ownerCol) || slices.Contains(beforeCols, ownerCol) {
			return nil, nil, fmt.Errorf("%w: %s at %s: the column %s is the sink's (the tablet that wrote the row)", sink.ErrBadRecord, r.Table, r.Position, ownerCol)
		}
		keyless := len(keyCols) == 0
		if keyless {
			if r.Op == source.Update || r.Op == source.Delete {
				if len(beforeCols) == 0 {
					return nil, nil, fmt.Errorf("%w: %s of %s at %s: the table has no key and the record no before image to tell its row by",
						sink.ErrBadRecord, r.Op, r.Table, r.Position)
				}
				for _, c := range beforeCols { // the row is told by them
					if _, ok := after[c]; !ok {
						cols = append(cols, c)
					}
				}
			}
			if r.Op != source.Delete && len(cols) == 0 {
				return nil, nil, fmt.Errorf("%w: %s of %s at %s has no key and no columns", sink.ErrBadRecord, r.Op, r.Table, r.Position)
			}
		}
		m, err := s.mirrorOf(ctx, r, keyCols, cols)
		if err != nil {
			return nil, nil, err
		}
		what = append(what, fmt.Sprintf("%s of %s at %s into %s", r.Op, r.Table, r.Position, m.name))
		moved := r.Op == source.Update && !keyless && movedFrom(keyCols, key, before)
		var q string
		var args []any
		if m.typed { // columns dropped at the source: NULL from now on
			after = maps.Clone(after)
			cols = droppedAsNull(m, r, cols, after)
		}
		if m.cols[ownerCol] && r.Op != source.Delete { // the row says which tablet wrote it
			owner, _ := json.Marshal(r.Tablet)
			after = maps.Clone(after)
			after[ownerCol] = owner
			cols = append(slices.Clip(cols), ownerCol)
		}
		switch {
		case keyless:
			q, args, err = keylessStatement(m, r.Op, r.Tablet, beforeCols, before, after)
		case m.given != "" || m.typed:
			q, args, err = givenStatement(m, r.Op, moved, keyCols, cols, key, before, after)
		default:
			q, args, err = mirrorStatement(m, r.Op, moved, keyCols, cols, key, before, after)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %s at %s: %v", sink.ErrBadRecord, r.Table, r.Position, err)
		}
		b.Queue(q, args...)
	}
	return b, what, nil
}

// movedFrom tells whether an update moves its row: its before image holds
// every key column, and another value in one of them.
func movedFrom(keyCols []string, key, before map[string]json.RawMessage) bool {
	moved := false
	for _, k := range keyCols {
		old, ok := before[k]
		if !ok {
			return false
		}
		moved = moved || !jsonEqual(old, key[k])
	}
	return moved
}

// jsonEqual compares two JSON values as text, less insignificant space.
func jsonEqual(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return bytes.Equal(a, b)
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}

// jsonArg is a JSON object of the given fields, as one statement argument.
func jsonArg(vals map[string]json.RawMessage) (string, error) {
	if vals == nil {
		return "{}", nil
	}
	b, err := json.Marshal(vals)
	return string(b), err
}

// moveInto is the tail of a statement that moves a row: after a CTE
// "old" that deleted the row at its old key (RETURNING it), it inserts
// the old row's values overlaid with the after image (argument $n, a JSON
// object) into the table, as its row type converts them (a mirror's jsonb
// columns take the JSON values; a given table's columns their types), the
// columns named by into (nil: every column, in order).
func moveInto(m *mirror, into []string, n int) string {
	row := `jsonb_populate_record(NULL::` + m.name + `, COALESCE((SELECT to_jsonb(old) FROM old), '{}'::jsonb) || $` +
		fmt.Sprint(n) + `::jsonb) AS r`
	if into == nil {
		return `INSERT INTO ` + m.name + ` SELECT r.* FROM ` + row
	}
	vals := make([]string, len(into))
	for i, c := range into {
		vals[i] = "r." + pgx.Identifier{c}.Sanitize()
	}
	return `INSERT INTO ` + m.name + ` (` + quoteAll(into) + `) SELECT ` + strings.Join(vals, ", ") + ` FROM ` + row
}

// mirrorStatement is the statement that applies one record to a mirror
// table the sink made (jsonb columns), and its arguments.
func mirrorStatement(m *mirror, op source.Op, moved bool, keyCols, cols []string, key, before, after map[string]json.RawMessage) (string, []any, error) {
	keyAt := func(vals map[string]json.RawMessage) (string, []any) {
		where := make([]string, len(keyCols))
		args := make([]any, len(keyCols))
		for i, k := range keyCols {
			where[i] = fmt.Sprintf("%s = $%d::jsonb", pgx.Identifier{k}.Sanitize(), i+1)
			args[i] = string(vals[k])
		}
		return strings.Join(where, " AND "), args
	}
	if op == source.Delete {
		where, args := keyAt(key)
		return `DELETE FROM ` + m.name + ` WHERE ` + where, args, nil
	}
	if moved {
		where, args := keyAt(before)
		arg, err := jsonArg(after)
		return `WITH old AS (DELETE FROM ` + m.name + ` WHERE ` + where + ` RETURNING *) ` +
			moveInto(m, nil, len(args)+1) + onConflict(keyCols, cols), append(args, arg), err
	}
	q, args := insertValues(m, cols, after)
	return q + onConflict(keyCols, cols), args, nil
}

// insertValues is an INSERT of the given columns' JSON values into a
// mirror table the sink made, and its arguments.
func insertValues(m *mirror, cols []string, vals map[string]json.RawMessage) (string, []any) {
	names := make([]string, len(cols))
	params := make([]string, len(cols))
	args := make([]any, len(cols))
	for i, c := range cols {
		names[i], params[i] = pgx.Identifier{c}.Sanitize(), fmt.Sprintf("NULLIF($%d::jsonb, 'null'::jsonb)", i+1) // JSON null: SQL NULL
		args[i] = string(vals[c])
		if c == ownerCol {
			params[i] = fmt.Sprintf("($%d::jsonb #>> '{}')", i+1) // text
		}
	}
	return `INSERT INTO ` + m.name + ` (` + strings.Join(names, ", ") + `) VALUES (` + strings.Join(params, ", ") + `)`, args
}

// keylessStatement is the statement that applies one record of a table
// without a key to its mirror table (no primary key: a multiset of rows):
// an insert adds its row; a delete removes one row whose columns equal its
// before image's (which one does not matter: they are equal); an update
// removes one so and adds its after image over that row's values.
func keylessStatement(m *mirror, op source.Op, tablet string, beforeCols []string, before, after map[string]json.RawMessage) (string, []any, error) {
	if m.given != "" {
		return "", nil, fmt.Errorf("records without a key cannot go into %s of %s, which is upserted by its primary key", m.name, m.given)
	}
	if op == source.Insert || op == source.Read {
		cols := make([]string, 0, len(after))
		for c := range after {
			cols = append(cols, c)
		}
		slices.Sort(cols)
		q, args := insertValues(m, cols, after)
		return q, args, nil
	}
	// one of this tablet's rows: equal rows of other shards are theirs
	match := []string{ownerCol + " = $1"}
	args := []any{tablet}
	for _, c := range beforeCols {
		match = append(match, fmt.Sprintf("%s IS NOT DISTINCT FROM NULLIF($%d::jsonb, 'null'::jsonb)", pgx.Identifier{c}.Sanitize(), len(args)+1))
		args = append(args, string(before[c]))
	}
	del := `DELETE FROM ` + m.name + ` WHERE ctid = (SELECT ctid FROM ` + m.name + ` WHERE ` + strings.Join(match, " AND ") + ` LIMIT 1)`
	if op == source.Delete {
		return del, args, nil
	}
	arg, err := jsonArg(after)
	return `WITH old AS (` + del + ` RETURNING *) ` + moveInto(m, nil, len(args)+1), append(args, arg), err
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
// table, and its arguments: JSON objects of the record's columns.
// jsonb_populate_record converts each field to its column's type as an
// input of that type would (the table's row type: its column types with
// their modifiers, so a string too long for a varchar(n) is an error where
// an explicit cast would cut it; a JSON array into an array column); a
// json or jsonb column takes the JSON value itself, and a JSON null is SQL
// NULL. A value its column's type does not take fails the statement (a
// class 22 error: ErrBadRecord). A move deletes the row at the before
// image's key and inserts its values (as to_jsonb gives them back) under
// the after image's into the columns an insert may set.
func givenStatement(m *mirror, op source.Op, moved bool, keyCols, cols []string, key, before, after map[string]json.RawMessage) (string, []any, error) {
	row := func(n int) string { return fmt.Sprintf("jsonb_populate_record(NULL::%s, $%d::jsonb) AS r", m.name, n) }
	keyAt := func(vals map[string]json.RawMessage) (string, string, error) {
		where := make([]string, len(keyCols))
		kv := map[string]json.RawMessage{}
		for i, k := range keyCols {
			q := pgx.Identifier{k}.Sanitize()
			where[i] = "m." + q + " = r." + q
			kv[k] = vals[k]
		}
		arg, err := jsonArg(kv)
		return `DELETE FROM ` + m.name + ` AS m USING ` + row(1) + ` WHERE ` + strings.Join(where, " AND "), arg, err
	}
	if op == source.Delete {
		del, arg, err := keyAt(key)
		return del, []any{arg}, err
	}
	if moved {
		del, old, err := keyAt(before)
		if err != nil {
			return "", nil, err
		}
		arg, err := jsonArg(after)
		return `WITH old AS (` + del + ` RETURNING m.*) ` + moveInto(m, m.ins, 2) + onConflict(keyCols, cols), []any{old, arg}, err
	}
	names := make([]string, len(cols))
	vals := make([]string, len(cols))
	for i, c := range cols {
		names[i] = pgx.Identifier{c}.Sanitize()
		vals[i] = "r." + names[i]
	}
	arg, err := jsonArg(after)
	return `INSERT INTO ` + m.name + ` (` + strings.Join(names, ", ") + `) SELECT ` + strings.Join(vals, ", ") +
		` FROM ` + row(1) + onConflict(keyCols, cols), []any{arg}, err
}
