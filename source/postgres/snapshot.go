package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/source"
)

// A snapshot (startFrom "snapshot") copies the rows the published tables
// hold into the stream as Read records, in chunks by primary key, woven
// into the change log so that the result is consistent without holding a
// snapshot open, and resumable after a crash:
//
//  1. the reader writes a watermark message on the primary (at LSN L),
//  2. waits until its replica has replayed L, and selects the next chunk
//     there (so the rows are as of a moment at or after L),
//  3. records the chunk's cursor on the primary, in
//     tabletflow.snapshot_chunks, with L;
//  4. when its change log reaches L, it hands out the chunk's rows at
//     positions (L+1, 1…n), before the changes that follow L;
//  5. once the sink committed them (the Ack), it marks the chunk acked.
//
// Changes between L and the moment of the select are then applied on top
// of rows that already hold them; inserts, updates and deletes set a row's
// values, so applying them again leaves the same rows. After a crash the
// copy resumes after the last acked chunk: a chunk committed but not yet
// marked is copied again, at new positions (Read records are upserts of
// the row as it then is, so the rows replayed stay the same). A chunk of a
// reader that was fenced is never acked.

// snapshotPrefix marks the watermark messages.
const snapshotPrefix = "tabletflow.snapshot"

// progressTable keeps the chunks' cursors on each shard's primary.
const progressTable = "tabletflow.snapshot_chunks"

// replayWait bounds waiting for a standby to replay a watermark.
const replayWait = 30 * time.Second

// snapTable is a published table as the snapshot copies it.
type snapTable struct {
	name  string // schema.table
	ident string // quoted
	rel   *relation
	pk    []int // indexes of the primary key's columns
	types []string
}

// snapshot is a reader's copy in progress.
type snapshot struct {
	tables  []snapTable
	ti      int      // table being copied
	last    []string // its last copied key (text), nil: from the first row
	done    bool
	pending *chunk // selected, waiting for its watermark in the log
}

type chunk struct {
	lsn     pglogrepl.LSN
	records []source.Record
}

// ensureProgressTable makes tabletflow.snapshot_chunks on a primary.
func ensureProgressTable(ctx context.Context, r *replica) error {
	pool, err := r.poolOf()
	if err != nil {
		return err
	}
	for _, q := range []string{
		`CREATE SCHEMA IF NOT EXISTS tabletflow`,
		`CREATE TABLE IF NOT EXISTS ` + progressTable + ` (
			stream text NOT NULL, shard text NOT NULL, low_lsn pg_lsn NOT NULL,
			tbl text NOT NULL, last_key text[], table_done bool NOT NULL, all_done bool NOT NULL,
			acked bool NOT NULL DEFAULT false,
			PRIMARY KEY (stream, shard, low_lsn))`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil && !isCode(err, "23505") && !isCode(err, "42P06") && !isCode(err, "42P07") {
			return fmt.Errorf("snapshot progress table on %s: %w", r.cfg.Alias, err)
		}
	}
	return nil
}

// openSnapshot resumes (or begins) a shard's copy: after the last acked
// chunk. It returns nil when the stream has no snapshot or its copy is
// complete.
func (r *Reader) openSnapshot(ctx context.Context, stream string) (*snapshot, error) {
	meta, _, err := r.rep.readMeta(ctx, stream)
	if err != nil || !meta.Snapshot {
		return nil, err
	}
	prim, err := r.src.primary(r.sh).poolOf()
	if err != nil {
		return nil, err
	}
	var tbl string
	var last []string
	var tableDone, allDone bool
	err = prim.QueryRow(ctx, `SELECT tbl, last_key, table_done, all_done FROM `+progressTable+`
		WHERE stream = $1 AND shard = $2 AND acked ORDER BY low_lsn DESC LIMIT 1`,
		stream, r.sh.id).Scan(&tbl, &last, &tableDone, &allDone)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("snapshot progress of shard %s: %w", r.sh.id, err)
	}
	if allDone {
		return nil, nil
	}
	snap := &snapshot{}
	if snap.tables, err = r.snapTables(ctx, stream); err != nil {
		return nil, err
	}
	if tbl != "" {
		for i, t := range snap.tables {
			if t.name == tbl {
				snap.ti, snap.last = i, last
			}
		}
		if tableDone {
			snap.ti, snap.last = snap.ti+1, nil
		}
	}
	snap.done = snap.ti >= len(snap.tables)
	return snap, nil
}

// snapTables lists the stream's published tables with their columns, as
// the replica's catalog has them. A table without a primary key cannot be
// copied in chunks.
func (r *Reader) snapTables(ctx context.Context, stream string) ([]snapTable, error) {
	pool, err := r.rep.poolOf()
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT c.oid, n.nspname, c.relname FROM pg_publication_tables p
		JOIN pg_namespace n ON n.nspname = p.schemaname JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
		WHERE p.pubname = $1 ORDER BY 2, 3`, PublicationName(stream))
	if err != nil {
		return nil, fmt.Errorf("published tables: %w", err)
	}
	type tab struct {
		oid          uint32
		schema, name string
	}
	var tabs []tab
	for rows.Next() {
		var t tab
		if err := rows.Scan(&t.oid, &t.schema, &t.name); err != nil {
			return nil, err
		}
		tabs = append(tabs, t)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []snapTable
	for _, t := range tabs {
		st := snapTable{name: t.schema + "." + t.name, ident: pgx.Identifier{t.schema, t.name}.Sanitize()}
		m := &pglogrepl.RelationMessage{RelationID: t.oid, Namespace: t.schema, RelationName: t.name}
		cols, err := pool.Query(ctx, `SELECT attname, atttypid, format_type(atttypid, atttypmod) FROM pg_attribute
			WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, t.oid)
		if err != nil {
			return nil, err
		}
		for cols.Next() {
			c := &pglogrepl.RelationMessageColumn{}
			var typ string
			if err := cols.Scan(&c.Name, &c.DataType, &typ); err != nil {
				return nil, err
			}
			m.Columns = append(m.Columns, c)
			st.types = append(st.types, typ)
		}
		if err := cols.Err(); err != nil {
			return nil, err
		}
		st.rel = newRelation(m)
		if st.rel.key, err = r.keyOf(m); err != nil {
			return nil, err
		}
		for i, k := range st.rel.key {
			if k {
				st.pk = append(st.pk, i)
			}
		}
		if len(st.pk) == 0 {
			return nil, fmt.Errorf("snapshot of %s: the table has no primary key to copy it in chunks by", st.name)
		}
		out = append(out, st)
	}
	return out, nil
}

// nextChunk writes a watermark, selects the next chunk of rows on the
// replica once it has replayed the watermark, and records the chunk's
// cursor on the primary. The chunk is handed out when the log reaches the
// watermark.
func (r *Reader) nextChunk(ctx context.Context, stream string, size int) error {
	snap := r.snap
	prim := r.src.primary(r.sh)
	ppool, err := prim.poolOf()
	if err != nil {
		return err
	}
	var lsnText string
	if err := ppool.QueryRow(ctx, `SELECT pg_logical_emit_message(false, $1, $2)::text`, snapshotPrefix, stream+"/"+r.sh.id).Scan(&lsnText); err != nil {
		return fmt.Errorf("snapshot watermark on %s: %w", prim.cfg.Alias, err)
	}
	low, err := pglogrepl.ParseLSN(lsnText)
	if err != nil {
		return err
	}
	pool, err := r.rep.poolOf()
	if err != nil {
		return err
	}
	if r.rep != prim {
		if err := waitReplayed(ctx, pool, low); err != nil {
			return fmt.Errorf("snapshot on %s: %w", r.rep.cfg.Alias, err)
		}
	}
	t := snap.tables[snap.ti]
	recs, last, err := selectChunk(ctx, pool, t, snap.last, size)
	if err != nil {
		return fmt.Errorf("snapshot of %s on %s: %w", t.name, r.rep.cfg.Alias, err)
	}
	for i := range recs {
		recs[i].Tablet = r.sh.id
	}
	tableDone := len(recs) < size
	allDone := tableDone && snap.ti == len(snap.tables)-1
	if !tableDone {
		snap.last = last
	}
	if _, err := ppool.Exec(ctx, `INSERT INTO `+progressTable+` (stream, shard, low_lsn, tbl, last_key, table_done, all_done)
		VALUES ($1, $2, $3::pg_lsn, $4, $5, $6, $7)`, stream, r.sh.id, low.String(), t.name, snap.last, tableDone, allDone); err != nil {
		return fmt.Errorf("snapshot progress on %s: %w", prim.cfg.Alias, err)
	}
	if tableDone {
		snap.ti, snap.last = snap.ti+1, nil
	}
	snap.done = allDone
	snap.pending = &chunk{lsn: low, records: recs}
	return nil
}

// waitReplayed waits until a standby has replayed lsn.
func waitReplayed(ctx context.Context, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, lsn pglogrepl.LSN) error {
	deadline := time.Now().Add(replayWait)
	for {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT COALESCE(pg_last_wal_replay_lsn() >= $1::pg_lsn, true)`, lsn.String()).Scan(&ok); err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby did not replay %s within %v", lsn, replayWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// selectChunk reads up to size rows of t after the key last, in key order,
// as Read records (values as the change log writes them), and returns the
// last row's key.
func selectChunk(ctx context.Context, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, t snapTable, last []string, size int) ([]source.Record, []string, error) {
	cols := make([]string, len(t.rel.Columns))
	for i, c := range t.rel.Columns {
		cols[i] = "t." + pgx.Identifier{c.Name}.Sanitize() + "::text"
	}
	keyCols := make([]string, len(t.pk))
	params := make([]string, len(t.pk))
	for i, k := range t.pk {
		// Qualified: ORDER BY a bare name would sort by the output column
		// of that name, the text.
		keyCols[i] = "t." + pgx.Identifier{t.rel.Columns[k].Name}.Sanitize()
		params[i] = fmt.Sprintf("($%d::text)::%s", i+1, t.types[k])
	}
	q := `SELECT ` + strings.Join(cols, ", ") + ` FROM ` + t.ident + ` t`
	var args []any
	if last != nil {
		q += ` WHERE (` + strings.Join(keyCols, ", ") + `) > (` + strings.Join(params, ", ") + `)`
		for _, v := range last {
			args = append(args, v)
		}
	}
	q += fmt.Sprintf(` ORDER BY %s LIMIT %d`, strings.Join(keyCols, ", "), size)
	rows, err := pool.Query(ctx, q, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	now := time.Now().UTC()
	var out []source.Record
	var lastKey []string
	vals := make([]*string, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return nil, nil, err
		}
		tuple := &pglogrepl.TupleData{ColumnNum: uint16(len(vals))}
		for _, v := range vals {
			c := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull}
			if v != nil {
				c.DataType, c.Data = pglogrepl.TupleDataTypeText, []byte(*v)
			}
			tuple.Columns = append(tuple.Columns, c)
		}
		rec, err := record(t.rel, source.Read, 0, nil, tuple)
		if err != nil {
			return nil, nil, err
		}
		rec.CommitTime = now
		out = append(out, rec)
		lastKey = lastKey[:0]
		for _, k := range t.pk {
			lastKey = append(lastKey, *vals[k])
		}
	}
	return out, append([]string(nil), lastKey...), rows.Err()
}

// delivered hands a chunk out when the log reaches its watermark: its rows
// become a whole unit at positions (L+1, 1…n), remembered until acked.
func (r *Reader) delivered(c *chunk) {
	r.snap.pending = nil
	r.unacked = append(r.unacked, c.lsn)
	if len(c.records) == 0 {
		r.idle = max(r.idle, c.lsn+1)
		return
	}
	for i := range c.records {
		c.records[i].Position = source.Checkpoint{Term: uint64(c.lsn) + 1, Index: uint64(i + 1)}
	}
	r.ready = append(r.ready, whole{cp: c.records[len(c.records)-1].Position, records: c.records})
}

// ackChunks marks the chunks the sink now holds (watermark below lsn) as
// acked on the primary, best effort: an unmarked chunk is copied again
// after a crash.
func (r *Reader) ackChunks(ctx context.Context, stream string, lsn pglogrepl.LSN) {
	var done []string
	keep := r.unacked[:0]
	for _, l := range r.unacked {
		if l < lsn {
			done = append(done, l.String())
		} else {
			keep = append(keep, l)
		}
	}
	if len(done) == 0 {
		return
	}
	pool, err := r.src.primary(r.sh).poolOf()
	if err != nil {
		return
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := pool.Exec(actx, `UPDATE `+progressTable+` SET acked = true
		WHERE stream = $1 AND shard = $2 AND low_lsn = ANY($3::text[]::pg_lsn[])`, stream, r.sh.id, done); err != nil {
		return // kept: marked with the next ack
	}
	r.unacked = keep
}
