package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/source"
)

// The tables a stream reads can change while it runs (the operator's
// configure with source.tables, source.TableChanger): SetTables makes the
// stream's publication on every shard's primary publish exactly the new
// list, and writes the list into the stream's record (the publication's
// comment) in the same transaction. A reader takes the tables from the
// record, not from its config (a worker's config is the stream's as it
// started, and one source object serves every stream on the same
// servers), so a change needs no new config anywhere: the publication and
// the record reach a standby together, and a reader that checks one
// against the other sees them as one transaction left them (both read in
// one snapshot: recordedTables).
//
// pgoutput decodes each change with the catalog of its time: a table added
// is streamed from the ALTER's commit on (its rows from before arrive by
// the backfill, an ad-hoc snapshot the stream asks for next), and one
// removed is streamed up to it.

var _ source.TableChanger = (*Source)(nil)

// errTables: a table of a new source.tables list cannot be read by the
// stream (it does not exist on a shard, or has no primary key to copy it
// by); nothing was changed.
var errTables = errors.New("a table of source.tables cannot be streamed")

// SetTables makes stream publish exactly tables on every shard: first
// every shard's primary is checked (each table exists, with a primary
// key), then each shard's publication and record are changed in one
// transaction. A second call with the same tables changes nothing.
func (s *Source) SetTables(ctx context.Context, stream string, tables []string) error {
	if err := checkTableNames(tables); err != nil {
		return err
	}
	for _, sh := range s.shards {
		if err := s.checkTables(ctx, sh, tables); err != nil {
			return fmt.Errorf("shard %s: %w", sh.id, err)
		}
	}
	for _, sh := range s.shards {
		if err := s.setShardTables(ctx, stream, sh, tables); err != nil {
			return fmt.Errorf("shard %s: %w", sh.id, err)
		}
	}
	return nil
}

// checkTableNames refuses an empty list, a name not <schema>.<table>, or a
// name given twice, as a config's source.tables is.
func checkTableNames(tables []string) error {
	if len(tables) == 0 {
		return fmt.Errorf("%w: the list is empty", errTables)
	}
	for i, t := range tables {
		if !tableRe.MatchString(t) || slices.Index(tables, t) != i {
			return fmt.Errorf("%w: tables[%d] %q is not <schema>.<table>, or is named twice", errTables, i, t)
		}
	}
	return nil
}

// checkTables fails with errTables naming the tables that do not exist on
// the shard's primary, or have no primary key.
func (s *Source) checkTables(ctx context.Context, sh *shard, tables []string) error {
	prim := s.primary(sh)
	pool, err := prim.poolOf()
	if err != nil {
		return err
	}
	var missing, keyless []string
	err = pool.QueryRow(ctx, `SELECT
		ARRAY(SELECT t FROM unnest($1::text[]) t WHERE NOT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = split_part(t, '.', 1) AND c.relname = split_part(t, '.', 2) AND c.relkind IN ('r', 'p'))),
		ARRAY(SELECT t FROM unnest($1::text[]) t WHERE EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = split_part(t, '.', 1) AND c.relname = split_part(t, '.', 2) AND c.relkind IN ('r', 'p')
			AND NOT EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)))`, tables).Scan(&missing, &keyless)
	if err != nil {
		return fmt.Errorf("read tables on %s: %w", prim.cfg.Alias, err)
	}
	var why []string
	if len(missing) > 0 {
		why = append(why, strings.Join(missing, ", ")+" not there")
	}
	if len(keyless) > 0 {
		why = append(why, strings.Join(keyless, ", ")+" without a primary key (a table added is copied in chunks by it)")
	}
	if len(why) > 0 {
		return fmt.Errorf("%w: on %s: %s", errTables, prim.cfg.Alias, strings.Join(why, "; "))
	}
	return nil
}

// setShardTables changes the shard's publication and record in one
// transaction, under the record's lock.
func (s *Source) setShardTables(ctx context.Context, stream string, sh *shard, tables []string) error {
	prim := s.primary(sh)
	pool, err := prim.poolOf()
	if err != nil {
		return err
	}
	f, err := prim.find(ctx, stream)
	if err != nil {
		return err
	}
	if f, _, err = s.claim(ctx, sh, f); err != nil {
		return err
	}
	if !f.exists {
		return fmt.Errorf("%w: stream %s has no publication on %s", errPublication, stream, prim.cfg.Alias)
	}
	idents := make([]string, len(tables))
	for i, t := range tables {
		schema, name, _ := strings.Cut(t, ".")
		idents[i] = pgx.Identifier{schema, name}.Sanitize()
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return rewrite(ctx, tx, f.names.pub, func(m *streamMeta) (bool, error) {
			if slices.Equal(m.Tables, tables) {
				return false, nil
			}
			if _, err := tx.Exec(ctx, `ALTER PUBLICATION `+pgx.Identifier{f.names.pub}.Sanitize()+` SET TABLE `+strings.Join(idents, ", ")); err != nil {
				return false, err
			}
			m.Tables = slices.Clone(tables)
			return true, nil
		})
	})
	if err != nil {
		return fmt.Errorf("publish %v on %s: %w", tables, prim.cfg.Alias, err)
	}
	return nil
}

// tablesOf are the tables the stream reads by its record: the ones its
// last SetTables (or, from this version, its creation) recorded, else the
// config's.
func (s *Source) tablesOf(m streamMeta) []string {
	if len(m.Tables) > 0 {
		return m.Tables
	}
	return s.cfg.Tables
}
