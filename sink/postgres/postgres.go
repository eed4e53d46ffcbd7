// Package postgres is the PostgreSQL sink. In changelog mode every record
// is appended to one change table, <schema>.changes, a resync's markers
// too (an empty tbl; key, before and after NULL); in apply mode records are
// applied to mirror tables of the source's rows (apply.go), and a resync's
// markers remove the tablet's rows its copy did not give (resync.go). Each
// tablet's checkpoint is a row of <schema>.checkpoints, written in the same
// transaction as the tablet's records, and only if it is still the
// checkpoint the writer started from (compare-and-set). So a batch is in
// the database whole or not at all, a stale writer is fenced, and delivery
// is exactly once across crashes, retries and workers on different hosts.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// maxTabletID bounds a tablet ID stored as text.
const maxTabletID = 255

// Sink writes a stream's records into PostgreSQL. It is safe for
// concurrent use by different tablets.
type Sink struct {
	stream    string
	schema    string
	applyMode bool
	// given: apply mode's tables from the config (sink.tables), source
	// table → schema.table.
	given map[string]string
	// mirrorTypes: sink.mirrorTypes (typed.go).
	mirrorTypes string
	pool        *pgxpool.Pool
	mirrors     mirrors

	mu     sync.Mutex
	closed bool
}

var _ sink.Sink = (*Sink)(nil)

// New connects to the DSN in the environment variable cfg.DSNEnv (getenv
// nil: os.Getenv) and makes the sink's schema and tables if they are not
// there. A variable that is not set is an error naming it (never a value).
func New(ctx context.Context, cfg Config, stream string, getenv func(string) string) (*Sink, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if cfg.Mode == "" {
		cfg.Mode = "changelog"
	}
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if err := cfg.validate(); err != nil {
		return nil, config.InSection("sink", err)
	}
	dsn := getenv(cfg.DSNEnv)
	if dsn == "" {
		return nil, fmt.Errorf("sink.dsnEnv: environment variable %s is not set: %w", cfg.DSNEnv, sink.ErrDenied)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("sink.dsnEnv: %s holds a DSN that does not parse: %w", cfg.DSNEnv, sink.ErrDenied)
	}
	pc.ConnConfig.ConnectTimeout = 5 * time.Second
	pc.ConnConfig.RuntimeParams["application_name"] = "tabletflow-sink"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, classify(err)
	}
	s := &Sink{stream: stream, schema: cfg.Schema, applyMode: cfg.Mode == "apply", given: maps.Clone(cfg.Tables), mirrorTypes: cfg.MirrorTypes, pool: pool}
	if err := s.setUp(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// table is a qualified, quoted name of one of the sink's tables.
func (s *Sink) table(name string) string { return pgx.Identifier{s.schema, name}.Sanitize() }

// setUp makes the schema and tables that are not there (concurrent
// workers may race, which PostgreSQL resolves with a duplicate-object or
// unique violation we ignore). What is there is not made again: CREATE
// … IF NOT EXISTS checks the CREATE privilege before it looks, so a role
// given the schema and tables by their owner needs no CREATE at all.
func (s *Sink) setUp(ctx context.Context) error {
	var haveSchema, haveCheckpoints, haveChanges bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL, to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL`,
		pgx.Identifier{s.schema}.Sanitize(), s.table("checkpoints"), s.table("changes")).Scan(&haveSchema, &haveCheckpoints, &haveChanges); err != nil {
		return fmt.Errorf("set up the sink's tables in schema %s: %w", s.schema, classify(err))
	}
	var stmts []string
	if !haveSchema {
		stmts = append(stmts, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{s.schema}.Sanitize())
	}
	if !haveCheckpoints {
		stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+s.table("checkpoints")+` (
			stream text NOT NULL,
			tablet text NOT NULL,
			checkpoint text NOT NULL,
			updated_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (stream, tablet))`)
	}
	if !haveChanges {
		stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+ChangeTableDDL(s.schema))
	}
	for _, q := range stmts {
		if _, err := s.pool.Exec(ctx, q); err != nil && !madeMeanwhile(err) {
			return fmt.Errorf("set up the sink's tables in schema %s: %w", s.schema, classify(err))
		}
	}
	return nil
}

// ChangeTableDDL is the column list and key of <schema>.changes, after
// CREATE TABLE <name> (for a baseline that must store records the same
// way, bench/pgsink's raw COPY loop).
func ChangeTableDDL(schema string) string {
	return pgx.Identifier{schema, "changes"}.Sanitize() + ` (
			stream text NOT NULL,
			tablet text NOT NULL,
			pos_term numeric(20) NOT NULL,
			pos_index numeric(20) NOT NULL,
			tbl text NOT NULL,
			op text NOT NULL,
			key json,
			before json,
			after json,
			commit_time timestamptz NOT NULL,
			commit_time_ns bigint NOT NULL,
			PRIMARY KEY (stream, tablet, pos_term, pos_index))`
}

// Close closes the sink's connections; open writers stop working.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.pool.Close()
	}
	return nil
}

func (s *Sink) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Open stores the tablet (its checkpoint row, empty) if it is new and
// returns a writer fenced to its stored checkpoint. Records of the tablet
// without a checkpoint row, or past it, are ErrCorrupt.
func (s *Sink) Open(ctx context.Context, tablet string) (sink.TabletWriter, error) {
	if s.isClosed() {
		return nil, sink.ErrClosed
	}
	if tablet == "" || len(tablet) > maxTabletID {
		return nil, fmt.Errorf("%w: %q (1 to %d bytes)", sink.ErrBadTablet, tablet, maxTabletID)
	}
	// The stored checkpoint, and the last stored position (which must not
	// be past it).
	var cpText, lastText *string
	err := s.pool.QueryRow(ctx, `SELECT
			(SELECT checkpoint FROM `+s.table("checkpoints")+` WHERE stream = $1 AND tablet = $2),
			(SELECT pos_term::text || '.' || pos_index::text FROM `+s.table("changes")+`
				WHERE stream = $1 AND tablet = $2 ORDER BY pos_term DESC, pos_index DESC LIMIT 1)`,
		s.stream, tablet).Scan(&cpText, &lastText)
	if err != nil {
		return nil, fmt.Errorf("open tablet %s: %w", tablet, classify(err))
	}
	var last source.Checkpoint
	if lastText != nil {
		if last, err = source.ParseCheckpoint(*lastText); err != nil {
			return nil, fmt.Errorf("%w: tablet %s: stored position %s", sink.ErrCorrupt, tablet, *lastText)
		}
	}
	if cpText == nil {
		if lastText != nil {
			return nil, fmt.Errorf("%w: tablet %s of stream %s has records in %s but no row in %s",
				sink.ErrCorrupt, tablet, s.stream, s.table("changes"), s.table("checkpoints"))
		}
		_, err := s.pool.Exec(ctx, `INSERT INTO `+s.table("checkpoints")+` (stream, tablet, checkpoint) VALUES ($1, $2, '')
			ON CONFLICT DO NOTHING`, s.stream, tablet)
		if err != nil {
			return nil, fmt.Errorf("open tablet %s: %w", tablet, classify(err))
		}
		return &Writer{s: s, tablet: tablet}, nil
	}
	cp, err := source.ParseCheckpoint(*cpText)
	if err != nil {
		return nil, fmt.Errorf("%w: tablet %s: stored checkpoint %q", sink.ErrCorrupt, tablet, *cpText)
	}
	if last.Compare(cp) > 0 {
		return nil, fmt.Errorf("%w: tablet %s holds records up to %s past its checkpoint %s", sink.ErrCorrupt, tablet, last, cp)
	}
	return &Writer{s: s, tablet: tablet, cp: cp}, nil
}

// Writer writes one tablet; one goroutine at a time.
type Writer struct {
	s      *Sink
	tablet string
	cp     source.Checkpoint
	staged []source.Record
	fenced bool
	closed bool
}

var _ sink.TabletWriter = (*Writer)(nil)

// Checkpoint is the stored checkpoint as this writer sees it.
func (w *Writer) Checkpoint() source.Checkpoint { return w.cp }

func (w *Writer) usable() error {
	switch {
	case w.closed, w.s.isClosed():
		return sink.ErrClosed
	case w.fenced:
		return sink.ErrFenced
	}
	return nil
}

// Write stages records after the checkpoint, checking each (its tablet,
// op and JSON) first: one bad record stages nothing of the call.
func (w *Writer) Write(_ context.Context, records []source.Record) error {
	if err := w.usable(); err != nil {
		return err
	}
	from := w.cp
	if n := len(w.staged); n > 0 {
		from = w.staged[n-1].Position
	}
	var add []source.Record
	for _, r := range records {
		if err := check(r, w.tablet); err != nil {
			return err
		}
		if r.Position.Compare(from) <= 0 {
			continue
		}
		add = append(add, r)
		from = r.Position
	}
	w.staged = append(w.staged, add...)
	return nil
}

func check(r source.Record, tablet string) error {
	switch {
	case r.Tablet != tablet:
		return fmt.Errorf("%w: a record of tablet %q written to %q", sink.ErrBadRecord, r.Tablet, tablet)
	case r.Op != source.Insert && r.Op != source.Update && r.Op != source.Delete && r.Op != source.Read && r.Op != source.Truncate && !r.Op.Marker():
		return fmt.Errorf("%w: op %q at %s", sink.ErrBadRecord, r.Op, r.Position)
	case r.Position.IsZero():
		return fmt.Errorf("%w: no position", sink.ErrBadRecord)
	}
	for _, f := range []json.RawMessage{r.Key, r.Before, r.After} {
		if len(f) > 0 && !json.Valid(f) {
			return fmt.Errorf("%w: invalid JSON at %s", sink.ErrBadRecord, r.Position)
		}
	}
	return nil
}

// Commit stores the staged records and cp in one transaction, only if the
// stored checkpoint is still the writer's (else ErrFenced, nothing
// stored).
func (w *Writer) Commit(ctx context.Context, cp source.Checkpoint) error {
	if err := w.usable(); err != nil {
		return err
	}
	if cp.Compare(w.cp) < 0 || len(w.staged) > 0 && cp.Compare(w.staged[len(w.staged)-1].Position) < 0 {
		return fmt.Errorf("%w: %s is before the checkpoint %s or the last staged record", sink.ErrBadCommit, cp, w.cp)
	}
	var apply *pgx.Batch
	var applies []string // what each statement of apply writes
	if w.s.applyMode && len(w.staged) > 0 {
		var err error
		if apply, applies, err = w.s.applyBatch(ctx, w.staged); err != nil {
			w.s.forgetMirrors()
			return fmt.Errorf("commit tablet %s at %s: %w", w.tablet, cp, err)
		}
	}
	err := pgx.BeginFunc(ctx, w.s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE `+w.s.table("checkpoints")+` SET checkpoint = $4, updated_at = now()
			WHERE stream = $1 AND tablet = $2 AND checkpoint = $3`, w.s.stream, w.tablet, w.cp.String(), cp.String())
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return sink.ErrFenced
		}
		if len(w.staged) == 0 {
			return nil
		}
		if apply != nil {
			return sendApply(ctx, tx, apply, applies)
		}
		_, err = tx.CopyFrom(ctx, pgx.Identifier{w.s.schema, "changes"},
			[]string{"stream", "tablet", "pos_term", "pos_index", "tbl", "op", "key", "before", "after", "commit_time", "commit_time_ns"},
			pgx.CopyFromSlice(len(w.staged), func(i int) ([]any, error) {
				r := w.staged[i]
				return []any{w.s.stream, w.tablet, r.Position.Term, r.Position.Index, r.Table, string(r.Op),
					jsonOrNil(r.Key), jsonOrNil(r.Before), jsonOrNil(r.After), r.CommitTime, r.CommitTime.UnixNano()}, nil
			}))
		return err
	})
	if err != nil && w.s.applyMode {
		w.s.forgetMirrors() // a table may have changed under the cache
	}
	if errors.Is(err, sink.ErrFenced) {
		w.fenced = true
		return fmt.Errorf("tablet %s: stored checkpoint is no longer %s: %w", w.tablet, orNone(w.cp), sink.ErrFenced)
	}
	if err != nil {
		return fmt.Errorf("commit tablet %s at %s: %w", w.tablet, cp, classify(err))
	}
	w.cp, w.staged = cp, nil
	return nil
}

// sendApply runs apply mode's statements in tx, pipelined; an error names
// the record of the statement that failed (what[i]). pgx prepares every
// statement before it runs the first, so a statement the server cannot
// prepare (a column of another type) fails the first Exec: that error
// names its SQL, and the first record with that SQL is named.
func sendApply(ctx context.Context, tx pgx.Tx, b *pgx.Batch, what []string) error {
	br := tx.SendBatch(ctx, b)
	for i := range b.Len() {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			var pre pgx.ErrPreprocessingBatch
			if errors.As(err, &pre) {
				i = slices.IndexFunc(b.QueuedQueries, func(q *pgx.QueuedQuery) bool { return q.SQL == pre.SQL() })
			}
			if i < 0 {
				return err
			}
			return fmt.Errorf("%s: %w", what[i], err)
		}
	}
	return br.Close()
}

// Close drops what is staged.
func (w *Writer) Close() error {
	w.closed, w.staged = true, nil
	return nil
}

// jsonOrNil passes a JSON value as text for a json column, nil (SQL NULL)
// when absent or JSON null.
func jsonOrNil(v json.RawMessage) any {
	if len(v) == 0 || string(v) == "null" {
		return nil
	}
	return string(v)
}

func orNone(cp source.Checkpoint) string {
	if cp.IsZero() {
		return "none"
	}
	return cp.String()
}

// classify wraps a database error in the sink error it is a case of
// (kindOf): a missing permission is ErrDenied, a record that does not fit
// its table ErrBadRecord (the tablet fails with the reason); everything
// else (unreachable, timeouts, a server restarting) stays as it is, which
// callers treat as "unavailable, retry".
func classify(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		if kind := kindOf(pg.Code); kind != nil {
			return fmt.Errorf("%w: %w", kind, err)
		}
	}
	return err
}

// kindOf is the sink error a PostgreSQL error code (SQLSTATE) is a case
// of, nil for one that retrying may cure. Only codes whose cause stays
// until someone changes the data, the table or the grants are listed: a
// unique (23505) or foreign key (23503) violation of a given table may be
// an order across tablets that the next batches undo, and a table missing
// (42P01) is made again by the next attempt.
func kindOf(code string) error {
	switch {
	case code == "28000", // invalid authorization
		code == "28P01", // wrong password
		code == "42501": // insufficient privilege
		return sink.ErrDenied
	case strings.HasPrefix(code, "22"), // data exception: a value its column's type refuses (22P02, 22003, 22007, 22008, 22001), JSON jsonb cannot hold (22P05), bytes not UTF-8 (22021)
		code == "23502", // NOT NULL
		code == "23514", // CHECK
		code == "42804", // a column of another type (a hand-made column of a mirror table)
		code == "42703", // a column that is not there
		code == "428C9", // a generated column
		code == "54000": // a key too large for its index's row ("index row size … exceeds btree … maximum")
		return sink.ErrBadRecord
	}
	return nil
}

func isCode(err error, code string) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == code
}

// madeMeanwhile tells whether a CREATE … IF NOT EXISTS or ADD COLUMN IF
// NOT EXISTS failed because another session made the same object at the
// same moment (the check and the catalog insert are not one step):
// duplicate schema, table, object (the table's row type) or column, or a
// unique violation in the catalog. The object is there either way.
func madeMeanwhile(err error) bool {
	for _, code := range []string{"42P06", "42P07", "42710", "42701", "23505"} {
		if isCode(err, code) {
			return true
		}
	}
	return false
}
