package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// publishedOps are what a stream's publication publishes.
const publishedOps = "insert, update, delete, truncate"

// publicationError: the stream's publication does not exist on a server,
// or does not publish a table of source.tables or one of inserts, updates,
// deletes and truncates. pgoutput then sends nothing of it (PostgreSQL 18 skips a
// missing publication with a warning; 16 and 17 fail at the first change
// with 42704), so a reader never starts on it: the stream would be
// silently empty.
type publicationError struct {
	pub     string
	alias   string
	missing bool
	tables  []string // configured tables it does not publish
	actions []string // of inserts, updates, deletes, truncates, those it does not publish
}

func (e *publicationError) Error() string {
	if e.missing {
		return fmt.Sprintf("%v: publication %s on %s does not exist", errPublication, e.pub, e.alias)
	}
	var not []string
	if len(e.tables) > 0 {
		not = append(not, strings.Join(e.tables, ", ")+" (source.tables)")
	}
	if len(e.actions) > 0 {
		not = append(not, strings.Join(e.actions, ", "))
	}
	return fmt.Sprintf("%v: publication %s on %s does not publish %s", errPublication, e.pub, e.alias, strings.Join(not, "; "))
}

func (e *publicationError) Unwrap() error { return errPublication }

// publicationLacks checks the stream's publication on the server against
// the tables the stream reads: the ones its record names (Source.tablesOf;
// configured, the fallback, for a record without them), read in the same
// snapshot as the publication, so that a SetTables committing meanwhile is
// seen whole or not at all. A *publicationError says what it lacks, nil
// that it publishes them all. A table counts as published when the
// publication names it, its schema or all tables (a partitioned table
// named in a publication is listed by its partitions in
// pg_publication_tables).
func (r *replica) publicationLacks(ctx context.Context, n names, configured []string) (*publicationError, error) {
	pool, err := r.poolOf()
	if err != nil {
		return nil, err
	}
	pub := n.pub
	var insert, update, del, truncate bool
	var unpublished []string
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		m, err := readRecord(ctx, tx, pub)
		if err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate,
		ARRAY(SELECT t FROM unnest($2::text[]) t WHERE NOT (p.puballtables
			OR EXISTS (SELECT FROM pg_publication_tables pt
				WHERE pt.pubname = p.pubname AND pt.schemaname || '.' || pt.tablename = t)
			OR EXISTS (SELECT FROM pg_publication_rel pr JOIN pg_class c ON c.oid = pr.prrelid
				JOIN pg_namespace n ON n.oid = c.relnamespace
				WHERE pr.prpubid = p.oid AND n.nspname || '.' || c.relname = t)
			OR EXISTS (SELECT FROM pg_publication_namespace pn JOIN pg_namespace n ON n.oid = pn.pnnspid
				WHERE pn.pnpubid = p.oid AND n.nspname = split_part(t, '.', 1))))
		FROM pg_publication p WHERE p.pubname = $1`, pub, m.tablesOr(configured)).Scan(&insert, &update, &del, &truncate, &unpublished)
	})
	e := &publicationError{pub: pub, alias: r.cfg.Alias, tables: unpublished}
	if errors.Is(err, pgx.ErrNoRows) {
		e.missing = true
		return e, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read publication %s on %s: %w", pub, r.cfg.Alias, err)
	}
	for _, a := range []struct {
		on   bool
		name string
	}{{insert, "inserts"}, {update, "updates"}, {del, "deletes"}, {truncate, "truncates"}} {
		if !a.on {
			e.actions = append(e.actions, a.name)
		}
	}
	if len(e.tables) == 0 && len(e.actions) == 0 {
		return nil, nil
	}
	return e, nil
}

// checkPublication makes sure the stream's publication publishes what the
// stream reads before a reader starts: on the replica read (whose catalog
// pgoutput decodes with), and, when a standby's copy lacks something, on
// the primary, which has the last word (a standby that has not replayed
// the publication's latest change yet reads on; its slot decodes each
// change with the catalog of its time). When the primary cannot be asked,
// the error is the primary's (retried), not a verdict.
//
// A publication that lacks only truncates was made by a tabletflow from
// before they were followed: it is made to publish them, on the primary,
// and the reader starts. Truncates the log holds from before that change
// were not published and are not delivered (docs/sources/postgres.md).
func (r *Reader) checkPublication(ctx context.Context, n names) error {
	tables := r.src.cfg.Tables
	lacks, err := r.rep.publicationLacks(ctx, n, tables)
	if err != nil || lacks == nil {
		return err
	}
	prim := r.src.primary(r.sh)
	if r.rep != prim {
		primLacks, err := prim.publicationLacks(ctx, n, tables)
		switch {
		case err != nil:
			return fmt.Errorf("%s; the primary could not be asked whether it does: %w", strings.TrimPrefix(lacks.Error(), errPublication.Error()+": "), err)
		case primLacks == nil:
			return nil
		}
		lacks = primLacks
	}
	if !lacks.onlyTruncates() {
		return lacks
	}
	return prim.publishTruncates(ctx, n)
}

// onlyTruncates: the publication exists and lacks nothing but truncates.
func (e *publicationError) onlyTruncates() bool {
	return !e.missing && len(e.tables) == 0 && len(e.actions) == 1 && e.actions[0] == "truncates"
}

// publishTruncates makes the stream's publication publish truncates too,
// as EnsureStream makes it today.
func (r *replica) publishTruncates(ctx context.Context, n names) error {
	pool, err := r.poolOf()
	if err != nil {
		return err
	}
	pub := n.pub
	if _, err := pool.Exec(ctx, `ALTER PUBLICATION `+pgx.Identifier{pub}.Sanitize()+` SET (publish = '`+publishedOps+`')`); err != nil {
		return fmt.Errorf("make publication %s on %s publish truncates: %w", pub, r.cfg.Alias, err)
	}
	return nil
}
