package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// A resync of a tablet (source.Resyncer) delivers a resync-begin marker,
// every row the tablet holds (as reads, or changes after the begin), and
// a resync-end marker. Changelog mode stores the markers as rows of the
// change table. Apply mode follows them through the column that says
// which tablet wrote each row (ownerCol):
//
//   - at resync-begin, in the batch's transaction, every row of the tablet
//     in every mirror table gets staleOwner(tablet) there: not the
//     tablet's, and not any tablet's;
//   - every row the tablet writes after that (a read, an insert, an
//     update) gets the tablet again, so the rows given since the begin are
//     the tablet's and the others stale;
//   - at resync-end, in its batch's transaction, the rows still stale for
//     the tablet are deleted: the source no longer has them.
//
// A second begin before the end marks again: what the first copy gave is
// stale again until the new copy gives it. A batch that is not committed
// (a crash, a fenced writer) marks nothing, being one transaction with
// the checkpoint. Deletes of a table without a key remove only rows the
// tablet owns (keylessStatement), so a stale row is never taken for one
// the copy gave.
//
// The tables a marker concerns are read from the catalog at each marker,
// not from the sink's cache, so that mirror tables an earlier process made
// are found: every table of the sink's schema but its own (changes,
// checkpoints) and the given ones, and every given table (sink.tables).
// Tables are made before a batch's transaction, and a tablet's rows are
// only in tables made before the batch that wrote them, so a table made
// meanwhile holds none of the tablet's rows. A table that cannot tell the
// tablet's rows from other shards' (a given table without the column,
// rows that do not say their tablet) refuses the begin, as it refuses a
// truncate: ErrBadRecord, naming what to do.

// stalePrefix begins the owner of a stale row: it is maxTabletID bytes
// long, so a stale owner is longer than any tablet ID Open takes, and no
// tablet writes a row with it.
var stalePrefix = func() string {
	const p = "tabletflow: stale since a resync began; tablet "
	return strings.Repeat("~", maxTabletID-len(p)) + p
}()

// staleOwner is the owner a resync's begin gives the rows of a tablet.
func staleOwner(tablet string) string { return stalePrefix + tablet }

// resyncTables returns the tables whose rows a resync marker of a tablet
// concerns: each given table (sink.tables), which must have the owner
// column, then every other table of the sink's schema but its own that
// has it, sorted. For a begin, a table whose rows do not all say their
// tablet (the schema's tables without the column that hold rows, made by
// an earlier version; rows without it) is ErrBadRecord.
func (s *Sink) resyncTables(ctx context.Context, r source.Record) ([]*mirror, error) {
	what := fmt.Sprintf("%s of tablet %s at %s", r.Op, r.Tablet, r.Position)
	var tables []*mirror
	given := map[string]bool{} // the given tables in the sink's schema
	s.mirrors.mu.Lock()
	for _, table := range slices.Sorted(maps.Keys(s.given)) {
		m, err := s.cachedMirror(ctx, table, nil)
		if err != nil {
			s.mirrors.mu.Unlock()
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if !m.cols[ownerCol] {
			s.mirrors.mu.Unlock()
			return nil, fmt.Errorf("%w: %s: table %s of %s has no column %s to tell this tablet's rows from other shards' (add it, of type text, and the sink fills it)",
				sink.ErrBadRecord, what, m.name, m.given, ownerCol)
		}
		tables = append(tables, m)
		if schema, name, _ := strings.Cut(s.given[table], "."); schema == s.schema {
			given[name] = true
		}
	}
	s.mirrors.mu.Unlock()

	rows, err := s.pool.Query(ctx, `SELECT c.relname::text, EXISTS (SELECT FROM pg_attribute a
			WHERE a.attrelid = c.oid AND a.attname = $2 AND NOT a.attisdropped)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition
			AND c.relname NOT IN ('changes', 'checkpoints')
		ORDER BY 1`, s.schema, ownerCol)
	if err != nil {
		return nil, fmt.Errorf("%s: list the mirror tables of schema %s: %w", what, s.schema, classify(err))
	}
	var unowned []*mirror // tables without the column: their rows say no tablet
	for rows.Next() {
		var name string
		var owned bool
		if err := rows.Scan(&name, &owned); err != nil {
			return nil, err
		}
		if given[name] {
			continue
		}
		m := &mirror{name: pgx.Identifier{s.schema, name}.Sanitize(), cols: map[string]bool{ownerCol: owned}}
		if owned {
			tables = append(tables, m)
		} else {
			unowned = append(unowned, m)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: list the mirror tables of schema %s: %w", what, s.schema, classify(err))
	}
	if r.Op == source.ResyncBegin {
		if err := s.requireOwned(ctx, what, slices.Concat(tables, unowned)); err != nil {
			return nil, err
		}
	}
	return tables, nil
}

// requireOwned checks, in one query, that every row of the tables says
// which tablet wrote it (a table without the column: that it is empty),
// else ErrBadRecord naming the first table that does not.
func (s *Sink) requireOwned(ctx context.Context, what string, tables []*mirror) error {
	if len(tables) == 0 {
		return nil
	}
	checks := make([]string, len(tables))
	for i, m := range tables {
		cond := ""
		if m.cols[ownerCol] {
			cond = ` WHERE ` + ownerCol + ` IS NULL`
		}
		checks[i] = fmt.Sprintf(`SELECT %d WHERE EXISTS (SELECT FROM %s%s)`, i, m.name, cond)
	}
	var first int
	err := s.pool.QueryRow(ctx, strings.Join(checks, " UNION ALL ")+" LIMIT 1").Scan(&first)
	if err == pgx.ErrNoRows {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: read the mirror tables: %w", what, classify(err))
	}
	m := tables[first]
	if !m.cols[ownerCol] {
		return fmt.Errorf("%w: %s: table %s holds rows but no column %s (made by an earlier version and not written since), so it cannot tell this tablet's: add the column, set it on the rows, then retry the tablet",
			sink.ErrBadRecord, what, m.name, ownerCol)
	}
	return fmt.Errorf("%w: %s: table %s holds rows without their tablet in %s (written before the sink recorded it), so it cannot tell this tablet's: set it on them, then retry the tablet",
		sink.ErrBadRecord, what, m.name, ownerCol)
}

// queueResync queues, for a resync marker, its statement on each of the
// tables (resyncTables): a begin marks the tablet's rows stale, an end
// deletes the rows still stale. It returns what each statement does.
func queueResync(b *pgx.Batch, r source.Record, tables []*mirror) []string {
	what := make([]string, 0, len(tables))
	owner, stale := r.Tablet, staleOwner(r.Tablet)
	for _, m := range tables {
		what = append(what, fmt.Sprintf("%s of tablet %s at %s in %s", r.Op, r.Tablet, r.Position, m.name))
		// A given table's column converts the value as its type's input
		// would, as its rows' owners are written (givenStatement).
		val := func(n int) string { return fmt.Sprintf("$%d", n) }
		args := []any{owner, stale}
		if m.given != "" {
			val = func(n int) string {
				return fmt.Sprintf("(jsonb_populate_record(NULL::%s, $%d::jsonb)).%s", m.name, n, ownerCol)
			}
			args = []any{ownerJSON(owner), ownerJSON(stale)}
		}
		if r.Op == source.ResyncBegin {
			b.Queue(`UPDATE `+m.name+` SET `+ownerCol+` = `+val(2)+` WHERE `+ownerCol+` = `+val(1), args...)
		} else {
			b.Queue(`DELETE FROM `+m.name+` WHERE `+ownerCol+` = `+val(1), args[1])
		}
	}
	return what
}

// ownerJSON is a JSON object holding an owner in the owner column.
func ownerJSON(owner string) string {
	b, _ := json.Marshal(map[string]string{ownerCol: owner}) // a string map always marshals
	return string(b)
}
