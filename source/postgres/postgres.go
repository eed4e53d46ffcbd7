// Package postgres is the Source adapter for sharded PostgreSQL: each shard
// is a tablet, its primary and physical standbys are the tablet's replicas
// (PostgreSQL 16 and later decode on standbys). A stream is one
// publication per shard (on its primary) and one logical replication slot
// (pgoutput) per shard and replica, so that any replica can take over a
// shard's reading.
//
// Positions: a record's is (commit LSN, n) — Term the end LSN of its
// transaction's commit record, Index its ordinal in the transaction from
// 1 — so positions are unique and increase in delivery (commit) order. A
// checkpoint is always a whole transaction, (end LSN, count), or an idle
// advance (LSN, 0); reading resumes by START_REPLICATION at its Term, which
// skips every transaction that committed before it. LSNs are shared by a
// primary and its standbys, so a checkpoint read on one replica means the
// same on another — on one timeline: every checkpoint of a stream is on
// the timeline its primary was on when the stream was made (recorded with
// the stream, so the checkpoint's own form carries no timeline), and a
// replica on another one (a standby promoted, or one following it) never
// serves them.
package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/source"
)

// Bounds of the adapter's own calls.
const (
	// connectTimeout bounds connecting to one replica.
	connectTimeout = 5 * time.Second
	// healthTimeout bounds one replica's health query in ListTablets.
	healthTimeout = 2 * time.Second
	// healthTTL: ListTablets answers from its last look at the servers for
	// this long (every tablet's selection lists the topology).
	healthTTL = time.Second
	// slotCreateTimeout bounds creating a slot on a standby, which waits
	// for the primary's next running-transactions record.
	slotCreateTimeout = 60 * time.Second
)

// walSenderTimeout is asked for on replication connections: a session of
// a dead worker releases its slot after this long (a variable for tests).
var walSenderTimeout = 20 * time.Second

// Source is a set of PostgreSQL shards. It is safe for concurrent use.
type Source struct {
	cfg    Config
	shards []*shard

	mu      sync.Mutex
	health  []source.Tablet
	checked time.Time
}

type shard struct {
	id       string
	replicas []*replica

	mu       sync.Mutex
	lastBeat time.Time
}

// replica is one server of a shard and its connection pool, made on first
// use.
type replica struct {
	shard string
	cfg   ShardReplica
	dsn   string
	host  string

	mu   sync.Mutex
	pool *pgxpool.Pool
	// version: the server's server_version_num, once read (versionOf).
	version int
}

var _ source.Source = (*Source)(nil)

// New makes a Source from a validated config, reading each replica's DSN
// from the environment variable it names (getenv nil: os.Getenv). A
// variable that is not set, or holds a DSN that does not parse, is an
// error naming the variable (never its value).
func New(cfg Config, getenv func(string) string) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, config.InSection("source", err)
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	s := &Source{cfg: cfg}
	for i, sc := range cfg.Shards {
		sh := &shard{id: sc.ID}
		for j, rc := range sc.Replicas {
			dsn := getenv(rc.DSNEnv)
			field := fmt.Sprintf("source.shards[%d].replicas[%d].dsnEnv", i, j)
			if dsn == "" {
				return nil, fmt.Errorf("%s: %w: %s", field, errNoDSN, rc.DSNEnv)
			}
			pc, err := pgconn.ParseConfig(dsn)
			if err != nil {
				return nil, fmt.Errorf("%s: %w: %s holds a DSN that does not parse", field, errNoDSN, rc.DSNEnv)
			}
			sh.replicas = append(sh.replicas, &replica{
				shard: sc.ID, cfg: rc, dsn: dsn, host: net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))),
			})
		}
		s.shards = append(s.shards, sh)
	}
	return s, nil
}

// Close closes every replica's pool.
func (s *Source) Close() error {
	for _, sh := range s.shards {
		for _, r := range sh.replicas {
			r.mu.Lock()
			if r.pool != nil {
				r.pool.Close()
				r.pool = nil
			}
			r.mu.Unlock()
		}
	}
	return nil
}

// Classify is the package's Classify.
func (s *Source) Classify(err error) source.Classification { return Classify(err) }

// poolOf returns the replica's pool of SQL connections.
func (r *replica) poolOf() (*pgxpool.Pool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pool != nil {
		return r.pool, nil
	}
	pc, err := pgxpool.ParseConfig(r.dsn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.cfg.DSNEnv, errNoDSN)
	}
	pc.MaxConns = 4
	pc.ConnConfig.ConnectTimeout = connectTimeout
	pc.ConnConfig.RuntimeParams["application_name"] = "tabletflow"
	p, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, err
	}
	r.pool = p
	return p, nil
}

func (s *Source) primary(sh *shard) *replica {
	for _, r := range sh.replicas {
		if r.cfg.Type == string(source.TypePrimary) {
			return r
		}
	}
	return sh.replicas[0] // validation guarantees one
}

func (s *Source) shardOf(id string) (*shard, error) {
	for _, sh := range s.shards {
		if sh.id == id {
			return sh, nil
		}
	}
	return nil, fmt.Errorf("%w: %q", source.ErrUnknownTablet, id)
}

// A stream's objects are named from its exact ID, and distinct IDs give
// distinct names: a name holds a readable part of the ID (lower case,
// every byte other than a-z, 0-9 and _ as _, cut to fit) and, at a fixed
// place, tag, a hash of the ID itself. Streams made by a version before
// (legacy names: the readable part alone, so that orders-eu, orders_eu and
// Orders_EU shared one slot) keep their names: see found and claim.

// tag is a short hash of the exact s: 16 hex digits (64 bits).
func tag(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

// readable is s as a part of a name, for people: lower case, every byte
// other than a-z, 0-9 and _ as _, at most n bytes.
func readable(s string, n int) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b[:min(len(b), max(n, 0))])
}

// PublicationName is the stream's publication on every primary:
// tfp_<readable ID>_<tag of the ID>.
func PublicationName(stream string) string {
	t := tag(stream)
	return "tfp_" + readable(stream, 63-len("tfp_")-1-len(t)) + "_" + t
}

// SlotName is the stream's slot for a shard, the same name on every replica
// of the shard (slot names are per server): tfs_<readable ID>_<shard>_<tag
// of the ID>. Shard IDs are at most 32 characters of [a-z0-9_] (config
// validation), so the name fits 63 bytes; the tag's fixed place at the
// end keeps the stream's and the shard's parts from mixing.
func SlotName(stream, shard string) string {
	t := tag(stream)
	return "tfs_" + readable(stream, 63-len("tfs_")-len(shard)-2-len(t)) + "_" + shard + "_" + t
}

// legacyIdent is how the versions before tags made a PostgreSQL
// identifier of s: readable, and cut to max bytes with a hash of the whole
// when longer.
func legacyIdent(s string, maxLen int) string {
	b := readable(s, len(s))
	if len(b) <= maxLen {
		return b
	}
	h := fnv.New32a()
	h.Write([]byte(s))
	sum := fmt.Sprintf("%08x", h.Sum32())
	return b[:maxLen-len(sum)-1] + "_" + sum
}

// legacyPublicationName and legacySlotName are the names of a stream made
// before tags; IDs that differ only in case or in characters other than
// a-z, 0-9 and _ share them.
func legacyPublicationName(stream string) string {
	return "tabletflow_" + legacyIdent(stream, 63-len("tabletflow_"))
}

func legacySlotName(stream, shard string) string {
	return "tf_" + legacyIdent(stream, 63-len("tf_")-1-len(shard)) + "_" + shard
}

// names are a stream's publication and slots: tagged, or legacy.
type names struct {
	stream string
	pub    string
	legacy bool
}

func tagged(stream string) names { return names{stream: stream, pub: PublicationName(stream)} }

func legacy(stream string) names {
	return names{stream: stream, pub: legacyPublicationName(stream), legacy: true}
}

// slot is the stream's slot on a replica of the shard.
func (n names) slot(shard string) string {
	if n.legacy {
		return legacySlotName(n.stream, shard)
	}
	return SlotName(n.stream, shard)
}

// found is what a server's catalog has of a stream: its names, whether
// its publication is there, and the publication's record.
type found struct {
	names  names
	exists bool
	meta   streamMeta
}

// find reads the stream's publication on the server: under its tagged
// names, or, for a stream made before tags, under its legacy ones, unless
// that publication's record names another stream (its claim: see claim).
// Neither there: the tagged names, exists false.
func (r *replica) find(ctx context.Context, stream string) (found, error) {
	pool, err := r.poolOf()
	if err != nil {
		return found{}, err
	}
	cur, old := tagged(stream), legacy(stream)
	rows, err := pool.Query(ctx, `SELECT pubname::text, COALESCE(obj_description(oid, 'pg_publication'), '')
		FROM pg_publication WHERE pubname = ANY($1)`, []string{cur.pub, old.pub})
	if err != nil {
		return found{}, fmt.Errorf("read the publication of %s on %s: %w", stream, r.cfg.Alias, err)
	}
	metas := map[string]streamMeta{}
	for rows.Next() {
		var name, comment string
		if err := rows.Scan(&name, &comment); err != nil {
			return found{}, err
		}
		var m streamMeta
		_ = json.Unmarshal([]byte(comment), &m) // not ours (or damaged): made again
		metas[name] = m
	}
	if err := rows.Err(); err != nil {
		return found{}, fmt.Errorf("read the publication of %s on %s: %w", stream, r.cfg.Alias, err)
	}
	if m, ok := metas[cur.pub]; ok {
		return found{names: cur, exists: true, meta: m}, nil
	}
	if m, ok := metas[old.pub]; ok && (m.Stream == "" || m.Stream == stream) {
		return found{names: old, exists: true, meta: m}, nil
	}
	return found{names: cur}, nil
}

// claim makes a stream's legacy publication its own, on the shard's
// primary: a record without a stream gets this one's exact ID, so that no
// other stream whose ID folds to the same legacy name takes it (or its
// slots) from then on. The first use of a legacy stream by this version
// claims it (EnsureStream, a reader's start, DeleteStream), unless one of
// its slots is held by a session of another stream (a worker of the
// version before, reading it: see heldByAnother). ok is false when the
// publication is another stream's (f is then its tagged names) or gone.
func (s *Source) claim(ctx context.Context, sh *shard, f found) (found, bool, error) {
	stream := f.names.stream
	if !f.names.legacy || f.meta.Stream == stream {
		return f, true, nil
	}
	if other := s.heldByAnother(ctx, sh, f.names); other != "" {
		return found{names: tagged(stream)}, false, nil
	}
	prim := s.primary(sh)
	pool, err := prim.poolOf()
	if err != nil {
		return f, false, err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('tabletflow'), hashtext($1))`, f.names.pub); err != nil {
			return err
		}
		m, err := readRecord(ctx, tx, f.names.pub)
		if errors.Is(err, pgx.ErrNoRows) {
			f.exists = false
			return nil
		}
		if err != nil {
			return err
		}
		if m.Stream == "" {
			m.Stream = stream
			if err := m.record(ctx, tx, f.names.pub); err != nil {
				return err
			}
		}
		f.meta = m
		return nil
	})
	if err != nil {
		return f, false, fmt.Errorf("record stream %s on its publication %s on %s: %w", stream, f.names.pub, prim.cfg.Alias, err)
	}
	if !f.exists || f.meta.Stream != stream {
		return found{names: tagged(stream)}, false, nil
	}
	return f, true, nil
}

// heldByAnother names the stream whose session (a reader of the version
// before tags: application_name oldAppName, tabletflow/<stream>/<shard>) holds one of
// the legacy slots on a replica of the shard that answers, if that stream
// is not n's; "" when none is, or the name cannot tell (cut at 63 bytes,
// or not ASCII: the server rewrites those).
func (s *Source) heldByAnother(ctx context.Context, sh *shard, n names) string {
	slot := n.slot(sh.id)
	for _, r := range sh.replicas {
		pool, err := r.poolOf()
		if err != nil {
			continue
		}
		hctx, cancel := context.WithTimeout(ctx, healthTimeout)
		var app string
		err = pool.QueryRow(hctx, `SELECT COALESCE(a.application_name, '') FROM pg_replication_slots s
			JOIN pg_stat_replication a ON a.pid = s.active_pid WHERE s.slot_name = $1`, slot).Scan(&app)
		cancel()
		if err != nil || len(app) >= 63 || !strings.HasPrefix(app, "tabletflow/") || !strings.HasSuffix(app, "/"+sh.id) {
			continue
		}
		other := strings.TrimSuffix(strings.TrimPrefix(app, "tabletflow/"), "/"+sh.id)
		printable := !strings.ContainsFunc(other, func(c rune) bool { return c < ' ' || c > '~' || c == '?' || c == '\\' })
		if printable && other != n.stream && legacyPublicationName(other) == n.pub {
			return other
		}
	}
	return ""
}

// streamMeta is what a stream keeps on each shard's primary, as the
// publication's comment: where the stream starts the shard and on which
// timeline it was created, the timeline of all its checkpoints (a reader
// checks its server's against it).
type streamMeta struct {
	Start    pglogrepl.LSN `json:"start"`
	Timeline int32         `json:"timeline"`
	Created  time.Time     `json:"created"`
	// Snapshot: the stream copies the tables' rows first (startFrom
	// "snapshot").
	Snapshot bool `json:"snapshot,omitempty"`
	// Stream: the stream's exact ID, recorded by this version (a legacy
	// publication gets it when claimed); empty in a record of a version
	// before.
	Stream string `json:"stream,omitempty"`
	// Resync: the id of the shard's last resync (Source.Resync), whose
	// copy is framed by markers; ResyncAt, the checkpoint it returned.
	Resync   string        `json:"resync,omitempty"`
	ResyncAt pglogrepl.LSN `json:"resyncAt,omitempty"`
	// Adhoc: the shard's last ad-hoc snapshot job (Source.Snapshot).
	Adhoc *adhocJob `json:"adhoc,omitempty"`
	// Tables the stream reads, as its publication publishes them: set at
	// its creation and by SetTables; empty in a record of a version
	// before (the config's are read then).
	Tables []string `json:"tables,omitempty"`
	// TablesAt is when the change that set Tables was asked for
	// (SetTables): an older change arriving late changes nothing.
	TablesAt time.Time `json:"tablesAt,omitzero"`
}

// EnsureStream creates, on every shard, the stream's publication on the
// primary and its slot on every reachable replica, and returns where each
// shard starts: the latest of its slots' starting points, so that every
// replica can serve it. A second call returns the same starts (they are
// kept as the publication's comment). A standby that cannot be reached is
// skipped (its reader creates the slot later; it serves once the shard's
// checkpoint passes the new slot's start).
func (s *Source) EnsureStream(ctx context.Context, spec source.StreamSpec) (source.Stream, error) {
	if len(spec.Tables) == 0 {
		return source.Stream{}, fmt.Errorf("stream %s: a postgres stream publishes the tables it names (source.tables)", spec.ID)
	}
	st := source.Stream{ID: spec.ID, Tables: spec.Tables, StartFrom: spec.StartFrom, Start: map[string]source.Checkpoint{}}
	for _, sh := range s.shards {
		meta, err := s.ensureShard(ctx, spec, sh)
		if err != nil {
			return source.Stream{}, fmt.Errorf("shard %s: %w", sh.id, err)
		}
		st.Start[sh.id] = source.Checkpoint{Term: uint64(meta.Start)}
		if st.Created.IsZero() || meta.Created.Before(st.Created) {
			st.Created = meta.Created
		}
	}
	return st, nil
}

func (s *Source) ensureShard(ctx context.Context, spec source.StreamSpec, sh *shard) (streamMeta, error) {
	stream := spec.ID
	prim := s.primary(sh)
	pool, err := prim.poolOf()
	if err != nil {
		return streamMeta{}, err
	}
	f, err := prim.find(ctx, stream)
	if err != nil {
		return streamMeta{}, err
	}
	// A stream made before tags (stopped, or being made when its worker
	// was upgraded) goes on with its names, and claims them.
	if f, _, err = s.claim(ctx, sh, f); err != nil {
		return streamMeta{}, err
	}
	n := f.names
	if !f.exists {
		// TRUNCATE is published too: the reader delivers it as a record
		// (op "truncate"), never ignored.
		_, err = pool.Exec(ctx, fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = '%s')`,
			pgx.Identifier{n.pub}.Sanitize(), tableIdents(spec.Tables), publishedOps))
		if err != nil && !isCode(err, "42710") { // duplicate_object: a concurrent ensure
			return streamMeta{}, fmt.Errorf("create publication on %s: %w", prim.cfg.Alias, err)
		}
	}
	if f.meta.Start != 0 {
		if t := f.meta.Tables; len(t) > 0 && !slices.Equal(slices.Sorted(slices.Values(t)), slices.Sorted(slices.Values(spec.Tables))) {
			// Changed by configure since the config was written: the
			// operator's file is out of date (the stream would read tables
			// it does not name, or miss ones it names).
			return streamMeta{}, fmt.Errorf("%w: source.tables %v, but stream %s exists on %s reading %v (changed by configure); start it with those, or drop its source-side stream first",
				errTables, spec.Tables, stream, prim.cfg.Alias, t)
		}
		return f.meta, nil // slots lost since are re-made by their readers
	}
	var start pglogrepl.LSN
	for _, r := range sh.replicas {
		lsn, err := s.ensureSlot(ctx, n.slot(sh.id), sh, r)
		if err != nil {
			if r == prim {
				return streamMeta{}, err
			}
			continue // an unreachable standby: its reader makes the slot later
		}
		start = max(start, lsn)
	}
	tli, err := prim.timeline(ctx)
	if err != nil {
		return streamMeta{}, fmt.Errorf("read timeline on %s: %w", prim.cfg.Alias, err)
	}
	m := streamMeta{Start: start, Timeline: tli, Created: time.Now().UTC().Truncate(time.Second),
		Snapshot: spec.StartFrom == source.StartSnapshot, Stream: stream, Tables: slices.Clone(spec.Tables)}
	if m.Snapshot {
		if err := ensureProgressTable(ctx, prim); err != nil {
			return streamMeta{}, err
		}
	}
	if snapshotHook != nil {
		snapshotHook("meta")
	}
	if err := m.record(ctx, pool, n.pub); err != nil {
		return streamMeta{}, fmt.Errorf("record the stream's start on %s: %w", prim.cfg.Alias, err)
	}
	return m, nil
}

// execer runs a statement: a pool, or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// record writes m as the stream's record on a shard's primary: the
// comment of its publication pub.
func (m streamMeta) record(ctx context.Context, q execer, pub string) error {
	b, _ := json.Marshal(m)
	_, err := q.Exec(ctx, fmt.Sprintf(`COMMENT ON PUBLICATION %s IS %s`, pgx.Identifier{pub}.Sanitize(), quoteLiteral(string(b))))
	return err
}

// rewrite changes the stream's record on a shard's primary, in tx: it
// reads the record afresh under the lock claim takes, and writes it again
// if change says it changed it, so that writers of different fields (a
// resync's, an ad-hoc job's) keep each other's.
func rewrite(ctx context.Context, tx pgx.Tx, pub string, change func(m *streamMeta) (bool, error)) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('tabletflow'), hashtext($1))`, pub); err != nil {
		return err
	}
	m, err := readRecord(ctx, tx, pub)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: publication %s is gone", errPublication, pub)
	}
	if err != nil {
		return err
	}
	changed, err := change(&m)
	if err != nil || !changed {
		return err
	}
	return m.record(ctx, tx, pub)
}

// readRecord reads the stream's record, publication pub's comment, in tx
// (pgx.ErrNoRows: no such publication; a comment that is not a record
// reads as an empty one).
func readRecord(ctx context.Context, tx pgx.Tx, pub string) (streamMeta, error) {
	var comment *string
	var m streamMeta
	err := tx.QueryRow(ctx, `SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1`, pub).Scan(&comment)
	if err == nil && comment != nil {
		_ = json.Unmarshal([]byte(*comment), &m)
	}
	return m, err
}

// tablesOr are the tables the stream reads by the record: the ones its
// last SetTables (or, from that version, its creation) recorded, else
// configured (a record from before).
func (m streamMeta) tablesOr(configured []string) []string {
	if len(m.Tables) > 0 {
		return m.Tables
	}
	return configured
}

// slotRow is a slot's state on one replica.
type slotRow struct {
	exists      bool
	confirmed   pglogrepl.LSN
	lost        bool
	invalidated string
	activePID   *int32
}

func (r *replica) slot(ctx context.Context, name string) (slotRow, error) {
	pool, err := r.poolOf()
	if err != nil {
		return slotRow{}, err
	}
	version, err := r.versionOf(ctx)
	if err != nil {
		return slotRow{}, err
	}
	// Why a slot was invalidated: invalidation_reason from 17 on; 16 has
	// conflicting (rows_removed, wal_level_insufficient), and wal_status
	// 'lost' (wal_removed) on every version.
	reasonCol := "invalidation_reason"
	if version < 170000 {
		reasonCol = "CASE WHEN conflicting THEN 'conflicting' END"
	}
	var row slotRow
	var confirmed *string
	var walStatus, reason *string
	err = pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, wal_status, `+reasonCol+`, active_pid
		FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&confirmed, &walStatus, &reason, &row.activePID)
	if errors.Is(err, pgx.ErrNoRows) {
		return row, nil
	}
	if err != nil {
		return row, err
	}
	row.exists = true
	if confirmed != nil {
		if row.confirmed, err = pglogrepl.ParseLSN(*confirmed); err != nil {
			return row, err
		}
	}
	row.lost = walStatus != nil && *walStatus == "lost"
	if reason != nil {
		row.invalidated = *reason
	}
	if row.lost && row.invalidated == "" {
		row.invalidated = "wal_removed"
	}
	return row, nil
}

// versionOf returns the server's version (server_version_num: 160004 for
// 16.4), read once: its catalog's columns differ between versions.
func (r *replica) versionOf(ctx context.Context) (int, error) {
	r.mu.Lock()
	v := r.version
	r.mu.Unlock()
	if v != 0 {
		return v, nil
	}
	pool, err := r.poolOf()
	if err != nil {
		return 0, err
	}
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v); err != nil {
		return 0, fmt.Errorf("server version of %s: %w", r.cfg.Alias, err)
	}
	r.mu.Lock()
	r.version = v
	r.mu.Unlock()
	return v, nil
}

// ensureSlot creates the stream's slot on a replica if it has none, and
// returns the slot's confirmed position. On a standby, creating a slot
// waits for a running-transactions record from the primary, which is asked
// for every second meanwhile.
func (s *Source) ensureSlot(ctx context.Context, name string, sh *shard, r *replica) (pglogrepl.LSN, error) {
	row, err := r.slot(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("read slot on %s: %w", r.cfg.Alias, err)
	}
	if row.exists {
		return row.confirmed, nil
	}
	pool, err := r.poolOf()
	if err != nil {
		return 0, err
	}
	var inRecovery bool
	if err := pool.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil {
		return 0, fmt.Errorf("%s: %w", r.cfg.Alias, err)
	}
	cctx, cancel := context.WithTimeout(ctx, slotCreateTimeout)
	defer cancel()
	if inRecovery {
		prim := s.primary(sh)
		go func() {
			ppool, err := prim.poolOf()
			if err != nil {
				return
			}
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				_, _ = ppool.Exec(cctx, `SELECT pg_log_standby_snapshot()`)
				select {
				case <-cctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	var lsn string
	err = pool.QueryRow(cctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`, name).Scan(&lsn)
	if isCode(err, "42710") { // created meanwhile by another worker
		row, err := r.slot(ctx, name)
		return row.confirmed, err
	}
	if err != nil {
		return 0, fmt.Errorf("create slot %s on %s: %w", name, r.cfg.Alias, err)
	}
	return pglogrepl.ParseLSN(lsn)
}

// recreateSlot drops the stream's slot (name) on a replica (an invalidated
// one) and makes a new one.
func (s *Source) recreateSlot(ctx context.Context, name string, sh *shard, r *replica) error {
	pool, err := r.poolOf()
	if err != nil {
		return err
	}
	if err := dropSlot(ctx, pool, name); err != nil {
		return err
	}
	_, err = s.ensureSlot(ctx, name, sh, r)
	return err
}

func (s *Source) lastHeartbeat(sh *shard) time.Time {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.lastBeat
}

// heartbeat writes a non-transactional logical message on the shard's
// primary (best effort: a primary that is down has no WAL to pin).
func (s *Source) heartbeat(ctx context.Context, sh *shard) {
	sh.mu.Lock()
	sh.lastBeat = time.Now()
	sh.mu.Unlock()
	pool, err := s.primary(sh).poolOf()
	if err != nil {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, _ = pool.Exec(hctx, `SELECT pg_logical_emit_message(false, 'tabletflow.heartbeat', '')`)
}

// DeleteStream drops the stream's slots on every replica (ending a session
// of ours that still holds one), then its publications and snapshot
// progress on every primary. It drops all it can reach: a server that
// cannot be reached (or fails) does not stop the others, and the error
// then names everything left, each with its cause (a server down is
// retried, so a later call drops the rest). A stream made before tags
// keeps its publication until every slot of the shard is dropped: its
// record is what tells a later call that the legacy names are this
// stream's.
func (s *Source) DeleteStream(ctx context.Context, stream string) error {
	var mu sync.Mutex
	var left []error
	each := func(rs []*replica, drop func(context.Context, *replica) error) {
		var wg sync.WaitGroup
		for _, r := range rs {
			wg.Go(func() {
				dctx, cancel := context.WithTimeout(ctx, dropTimeout)
				defer cancel()
				if err := drop(dctx, r); err != nil {
					mu.Lock()
					left = append(left, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	var all, primaries []*replica
	for _, sh := range s.shards {
		all = append(all, sh.replicas...)
		primaries = append(primaries, s.primary(sh))
	}
	byShard := map[string]names{}
	slotsLeft := map[string]bool{}
	each(primaries, func(ctx context.Context, prim *replica) error {
		n, err := s.namesToDrop(ctx, s.shardByID(prim.shard), stream)
		mu.Lock()
		byShard[prim.shard] = n
		mu.Unlock()
		return err
	})
	each(all, func(ctx context.Context, r *replica) error {
		name := byShard[r.shard].slot(r.shard)
		if err := r.dropStreamSlot(ctx, name); err != nil {
			mu.Lock()
			slotsLeft[r.shard] = true
			mu.Unlock()
			return fmt.Errorf("slot %s on %s: %w", name, r.cfg.Alias, err)
		}
		return nil
	})
	each(primaries, func(ctx context.Context, r *replica) error {
		n := byShard[r.shard]
		if n.legacy && slotsLeft[r.shard] {
			return fmt.Errorf("publication %s on %s: kept until the shard's slots are dropped (its record tells that those slots of a stream made before tags are this one's)", n.pub, r.cfg.Alias)
		}
		if err := r.dropPublication(ctx, n, stream); err != nil {
			return fmt.Errorf("publication %s and snapshot progress of shard %s on %s: %w", n.pub, r.shard, r.cfg.Alias, err)
		}
		return nil
	})
	if len(left) == 0 {
		return nil
	}
	slices.SortFunc(left, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return &leftError{stream: stream, left: left}
}

// namesToDrop are the names whose objects DeleteStream drops on a shard:
// those its primary finds (or, when it does not answer, a standby that
// does). Legacy names are dropped only once the stream has claimed them:
// when the primary is down and their record names no stream, the tagged
// names are dropped, and the error says the legacy ones are left.
func (s *Source) namesToDrop(ctx context.Context, sh *shard, stream string) (names, error) {
	for _, r := range append([]*replica{s.primary(sh)}, sh.replicas...) {
		f, err := r.find(ctx, stream)
		if err != nil {
			continue
		}
		if !f.names.legacy || f.meta.Stream == stream {
			return f.names, nil
		}
		f, ours, err := s.claim(ctx, sh, f)
		if err != nil {
			return tagged(stream), fmt.Errorf("slots and publication %s of a stream made before tags, on shard %s: whose they are is recorded on the primary: %w", f.names.pub, sh.id, err)
		}
		if ours {
			return f.names, nil
		}
		return tagged(stream), nil
	}
	return tagged(stream), nil
}

func (s *Source) shardByID(id string) *shard {
	sh, _ := s.shardOf(id)
	return sh
}

// dropTimeout bounds dropping a stream's objects on one server, so that one
// that hangs does not hold up reporting the rest.
const dropTimeout = 20 * time.Second

// leftError: DeleteStream dropped what it could reach; these are left.
// It unwraps to every cause, so Classify sees them (a server down: retry).
type leftError struct {
	stream string
	left   []error
}

func (e *leftError) Error() string {
	msgs := make([]string, len(e.left))
	for i, err := range e.left {
		msgs[i] = err.Error()
	}
	return fmt.Sprintf("delete stream %s: dropped what could be reached; left: %s", e.stream, strings.Join(msgs, "; "))
}

func (e *leftError) Unwrap() []error { return e.left }

// dropStreamSlot ends a session holding the slot and drops it, if it
// exists.
func (r *replica) dropStreamSlot(ctx context.Context, name string) error {
	pool, err := r.poolOf()
	if err != nil {
		return err
	}
	if _, err = pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE slot_name = $1 AND active_pid IS NOT NULL`, name); err != nil {
		return err
	}
	return dropSlot(ctx, pool, name)
}

// dropPublication drops the stream's publication (n) and its snapshot
// progress rows for the replica's shard on it (a primary).
func (r *replica) dropPublication(ctx context.Context, n names, stream string) error {
	pool, err := r.poolOf()
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{n.pub}.Sanitize()); err != nil {
		return err
	}
	return clearProgress(ctx, pool, stream, r.shard)
}

// clearProgress deletes a shard's snapshot progress of a stream on its
// primary, its start or resync copy's and its ad-hoc jobs' (none there,
// no snapshot ever ran: nothing to do); clearJobs, its jobs' alone. A
// job's rows are keyed by the shard column (jobKey: the shard's id, "#",
// …; shard ids have no "#"). In a transaction, the progress tables must
// exist (ensureProgressTable): a missing one aborts it.
func clearProgress(ctx context.Context, q execer, stream, shard string) error {
	return deleteProgress(ctx, q, `stream = $1 AND (shard = $2 OR starts_with(shard, $2 || '#'))`, stream, shard)
}

func clearJobs(ctx context.Context, q execer, stream, shard string) error {
	return deleteProgress(ctx, q, `stream = $1 AND starts_with(shard, $2 || '#')`, stream, shard)
}

func deleteProgress(ctx context.Context, q execer, where string, args ...any) error {
	for _, table := range []string{progressTable, deliveredTable} {
		_, err := q.Exec(ctx, `DELETE FROM `+table+` WHERE `+where, args...)
		if err != nil && !isCode(err, "42P01") && !isCode(err, "3F000") {
			return err
		}
	}
	return nil
}

// dropSlot drops a slot if it exists, waiting a little for a terminated
// session to let go of it.
func dropSlot(ctx context.Context, pool *pgxpool.Pool, name string) error {
	var err error
	for try := 0; try < 50; try++ {
		_, err = pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
		if !isCode(err, "55006") {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return err
}

// ListTablets returns the shards with each replica's health as the servers
// tell it: reachable (Healthy, Serving), in recovery or not (a configured
// primary found in recovery is reported as a replica, a standby found
// promoted as the primary), and its replay lag.
func (s *Source) ListTablets(ctx context.Context) ([]source.Tablet, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.health != nil && time.Since(s.checked) < healthTTL {
		return cloneTablets(s.health), nil
	}
	var wg sync.WaitGroup
	out := make([]source.Tablet, len(s.shards))
	for i, sh := range s.shards {
		out[i] = source.Tablet{ID: sh.id, Replicas: make([]source.Replica, len(sh.replicas))}
		for j, r := range sh.replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i].Replicas[j] = r.health(ctx)
			}()
		}
	}
	wg.Wait()
	s.health, s.checked = out, time.Now()
	return cloneTablets(out), nil
}

func cloneTablets(ts []source.Tablet) []source.Tablet {
	out := make([]source.Tablet, len(ts))
	for i, t := range ts {
		out[i] = t
		out[i].Replicas = append([]source.Replica(nil), t.Replicas...)
	}
	return out
}

func (r *replica) health(ctx context.Context) source.Replica {
	rep := source.Replica{Tablet: r.shard, Alias: r.cfg.Alias, Cell: r.cfg.Cell, Type: source.TabletType(r.cfg.Type), Address: r.host}
	pool, err := r.poolOf()
	if err != nil {
		return rep
	}
	hctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	var inRecovery bool
	var lag float64
	err = pool.QueryRow(hctx, `SELECT pg_is_in_recovery(),
		CASE WHEN NOT pg_is_in_recovery() OR pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
		     ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), 0) END`).Scan(&inRecovery, &lag)
	if err != nil {
		return rep
	}
	rep.Healthy, rep.Serving = true, true
	rep.Lag = time.Duration(max(lag, 0) * float64(time.Second))
	switch {
	case !inRecovery:
		rep.Type = source.TypePrimary
	case rep.Type == source.TypePrimary:
		rep.Type = source.TypeReplica
	}
	return rep
}

// OpenReplica returns a reader of one replica's slot. It does not connect.
func (s *Source) OpenReplica(_ context.Context, rep source.Replica) (source.ReplicaReader, error) {
	sh, err := s.shardOf(rep.Tablet)
	if err != nil {
		return nil, err
	}
	for _, r := range sh.replicas {
		if r.cfg.Alias == rep.Alias {
			return &Reader{src: s, sh: sh, rep: r}, nil
		}
	}
	return nil, fmt.Errorf("%w: %q of shard %s", source.ErrUnknownReplica, rep.Alias, rep.Tablet)
}

// replConn opens a replication connection (replication=database) to the
// replica, named so that an operator can tell whose it is, and asking the
// server to drop it after walSenderTimeout without a word from us.
func (r *replica) replConn(ctx context.Context, name string) (*pgconn.PgConn, error) {
	pc, err := pgconn.ParseConfig(r.dsn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.cfg.DSNEnv, errNoDSN)
	}
	pc.ConnectTimeout = connectTimeout
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = name
	pc.RuntimeParams["wal_sender_timeout"] = strconv.FormatInt(walSenderTimeout.Milliseconds(), 10) + "ms"
	return pgconn.ConnectConfig(ctx, pc)
}

// timeline is the replica's current timeline (IDENTIFY_SYSTEM).
func (r *replica) timeline(ctx context.Context) (int32, error) {
	conn, err := r.replConn(ctx, "tabletflow")
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	return sys.Timeline, err
}

func isCode(err error, code string) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == code
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
