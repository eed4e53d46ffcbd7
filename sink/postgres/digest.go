package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/tabletd/digest"
)

// Digest computes the digest of a stream's rows in schema's change table
// the way tabletd and the JSONL sink do (digest.Hash over each record's
// fields, key/before/after as stored: the json type keeps their text), and
// counts (tablet, position) pairs stored more than once, which the table's
// primary key rules out.
func Digest(ctx context.Context, conn *pgx.Conn, schema, stream string) (digest.Digest, error) {
	var d digest.Digest
	rows, err := conn.Query(ctx, `SELECT tablet, pos_term::text || '.' || pos_index::text, tbl, op,
		key::text, before::text, after::text, commit_time_ns
		FROM `+pgx.Identifier{schema, "changes"}.Sanitize()+` WHERE stream = $1`, stream)
	if err != nil {
		return d, err
	}
	defer rows.Close()
	for rows.Next() {
		var f digest.Fields
		var key, before, after *string
		var ns int64
		if err := rows.Scan(&f.Tablet, &f.Position, &f.Table, &f.Op, &key, &before, &after, &ns); err != nil {
			return d, err
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
		d.Add(digest.Hash(f))
	}
	return d, rows.Err()
}
