package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tabletflow/tabletflow/source"
)

// A snapshot (startFrom "snapshot") copies the rows the published tables
// hold into the stream as Read records, in chunks by primary key, woven
// into the change log so that the result is consistent without holding a
// snapshot open, and resumable after a crash:
//
//  1. the reader writes a watermark message on the primary; it ends at
//     LSN L, where the next WAL record begins;
//  2. waits until its replica has replayed L, and selects the next chunk
//     there in a snapshot that sees every transaction the change log has
//     delivered so far (so the rows are as of a moment at or after L);
//  3. records the chunk's cursor on the primary, in
//     tabletflow.snapshot_chunks, with L;
//  4. when its change log reaches L, it checks that the select's snapshot
//     saw every transaction the log delivered before L: a commit's record
//     is in the WAL before it becomes visible (on a primary, after its
//     flush and any synchronous standby's answer), so one written before L
//     may still have been invisible to the select. If one was, the chunk
//     is dropped and selected again (step 1) once it is visible; else its
//     rows are handed out at positions (L, 1…n): after every commit before
//     L, before every change after it. (L, not L+1: a reader that resumes
//     from the chunk asks the server for what commits at or after its
//     checkpoint's LSN, and the commit record that begins at L belongs
//     after the chunk);
//  5. once the sink committed them (the Ack), it marks the chunk acked.
//
// The transactions of step 2 are kept on the primary too (in
// tabletflow.snapshot_delivered, before a batch that holds them is handed
// out): a reader that resumes after them does not get them from the log
// again, yet its selects must wait for them.
//
// Changes between L and the moment of the select are then applied on top
// of rows that already hold them; inserts, updates and deletes set a row's
// values, so applying them again leaves the same rows. After a crash the
// copy resumes after the last acked chunk: a chunk committed but not yet
// marked is copied again, at new positions (Read records are upserts of
// the row as it then is, so the rows replayed stay the same). A chunk of a
// reader that was fenced is never acked.

// snapshotHook, if set (by tests), runs at each step of a chunk: right
// after its watermark is written ("watermark"), while its select waits for
// a commit to become visible ("waiting"), and after its select
// ("selected"); and when EnsureStream is about to record a new stream on
// the primary ("meta").
var snapshotHook func(step string)

// snapshotPrefix marks the watermark messages.
const snapshotPrefix = "tabletflow.snapshot"

// progressTable keeps the chunks' cursors on each shard's primary.
const progressTable = "tabletflow.snapshot_chunks"

// deliveredTable keeps, per (stream, shard), the transactions the change
// log delivered during the copy that a later select may not see yet.
const deliveredTable = "tabletflow.snapshot_delivered"

// replayWait bounds waiting for a standby to replay a watermark.
const replayWait = 30 * time.Second

// snapTable is a published table as the snapshot copies it.
type snapTable struct {
	name  string // schema.table
	root  string // its partition tree's root (schema.table; itself if none)
	ident string // quoted
	rel   *relation
	pk    []int // indexes of the primary key's columns
	types []string
}

// snapshot is a reader's copy in progress.
type snapshot struct {
	// kind and id: what the copy is (source.CopyStart, CopyResync or
	// CopySnapshot) and the resync's or the ad-hoc job's id.
	kind, id string
	// key: the shard column its progress rows are kept under, with the
	// stream's id in the stream column: the shard's id for the stream's
	// start or resync copy, jobKey's for an ad-hoc job.
	key     string
	tables  []snapTable
	ti      int      // table being copied
	last    []string // its last copied key (text), nil: from the first row
	done    bool
	pending *chunk // selected, waiting for its watermark in the log
	// recent: the transactions the change log delivered during the copy
	// that a select may still not see (none below the last chunk's xmin);
	// unsaved: some are not in deliveredTable yet.
	recent  map[uint32]bool
	unsaved bool
	// resync: the copy is a resync's (streamMeta.Resync), framed by
	// markers.
	resync bool
}

type chunk struct {
	lsn     pglogrepl.LSN
	records []source.Record
	seen    visibility // the select's
	// the cursor before the chunk, to select it again
	fromTable int
	fromKey   []string
	// tableDone: the chunk ends its table; last: the copy is complete
	// after this chunk.
	tableDone, last bool
}

// committed notes a transaction the change log delivered. Once a start
// or resync copy is complete, its reader still notes them until its next
// GetChanges hands them to the ad-hoc job that may follow (followWithJob):
// that job's first select must see them too.
func (s *snapshot) committed(xid uint32) {
	if s.done && s.pending == nil && s.kind == source.CopySnapshot {
		return
	}
	if s.recent == nil {
		s.recent = map[uint32]bool{}
	}
	if !s.recent[xid] {
		s.recent[xid], s.unsaved = true, true
	}
}

// visibility is a snapshot's (pg_current_snapshot()) with its xids cut to
// the 32 bits the change log carries: a transaction is invisible to it if
// it was in progress or had not begun.
type visibility struct {
	xmin, xmax uint32
	xip        map[uint32]bool
}

// precedes compares 32-bit xids as PostgreSQL does (modulo 2^32).
func precedes(a, b uint32) bool { return int32(a-b) < 0 }

func parseVisibility(text string) (visibility, error) {
	parts := strings.Split(text, ":")
	if len(parts) != 3 {
		return visibility{}, fmt.Errorf("snapshot %q: want xmin:xmax:xip", text)
	}
	xid := func(s string) (uint32, error) {
		n, err := strconv.ParseUint(s, 10, 64)
		return uint32(n), err
	}
	var v visibility
	var err error
	if v.xmin, err = xid(parts[0]); err != nil {
		return v, fmt.Errorf("snapshot %q: %w", text, err)
	}
	if v.xmax, err = xid(parts[1]); err != nil {
		return v, fmt.Errorf("snapshot %q: %w", text, err)
	}
	v.xip = map[uint32]bool{}
	for _, f := range strings.Split(parts[2], ",") {
		if f == "" {
			continue
		}
		x, err := xid(f)
		if err != nil {
			return v, fmt.Errorf("snapshot %q: %w", text, err)
		}
		v.xip[x] = true
	}
	return v, nil
}

// missed lists the committed transactions of xids the snapshot did not see.
func (v visibility) missed(xids map[uint32]bool) []uint32 {
	var out []uint32
	for x := range xids {
		if v.xip[x] || !precedes(x, v.xmax) {
			out = append(out, x)
		}
	}
	return out
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
		`CREATE TABLE IF NOT EXISTS ` + deliveredTable + ` (
			stream text NOT NULL, shard text NOT NULL, xids bigint[] NOT NULL,
			PRIMARY KEY (stream, shard))`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil && !isCode(err, "23505") && !isCode(err, "42P06") && !isCode(err, "42P07") {
			return fmt.Errorf("snapshot progress table on %s: %w", r.cfg.Alias, err)
		}
	}
	return nil
}

// copySpec is a copy a reader may open: the stream's start or resync
// copy (every published table), or an ad-hoc job's (its tables).
type copySpec struct {
	kind, id, key string   // as in snapshot
	tables        []string // nil: every published table
}

// openSnapshot resumes (or begins) the shard's copy: the stream's start or
// resync copy while it is not complete, else its ad-hoc job's (see
// adhoc.go). It returns nil when there is neither. meta is the stream's
// record as Reader.find reads it: a standby that has not replayed the
// record yet asks the primary, or it would take the stream for one without
// a copy and skip it for good. A standby's reader takes the job from the
// primary's record in any case (Reader.recordedJob).
func (r *Reader) openSnapshot(ctx context.Context, stream string, meta streamMeta) (*snapshot, error) {
	if meta.Snapshot {
		c := copySpec{kind: source.CopyStart, key: r.sh.id}
		if meta.Resync != "" {
			c.kind, c.id = source.CopyResync, meta.Resync
		}
		if snap, err := r.openCopy(ctx, stream, c); snap != nil || err != nil {
			return snap, err
		}
	}
	if r.rep != r.src.primary(r.sh) {
		meta = r.recordedJob(ctx, stream)
	}
	return r.openJob(ctx, stream, meta)
}

// openCopy resumes (or begins) copy c after its last acked chunk; nil when
// it is complete. The progress is the primary's; for the stream's start or
// resync copy a standby's replayed copy of it that says the copy is
// complete is enough (a copy never becomes incomplete again), so a
// complete stream reads from a standby with the primary down. (Not for a
// job: its record was just read on the primary, and a job's id given again
// after another job replaced it starts afresh, which the standby may not
// have replayed.)
func (r *Reader) openCopy(ctx context.Context, stream string, c copySpec) (*snapshot, error) {
	if r.rep != r.src.primary(r.sh) && !r.behind && c.kind != source.CopySnapshot {
		pool, err := r.rep.poolOf()
		if err != nil {
			return nil, err
		}
		if p, err := readProgress(ctx, pool, stream, c.key); err == nil && p.allDone {
			r.completed(c)
			return nil, nil
		}
	}
	prim, err := r.src.primary(r.sh).poolOf()
	if err != nil {
		return nil, err
	}
	p, err := readProgress(ctx, prim, stream, c.key)
	if err != nil {
		return nil, fmt.Errorf("snapshot progress of shard %s: %w", r.sh.id, err)
	}
	tbl, last, tableDone := p.tbl, p.last, p.tableDone
	if p.allDone {
		r.completed(c)
		return nil, nil
	}
	snap := &snapshot{kind: c.kind, id: c.id, key: c.key, resync: c.kind == source.CopyResync}
	if snap.tables, err = r.snapTables(ctx, stream); err != nil {
		return nil, err
	}
	if c.tables != nil {
		if snap.tables, err = r.only(snap.tables, c); err != nil {
			return nil, err
		}
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
	var xids []int64
	err = prim.QueryRow(ctx, `SELECT xids FROM `+deliveredTable+` WHERE stream = $1 AND shard = $2`, stream, c.key).Scan(&xids)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) && !isCode(err, "42P01") { // 42P01: a stream older than the table
		return nil, fmt.Errorf("snapshot: transactions delivered on shard %s: %w", r.sh.id, err)
	}
	for _, x := range xids {
		snap.committed(uint32(x))
	}
	snap.unsaved = false
	r.opened(ctx, snap)
	return snap, nil
}

// only keeps of the published tables those copy c names (a partitioned
// table by its partitions), in their order. A table c names that the
// replica's catalog does not publish is an error: a standby that has not
// replayed the publication's change yet (the reader's start checked that
// the primary publishes it).
func (r *Reader) only(tables []snapTable, c copySpec) ([]snapTable, error) {
	var out []snapTable
	for _, t := range tables {
		if slices.Contains(c.tables, t.name) || slices.Contains(c.tables, t.root) {
			out = append(out, t)
		}
	}
	for _, name := range c.tables {
		if !slices.ContainsFunc(out, func(t snapTable) bool { return t.name == name || t.root == name }) {
			return nil, fmt.Errorf("snapshot %s: %s is not published on %s", c.id, name, r.rep.cfg.Alias)
		}
	}
	return out, nil
}

// progress is a shard's copy as its last acked chunk left it.
type progress struct {
	tbl                string
	last               []string
	tableDone, allDone bool
}

// readProgress reads a shard's progress on a server: the primary, or a
// standby's replayed copy. No chunk acked yet: the zero progress.
func readProgress(ctx context.Context, pool *pgxpool.Pool, stream, shard string) (progress, error) {
	var p progress
	err := pool.QueryRow(ctx, `SELECT tbl, last_key, table_done, all_done FROM `+progressTable+`
		WHERE stream = $1 AND shard = $2 AND acked ORDER BY low_lsn DESC LIMIT 1`,
		stream, shard).Scan(&p.tbl, &p.last, &p.tableDone, &p.allDone)
	if errors.Is(err, pgx.ErrNoRows) {
		return progress{}, nil
	}
	return p, err
}

// saveDelivered records the transactions the change log delivered during
// the copy that a later select may not see yet, before a batch that holds
// them is handed out: a reader that resumes after that batch does not get
// them from the log again, yet its selects must wait until they are
// visible (a commit waiting for a synchronous standby may still not be).
func (r *Reader) saveDelivered(ctx context.Context, stream string) error {
	snap := r.snap
	xids := make([]int64, 0, len(snap.recent))
	for x := range snap.recent {
		xids = append(xids, int64(x))
	}
	slices.Sort(xids)
	prim := r.src.primary(r.sh)
	pool, err := prim.poolOf()
	if err != nil {
		return err
	}
	save := func() error {
		_, err := pool.Exec(ctx, `INSERT INTO `+deliveredTable+` (stream, shard, xids) VALUES ($1, $2, $3)
			ON CONFLICT (stream, shard) DO UPDATE SET xids = EXCLUDED.xids`, stream, snap.key, xids)
		return err
	}
	err = save()
	if isCode(err, "42P01") { // a stream older than the table
		if err = ensureProgressTable(ctx, prim); err == nil {
			err = save()
		}
	}
	if err != nil {
		return fmt.Errorf("snapshot: record the transactions delivered on %s: %w", prim.cfg.Alias, err)
	}
	snap.unsaved = false
	return nil
}

// snapTables lists the stream's published tables with the columns it
// publishes (pgoutput's: no generated ones), as the replica's catalog has
// them, in the order of their names. A table without a primary key cannot
// be copied in chunks.
func (r *Reader) snapTables(ctx context.Context, stream string) ([]snapTable, error) {
	pool, err := r.rep.poolOf()
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT c.oid, n.nspname, c.relname, p.attnames::text[], rn.nspname || '.' || rc.relname
		FROM pg_publication_tables p
		JOIN pg_namespace n ON n.nspname = p.schemaname JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
		JOIN pg_class rc ON rc.oid = COALESCE(pg_partition_root(c.oid), c.oid) JOIN pg_namespace rn ON rn.oid = rc.relnamespace
		WHERE p.pubname = $1 ORDER BY 2, 3`, r.names.pub)
	if err != nil {
		return nil, fmt.Errorf("published tables: %w", err)
	}
	type tab struct {
		oid          uint32
		schema, name string
		published    []string // the columns pgoutput sends
		root         string
	}
	var tabs []tab
	for rows.Next() {
		var t tab
		if err := rows.Scan(&t.oid, &t.schema, &t.name, &t.published, &t.root); err != nil {
			return nil, err
		}
		tabs = append(tabs, t)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []snapTable
	for _, t := range tabs {
		st := snapTable{name: t.schema + "." + t.name, root: t.root, ident: pgx.Identifier{t.schema, t.name}.Sanitize()}
		m := &pglogrepl.RelationMessage{RelationID: t.oid, Namespace: t.schema, RelationName: t.name}
		// The columns the publication publishes, as pgoutput sends them:
		// generated ones left out (from 18 a stored one is in when the
		// publication says publish_generated_columns = stored), and only
		// a column list's when the publication gives one.
		cols, err := pool.Query(ctx, `SELECT attname, atttypid, format_type(atttypid, atttypmod) FROM pg_attribute
			WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attname::text = ANY($2) ORDER BY attnum`, t.oid, t.published)
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
		st.rel.types = make(map[string]string, len(m.Columns))
		for i, c := range m.Columns {
			st.rel.types[c.Name] = st.types[i]
		}
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
	if snapshotHook != nil {
		snapshotHook("watermark")
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
	tx, seen, err := seeing(ctx, pool, snap.recent)
	if err != nil {
		return fmt.Errorf("snapshot of %s on %s: %w", t.name, r.rep.cfg.Alias, err)
	}
	var recs []source.Record
	var last []string
	published, err := stillPublished(ctx, tx, r.names.pub, t)
	if err == nil && published {
		recs, last, err = selectChunk(ctx, tx, t, snap.last, size)
	}
	_ = tx.Rollback(ctx) // read only
	if err != nil {
		return fmt.Errorf("snapshot of %s on %s: %w", t.name, r.rep.cfg.Alias, err)
	}
	c := &chunk{lsn: low, records: recs, seen: seen, fromTable: snap.ti, fromKey: snap.last}
	if snapshotHook != nil {
		snapshotHook("selected")
	}
	for i := range recs {
		recs[i].Tablet = r.sh.id
	}
	tableDone := len(recs) < size
	allDone := tableDone && snap.ti == len(snap.tables)-1
	c.tableDone, c.last = tableDone, allDone
	if !tableDone {
		snap.last = last
	}
	if _, err := ppool.Exec(ctx, `INSERT INTO `+progressTable+` (stream, shard, low_lsn, tbl, last_key, table_done, all_done)
		VALUES ($1, $2, $3::pg_lsn, $4, $5, $6, $7)`, stream, snap.key, low.String(), t.name, snap.last, tableDone, allDone); err != nil {
		return fmt.Errorf("snapshot progress on %s: %w", prim.cfg.Alias, err)
	}
	if tableDone {
		snap.ti, snap.last = snap.ti+1, nil
	}
	snap.done = allDone
	snap.pending = c
	return nil
}

// seeing begins a read-only repeatable-read transaction whose snapshot sees
// every transaction of xids (ones the change log delivered, so committed),
// waiting for them to become visible. (PostgreSQL itself does not tell a
// committed transaction that is not visible yet from a running one.)
func seeing(ctx context.Context, pool *pgxpool.Pool, xids map[uint32]bool) (pgx.Tx, visibility, error) {
	var tx pgx.Tx
	var v visibility
	var missed []uint32
	ok, err := retryFor(ctx, replayWait, func() (bool, error) {
		var err error
		if tx, err = pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}); err != nil {
			return false, err
		}
		var text string
		err = tx.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&text)
		if err == nil {
			v, err = parseVisibility(text)
		}
		if err == nil {
			if missed = v.missed(xids); len(missed) == 0 {
				return true, nil
			}
			if snapshotHook != nil {
				snapshotHook("waiting")
			}
		}
		_ = tx.Rollback(ctx)
		return false, err
	})
	switch {
	case err != nil:
		return nil, v, err
	case !ok:
		return nil, v, fmt.Errorf("%w: transactions %v, after %v (a commit waiting for a synchronous standby?)", errNotVisible, missed, replayWait)
	}
	return tx, v, nil
}

// retryFor calls try every 10 ms until it is done, fails or ctx ends (its
// error), or within has passed (ok false).
func retryFor(ctx context.Context, within time.Duration, try func() (done bool, err error)) (ok bool, err error) {
	deadline := time.Now().Add(within)
	for {
		if done, err := try(); done || err != nil {
			return done, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitReplayed waits until a standby has replayed lsn.
func waitReplayed(ctx context.Context, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, lsn pglogrepl.LSN) error {
	ok, err := retryFor(ctx, replayWait, func() (replayed bool, err error) {
		err = pool.QueryRow(ctx, `SELECT COALESCE(pg_last_wal_replay_lsn() >= $1::pg_lsn, true)`, lsn.String()).Scan(&replayed)
		return replayed, err
	})
	if err == nil && !ok {
		err = fmt.Errorf("the standby did not replay %s within %v", lsn, replayWait)
	}
	return err
}

// stillPublished reports whether the stream's publication pub publishes
// t (itself, or a partitioned table it is a partition of) in tx's
// snapshot, the one its chunk is selected in. A table removed from the
// stream (SetTables) while a reader copies it is copied no further, as if
// it had no more rows: a chunk selected after the removal would carry
// changes the change log no longer streams, so the sink would hold some
// changes made after the removal and not others. Every chunk selected
// before the removal holds rows as they were before it. (The catalog
// table, not pg_publication_tables: the view's function reads the latest
// catalog, not the snapshot. pg_partition_ancestors has no row for a
// table that is not a partition.)
func stillPublished(ctx context.Context, tx pgx.Tx, pub string, t snapTable) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_publication_rel pr
		JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid
		WHERE p.pubname = $1 AND (pr.prrelid = $2::oid OR pr.prrelid IN (SELECT relid FROM pg_partition_ancestors($2::oid))))`, pub, t.rel.RelationID).Scan(&ok)
	return ok, err
}

// selectChunk reads up to size rows of t after the key last, in key order,
// as Read records (values as the change log writes them), and returns the
// last row's key. Values are read in the text format, each type's output
// function as pgoutput sends it: not a cast to text, which differs for
// some types (a boolean's 'true', where its output and pgoutput's is 't';
// a char(n) without its padding).
func selectChunk(ctx context.Context, tx pgx.Tx, t snapTable, last []string, size int) ([]source.Record, []string, error) {
	cols := make([]string, len(t.rel.Columns))
	for i, c := range t.rel.Columns {
		cols[i] = "t." + pgx.Identifier{c.Name}.Sanitize()
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
	args := []any{pgx.QueryResultFormats{pgx.TextFormatCode}} // for every column
	if last != nil {
		q += ` WHERE (` + strings.Join(keyCols, ", ") + `) > (` + strings.Join(params, ", ") + `)`
		for _, v := range last {
			args = append(args, v)
		}
	}
	q += fmt.Sprintf(` ORDER BY %s LIMIT %d`, strings.Join(keyCols, ", "), size)
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	now := time.Now().UTC()
	var out []source.Record
	var lastKey []string
	for rows.Next() {
		vals := rows.RawValues() // nil: NULL; valid until the next row
		if len(vals) != len(cols) {
			return nil, nil, fmt.Errorf("snapshot of %s: %d values for %d columns", t.name, len(vals), len(cols))
		}
		tuple := &pglogrepl.TupleData{ColumnNum: uint16(len(vals))}
		for _, v := range vals {
			c := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull}
			if v != nil {
				c.DataType, c.Data = pglogrepl.TupleDataTypeText, v
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
			lastKey = append(lastKey, string(vals[k]))
		}
	}
	return out, append([]string(nil), lastKey...), rows.Err()
}

// handedOut is a chunk handed out: its copy's progress key, its watermark
// and last position.
type handedOut struct {
	key  string
	lsn  pglogrepl.LSN
	last source.Checkpoint
}

// delivered hands a chunk out when the log reaches its watermark: its rows
// become a whole unit at positions (L, 1…n), remembered until acked. A
// chunk whose select missed a transaction the log delivered before L is
// dropped, to be selected again once that one is visible.
func (r *Reader) delivered(c *chunk) {
	snap := r.snap
	snap.pending = nil
	if len(c.seen.missed(snap.recent)) > 0 {
		snap.ti, snap.last, snap.done = c.fromTable, c.fromKey, false
		return
	}
	for x := range snap.recent {
		if precedes(x, c.seen.xmin) {
			delete(snap.recent, x) // every later snapshot sees it
		}
	}
	report := r.reportOf(snap, c)
	h := handedOut{key: snap.key, lsn: c.lsn, last: source.Checkpoint{Term: uint64(c.lsn)}}
	if snap.resync {
		c.records = framed(c, r.sh.id)
	}
	if len(c.records) == 0 {
		r.idle = max(r.idle, c.lsn)
		r.unacked = append(r.unacked, h)
		report.apply()
		return
	}
	for i := range c.records {
		c.records[i].Position = source.Checkpoint{Term: uint64(c.lsn), Index: uint64(i + 1)}
	}
	h.last = c.records[len(c.records)-1].Position
	r.unacked = append(r.unacked, h)
	r.ready = append(r.ready, whole{cp: h.last, records: c.records, report: report})
}

// framed ends a resync's last chunk with its resync-end marker.
func framed(c *chunk, tablet string) []source.Record {
	if !c.last {
		return c.records
	}
	return append(c.records, source.Record{Tablet: tablet, Op: source.ResyncEnd, CommitTime: time.Now().UTC()})
}

// ackChunks marks the chunks the sink now holds (up to cp) as acked on the
// primary, best effort: an unmarked chunk is copied again after a crash.
// They may be of two copies (a job's that followed the stream's start
// copy: see Reader.followWithJob).
func (r *Reader) ackChunks(ctx context.Context, stream string, cp source.Checkpoint) {
	done := map[string][]string{} // by progress key
	keep := r.unacked[:0:0]
	for _, h := range r.unacked {
		if h.last.Compare(cp) <= 0 {
			done[h.key] = append(done[h.key], h.lsn.String())
		} else {
			keep = append(keep, h)
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
	for key, lsns := range done {
		if _, err := pool.Exec(actx, `UPDATE `+progressTable+` SET acked = true
			WHERE stream = $1 AND shard = $2 AND low_lsn = ANY($3::text[]::pg_lsn[])`, stream, key, lsns); err != nil {
			return // kept: marked with the next ack (again: it is idempotent)
		}
	}
	r.unacked = keep
}
