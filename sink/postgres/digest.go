package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/digest"
)

// Stored is what a stream's change table holds, as Digest reads it.
type Stored struct {
	// Digest of every stored row, duplicates included.
	Digest digest.Digest
	// Duplicates counts the rows beyond the first of each (tablet,
	// position): count(*) less count(DISTINCT (tablet, position)). The
	// table's primary key rules them out, so anything but 0 means the
	// table is not the sink's (its key dropped, rows copied in by hand).
	Duplicates uint64
}

// Digest computes the digest of a stream's rows in schema's change table
// the way tabletd and the JSONL sink do (digest.Hash over each record's
// fields, key/before/after as stored: the json type keeps their text), and
// counts the (tablet, position) pairs stored more than once, both in one
// snapshot of the table (a read-only repeatable-read transaction), so
// they agree while writers commit.
func Digest(ctx context.Context, conn *pgx.Conn, schema, stream string) (Stored, error) {
	var st Stored
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return st, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	table := pgx.Identifier{schema, "changes"}.Sanitize()
	if err := tx.QueryRow(ctx, `SELECT count(*) - count(DISTINCT (tablet, pos_term, pos_index))
		FROM `+table+` WHERE stream = $1`, stream).Scan(&st.Duplicates); err != nil {
		return st, err
	}
	rows, err := tx.Query(ctx, `SELECT tablet, pos_term::text || '.' || pos_index::text, tbl, op,
		key::text, before::text, after::text, commit_time_ns
		FROM `+table+` WHERE stream = $1`, stream)
	if err != nil {
		return st, err
	}
	defer rows.Close()
	for rows.Next() {
		var f digest.Fields
		var key, before, after *string
		var ns int64
		if err := rows.Scan(&f.Tablet, &f.Position, &f.Table, &f.Op, &key, &before, &after, &ns); err != nil {
			return st, err
		}
		for _, p := range []struct {
			dst *[]byte
			v   *string
		}{{&f.Key, key}, {&f.Before, before}, {&f.After, after}} {
			if p.v != nil {
				*p.dst = []byte(*p.v)
			}
		}
		f.CommitTime = time.Unix(0, ns)
		st.Digest.Add(digest.Hash(f))
	}
	return st, rows.Err()
}
