package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

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
// one snapshot: publicationLacks).
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

// errTablesPartial: a SetTables failed once it had begun to change the
// shards; not a verdict (shards may publish different lists meanwhile),
// so it is retried until every shard has the list, or a newer change
// replaces it.
var errTablesPartial = errors.New("the tables were not changed on every shard yet")

// SetTables makes stream publish exactly tables on every shard, for the
// change asked at at: first every shard's primary is checked (each table
// is there, a permanent table the role owns, with a primary key; a
// verdict against one fails with errTables and nothing changes), then each
// shard's publication and record are changed in one transaction (any
// failure from there on is errTablesPartial, retried). A second call with
// the same change does nothing, and neither does one older than the
// change a shard records (an attempt that outlived its workflow run).
func (s *Source) SetTables(ctx context.Context, stream string, tables []string, at time.Time) error {
	if err := validateTables(tables); err != nil {
		return fmt.Errorf("%w: %w", errTables, err)
	}
	for _, sh := range s.shards {
		if err := s.checkTables(ctx, sh, tables); err != nil {
			return fmt.Errorf("shard %s: %w", sh.id, err)
		}
	}
	for _, sh := range s.shards {
		if err := s.setShardTables(ctx, stream, sh, tables, at); err != nil {
			return fmt.Errorf("%w: shard %s: %w", errTablesPartial, sh.id, err)
		}
	}
	return nil
}

// checkTables fails with errTables naming the tables that are not on the
// shard's primary (or not permanent tables), that the role does not own
// (it cannot publish them) or that have no primary key.
func (s *Source) checkTables(ctx context.Context, sh *shard, tables []string) error {
	prim := s.primary(sh)
	pool, err := prim.poolOf()
	if err != nil {
		return err
	}
	var missing, unowned, keyless []string
	err = pool.QueryRow(ctx, `WITH t AS (SELECT t, c.oid, c.relowner FROM unnest($1::text[]) t
			LEFT JOIN (pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace)
			ON n.nspname = split_part(t, '.', 1) AND c.relname = split_part(t, '.', 2) AND c.relkind IN ('r', 'p') AND c.relpersistence = 'p')
		SELECT ARRAY(SELECT t FROM t WHERE oid IS NULL),
			ARRAY(SELECT t FROM t WHERE oid IS NOT NULL AND NOT pg_has_role(relowner, 'USAGE')),
			ARRAY(SELECT t FROM t WHERE oid IS NOT NULL AND NOT EXISTS (SELECT FROM pg_index i WHERE i.indrelid = t.oid AND i.indisprimary))`,
		tables).Scan(&missing, &unowned, &keyless)
	if err != nil {
		return fmt.Errorf("read tables on %s: %w", prim.cfg.Alias, err)
	}
	var why []string
	if len(missing) > 0 {
		why = append(why, strings.Join(missing, ", ")+" not there (or not a permanent table)")
	}
	if len(unowned) > 0 {
		why = append(why, strings.Join(unowned, ", ")+" not owned by the stream's role (it cannot publish them)")
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
// transaction, under the record's lock, unless the record holds the
// change already or a newer one.
func (s *Source) setShardTables(ctx context.Context, stream string, sh *shard, tables []string, at time.Time) error {
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
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return rewrite(ctx, tx, f.names.pub, func(m *streamMeta) (bool, error) {
			if m.TablesAt.After(at) || slices.Equal(m.Tables, tables) && !m.TablesAt.Before(at) {
				return false, nil
			}
			if _, err := tx.Exec(ctx, `ALTER PUBLICATION `+pgx.Identifier{f.names.pub}.Sanitize()+` SET TABLE `+tableIdents(tables)); err != nil {
				return false, err
			}
			m.Tables, m.TablesAt = slices.Clone(tables), at
			return true, nil
		})
	})
	if err != nil {
		return fmt.Errorf("publish %v on %s: %w", tables, prim.cfg.Alias, err)
	}
	return nil
}

// tableIdents are tables as quoted identifiers, for SQL.
func tableIdents(tables []string) string {
	idents := make([]string, len(tables))
	for i, t := range tables {
		schema, name, _ := strings.Cut(t, ".")
		idents[i] = pgx.Identifier{schema, name}.Sanitize()
	}
	return strings.Join(idents, ", ")
}

// tablesOf are the tables the stream reads by its record, else the
// config's (streamMeta.tablesOr).
func (s *Source) tablesOf(m streamMeta) []string { return m.tablesOr(s.cfg.Tables) }
