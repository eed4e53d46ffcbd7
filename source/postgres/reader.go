package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/tabletflow/tabletflow/source"
)

// statusEvery: a standby status update (our committed position) goes to
// the server at least this often while reading, well within
// walSenderTimeout (a variable for tests).
var statusEvery = 5 * time.Second

const (
	// linger: once a batch has records, how long it may wait in all for
	// more that are already on their way before it is returned.
	linger = 20 * time.Millisecond
	// heartbeatEvery: while a shard's published tables are idle, a message
	// is written on its primary this often; it reaches every replica's
	// slot, so an idle shard's checkpoint (and its slots) keep advancing
	// and pin no WAL.
	heartbeatEvery = 10 * time.Second
	// freeSlotWait bounds waiting for a stale session of ours to let go of
	// the slot after it was terminated.
	freeSlotWait = 5 * time.Second
)

// advanceEvery: how often the slots of the shard's other replicas are
// advanced to the committed checkpoint, so they pin no more WAL than the
// slot being read (a variable for tests).
var advanceEvery = 10 * time.Second

// Reader reads one replica's slot of a shard. It keeps its replication
// connection between GetChanges calls that continue where the last one
// ended, and reconnects at the requested checkpoint otherwise. It is not
// safe for concurrent use; Close ends the connection.
type Reader struct {
	src *Source
	sh  *shard
	rep *replica

	stream string
	// names: the stream's publication and slots, as start found them.
	names names
	// mu serialises the connection's use, and guards conn, acked and
	// lastStatus, between the reader's caller and its keeper (keep), which
	// answers the server while no read runs; stopKeep stops the keeper.
	mu       sync.Mutex
	stopKeep func()
	conn     *pgconn.PgConn
	// pos: everything up to it was returned by GetChanges (the checkpoint
	// the next call continues from).
	pos source.Checkpoint
	// acked: the committed checkpoint's LSN, as sent to the server: only
	// ever what Ack was told (the sink committed it) or what the slot had
	// already confirmed, never where a reconnect starts (a batch handed
	// out may not be committed yet).
	acked pglogrepl.LSN
	// idle: a WAL position up to which every transaction was received, seen
	// with no transaction open (a keepalive, a heartbeat message, an empty
	// commit); an empty batch advances the checkpoint to it.
	idle pglogrepl.LSN
	// waiting: the last message received was a keepalive sent with no
	// transaction open. The walsender sends one when it reaches the end
	// of the WAL it can decode and waits for more (while records it sent
	// are unconfirmed, as they are on a live stream), and not while it
	// decodes a backlog: a batch cut short by a pause in the backlog's
	// flow is not caught up.
	waiting bool
	rels    map[uint32]*relation
	// snap is the shard's snapshot copy in progress (nil: none; or done);
	// unacked the chunks handed out and not yet marked acked (the ones in
	// batches GetChanges returned are kept across Close: see
	// keepReturned); lastCopy the report of the copy open, or of the
	// last one, kept across Close (Copy).
	snap     *snapshot
	unacked  []handedOut
	lastCopy *source.CopyProgress
	// behind: the replica, a standby, had not replayed the checkpoint the
	// reader started from; the stream's record and snapshot progress are
	// read on the primary.
	behind     bool
	open       *openTxn
	ready      []whole
	lastStatus time.Time
	advanced   time.Time
}

// openTxn is a transaction being received; whole is one received to its
// commit, its records numbered.
type openTxn struct {
	xid        uint32
	commitTime time.Time
	records    []source.Record
}

type whole struct {
	cp      source.Checkpoint
	records []source.Record
	// report: the records are a copy's chunk, reported (Copy) once they
	// are in a batch.
	report *chunkReport
}

var _ source.ReplicaReader = (*Reader)(nil)

// GetChanges returns whole transactions after req.From, up to MaxRecords
// records (one transaction larger than that comes whole), waiting up to
// MaxWait for the first. With nothing to return it may still advance the
// checkpoint to a position every transaction before which was received.
func (r *Reader) GetChanges(ctx context.Context, req source.ChangesRequest) (source.Batch, error) {
	if req.Tablet != r.sh.id {
		return source.Batch{}, fmt.Errorf("%w: reader of shard %s asked for %q", source.ErrUnknownTablet, r.sh.id, req.Tablet)
	}
	if r.conn == nil || r.stream != req.Stream || (!req.From.IsZero() && req.From != r.pos) {
		r.Close()
		if err := r.start(ctx, req.Stream, req.From); err != nil {
			return source.Batch{}, r.stated(err)
		}
	}
	if r.snap != nil && r.snap.done && r.snap.pending == nil && r.snap.kind != source.CopySnapshot {
		// The start or resync copy is complete, its end reported after
		// the batch before: the shard's ad-hoc job follows.
		if err := r.followWithJob(ctx, req.Stream); err != nil {
			r.Close()
			return source.Batch{}, err
		}
	}
	// One context for the wait for the first record, one for the linger
	// after it (not one per message: this loop runs for every row).
	pollCtx, cancelPoll := context.WithTimeout(ctx, req.MaxWait)
	defer cancelPoll()
	var lingerCtx context.Context
	b := source.Batch{Checkpoint: r.pos}
	n := 0
	for {
		for len(r.ready) > 0 && (n == 0 || n+len(r.ready[0].records) <= req.MaxRecords) {
			t := r.ready[0]
			r.ready = r.ready[1:]
			b.Records = append(b.Records, t.records...)
			b.Checkpoint = t.cp
			n += len(t.records)
			t.report.apply()
		}
		if n >= req.MaxRecords || len(r.ready) > 0 {
			break
		}
		rctx := pollCtx
		if n > 0 {
			if lingerCtx == nil {
				var cancel context.CancelFunc
				lingerCtx, cancel = context.WithTimeout(pollCtx, linger)
				defer cancel()
			}
			rctx = lingerCtx
		}
		if rctx.Err() != nil {
			break
		}
		if r.snap != nil && !r.snap.done && r.snap.pending == nil {
			if err := r.nextChunk(ctx, req.Stream, req.MaxRecords); err != nil {
				r.Close()
				return source.Batch{}, err
			}
		}
		got, err := r.receive(ctx, rctx)
		if err != nil {
			r.Close()
			return source.Batch{}, r.stated(err)
		}
		if !got && n > 0 {
			break
		}
	}
	if n == 0 && r.open == nil && uint64(r.idle) > b.Checkpoint.Term {
		b.Checkpoint = source.Checkpoint{Term: uint64(r.idle)}
	}
	if n == 0 && time.Since(r.src.lastHeartbeat(r.sh)) > heartbeatEvery {
		r.src.heartbeat(ctx, r.sh)
	}
	// Caught up: nothing for the whole MaxWait, or records and then the
	// walsender waiting for WAL. Nothing for the 20 ms linger alone is not
	// enough: a walsender decoding a backlog on a busy host pauses that
	// long, and a tablet reported caught up waits for its group commit's
	// linger (750 ms by default) before it reads again.
	b.CaughtUp = len(r.ready) == 0 && n < req.MaxRecords && (n == 0 || r.waiting)
	if n > 0 && r.snap != nil && r.snap.unsaved {
		if err := r.saveDelivered(ctx, req.Stream); err != nil {
			r.Close()
			return source.Batch{}, err
		}
	}
	r.pos = b.Checkpoint
	r.mu.Lock()
	var err error
	if time.Since(r.lastStatus) > statusEvery {
		err = r.sendStatus()
	}
	r.mu.Unlock()
	if err != nil {
		r.Close()
		return source.Batch{}, err
	}
	return b, nil
}

// Ack reports the committed checkpoint to the server (write = flush =
// apply, so the slot frees WAL up to it and no further), and now and then
// advances the shard's other slots to it.
func (r *Reader) Ack(ctx context.Context, stream, tablet string, cp source.Checkpoint) error {
	lsn := pglogrepl.LSN(cp.Term)
	if len(r.unacked) > 0 {
		r.ackChunks(ctx, stream, cp)
	}
	r.mu.Lock()
	if lsn <= r.acked {
		r.mu.Unlock()
		return nil
	}
	r.acked = lsn
	var err error
	if r.conn != nil && r.stream == stream {
		err = r.sendStatus()
	}
	r.mu.Unlock()
	if err != nil {
		r.Close()
		return err
	}
	if time.Since(r.advanced) > advanceEvery {
		r.advanced = time.Now()
		r.advanceOthers(ctx, stream, lsn)
	}
	return nil
}

// Close ends the replication connection. What Copy reports stays.
func (r *Reader) Close() error {
	if r.stopKeep != nil {
		r.stopKeep()
		r.stopKeep = nil
	}
	r.mu.Lock()
	if r.conn != nil {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = r.conn.Close(cctx)
		cancel()
		r.conn = nil
	}
	r.mu.Unlock()
	r.open, r.ready, r.rels, r.snap = nil, nil, nil, nil
	r.keepReturned(r.pos)
	r.waiting = false
	return nil
}

// keepReturned keeps of the chunks handed out the ones at or before cp:
// the checkpoint of the last batch GetChanges returned (Close), or the
// one the caller asks to read from (start). A chunk after cp was never
// returned, or the caller reads it again from an earlier checkpoint: it
// is copied again, at a new watermark, and must not be marked by an Ack
// that reaches its old place (its rows may not be committed then). One
// at or before cp is marked by an Ack at or past its last position, and
// Acks carry checkpoints the sink committed. A read that fails because
// the run is ending (its context cancelled) closes the reader before the
// run's last Ack: without the chunks kept, that Ack would mark nothing,
// and the next reader would copy them again, in the worst case a whole
// ad-hoc job the stream holds already.
func (r *Reader) keepReturned(cp source.Checkpoint) {
	r.unacked = slices.DeleteFunc(r.unacked, func(h handedOut) bool { return h.last.Compare(cp) > 0 })
}

// start checks that the stream's publication publishes what it reads and
// that the replica can serve from (its timeline, then its slot), and
// starts replication at it.
func (r *Reader) start(ctx context.Context, stream string, from source.Checkpoint) error {
	r.behind = false
	if prim := r.src.primary(r.sh); r.rep != prim && !from.IsZero() {
		// A standby that has not replayed the checkpoint may not have
		// replayed the stream's record as it was then either (a
		// resync's: see resync.go): the primary's is asked for.
		pool, err := r.rep.poolOf()
		if err != nil {
			return err
		}
		var replayed bool
		if err := pool.QueryRow(ctx, `SELECT COALESCE(pg_last_wal_replay_lsn() >= $1::pg_lsn, true)`, pglogrepl.LSN(from.Term).String()).Scan(&replayed); err != nil {
			return fmt.Errorf("replay position of %s: %w", r.rep.cfg.Alias, err)
		}
		r.behind = !replayed
	}
	f, err := r.find(ctx, stream)
	if err != nil {
		return err
	}
	n, meta := f.names, f.meta
	r.names = n
	if err := r.checkPublication(ctx, n); err != nil {
		return err
	}
	conn, err := r.rep.replConn(ctx, n.slot(r.sh.id))
	if err != nil {
		return err
	}
	from, confirmed, err := r.servable(ctx, conn, n, from, meta.Timeline)
	if err == nil {
		err = pglogrepl.StartReplication(ctx, conn, n.slot(r.sh.id), pglogrepl.LSN(from.Term), pglogrepl.StartReplicationOptions{
			Mode: pglogrepl.LogicalReplication,
			PluginArgs: []string{"proto_version '1'", "publication_names " + quoteLiteral(n.pub),
				"messages 'true'"},
		})
	}
	if err != nil {
		_ = conn.Close(context.Background())
		return err
	}
	if r.stream != stream {
		r.acked, r.unacked = 0, nil // another stream's
	}
	r.keepReturned(from)
	r.conn, r.stream, r.pos = conn, stream, from
	// Not from: after a failed Ack the reader reconnects where it goes
	// on reading, past batches the sink has not committed.
	r.acked = max(r.acked, confirmed)
	r.idle = 0
	r.rels = map[uint32]*relation{}
	if r.snap, err = r.openSnapshot(ctx, stream, meta); err != nil {
		r.Close()
		return err
	}
	if r.snap != nil && r.snap.resync && from == (source.Checkpoint{Term: uint64(meta.ResyncAt)}) {
		// The resync's start: its begin marker comes first, at (E, 1).
		// No change has that position: a transaction whose commit
		// record begins before E is not sent from E (so none that ends
		// at E is), and every other one ends after E.
		begin := source.Record{Tablet: r.sh.id, Op: source.ResyncBegin, CommitTime: time.Now().UTC(), Position: source.Checkpoint{Term: from.Term, Index: 1}}
		r.ready = append(r.ready, whole{cp: begin.Position, records: []source.Record{begin}})
	}
	r.startKeeper(conn)
	return nil
}

// startKeeper starts keep on conn until Close.
func (r *Reader) startKeeper(conn *pgconn.PgConn) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go r.keep(ctx, conn, walSenderTimeout/4, done)
	r.stopKeep = func() {
		cancel()
		<-done
	}
}

// keep tells the server our committed position at least every interval
// while no read is receiving (a read answers the server itself): between
// reads, while the sink commits or a snapshot chunk waits, the walsender,
// which hangs up after wal_sender_timeout without a word from us, keeps
// the session (and the replica is not charged for a hang-up). What the
// server sends meanwhile waits in the socket; a walsender whose output is
// blocked still reads our replies. A failed send shows at the next read.
func (r *Reader) keep(ctx context.Context, conn *pgconn.PgConn, interval time.Duration, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		if r.conn == conn && time.Since(r.lastStatus) >= interval {
			_ = r.sendStatus()
		}
		r.mu.Unlock()
	}
}

// find finds the stream's names and record as the replica has them (the
// catalog is replicated), or as the primary does when the replica has not
// replayed the record yet (the primary writes it last, after every slot),
// or has legacy names this stream has not claimed (the primary may have
// the stream's tagged publication, or another stream's claim, that the
// replica has not replayed yet). A stream made before tags is claimed
// (best effort: a primary that is down leaves it for a later start).
func (r *Reader) find(ctx context.Context, stream string) (found, error) {
	f, err := r.rep.find(ctx, stream)
	if err != nil {
		return f, err
	}
	if prim := r.src.primary(r.sh); r.rep != prim && (r.behind || !f.exists || f.meta.Start == 0 || f.names.legacy && f.meta.Stream != stream) {
		pf, err := prim.find(ctx, stream)
		switch {
		case err == nil:
			f = pf
		case !f.exists || f.meta.Start == 0:
			return f, err
		}
	}
	if f.names.legacy && f.meta.Stream != stream {
		// Another stream's, it gives this one's tagged names (not
		// there); a primary that cannot be asked leaves the claim to a
		// later start.
		if cf, _, err := r.src.claim(ctx, r.sh, f); err == nil {
			f = cf
		}
	}
	return f, nil
}

// servable returns where to start the replica's slot for from (from
// itself, or the slot's position for a zero from) and the slot's confirmed
// position, or why the replica
// cannot serve it: its server is on another timeline than the stream's
// checkpoints (tli, the stream's; 0: not recorded, not checked), or its
// slot is missing, invalidated or past from. conn is the replica's
// replication connection, on which IDENTIFY_SYSTEM tells the server's
// timeline (on a standby, the one it replays).
func (r *Reader) servable(ctx context.Context, conn *pgconn.PgConn, n names, from source.Checkpoint, tli int32) (source.Checkpoint, pglogrepl.LSN, error) {
	stream, name := n.stream, n.slot(r.sh.id)
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return from, 0, fmt.Errorf("identify system on %s: %w", r.rep.cfg.Alias, err)
	}
	if tli != 0 && sys.Timeline != tli {
		return from, 0, r.src.unservable(ctx, name, r.sh, from, tli, &timelineError{alias: r.rep.cfg.Alias, server: sys.Timeline, stream: tli})
	}
	row, err := r.rep.slot(ctx, name)
	if err != nil {
		return from, 0, err
	}
	switch {
	case !row.exists:
		// Re-create it now: it serves once the checkpoint passes its start.
		if _, err := r.src.ensureSlot(ctx, name, r.sh, r.rep); err != nil {
			return from, 0, r.src.unservable(ctx, name, r.sh, from, tli, fmt.Errorf("%w (%s; re-creating it failed: %v)", errSlotMissing, r.rep.cfg.Alias, err))
		}
		return from, 0, r.src.unservable(ctx, name, r.sh, from, tli, fmt.Errorf("%w (%s; re-created, usable once the checkpoint passes its start)", errSlotMissing, r.rep.cfg.Alias))
	case row.invalidated != "":
		// An invalidated slot never serves again: make a new one, which
		// serves once the checkpoint passes its start.
		cause := fmt.Errorf("%w (%s: %s)", errSlotInvalidated, r.rep.cfg.Alias, row.invalidated)
		if err := r.src.recreateSlot(ctx, name, r.sh, r.rep); err != nil {
			cause = fmt.Errorf("%w; re-creating it failed: %v", cause, err)
		}
		return from, 0, r.src.unservable(ctx, name, r.sh, from, tli, cause)
	case !from.IsZero() && uint64(row.confirmed) > from.Term:
		return from, 0, r.src.unservable(ctx, name, r.sh, from, tli, fmt.Errorf("%w (%s: slot at %s, checkpoint at %s)",
			errSlotAhead, r.rep.cfg.Alias, row.confirmed, pglogrepl.LSN(from.Term)))
	case row.activePID != nil:
		if err := r.freeSlot(ctx, name, stream); err != nil {
			return from, 0, err
		}
	}
	if from.IsZero() {
		from = source.Checkpoint{Term: uint64(row.confirmed)}
	}
	return from, row.confirmed, nil
}

// A reader's replication session is named (application_name) by the slot
// it reads: unique per stream and shard, ASCII and at most 63 bytes, so
// the server keeps it as it is (it cuts a longer name and rewrites
// characters that are not ASCII), and a later reader finds a stale session
// of ours by it. A worker of a version before named it
// oldAppName(stream, shard).
func oldAppName(stream, shard string) string { return "tabletflow/" + stream + "/" + shard }

// freeSlot ends a session of ours that still holds the slot (a worker that
// died without closing it) and waits for the slot to be free. A slot held
// by anything else is left alone: 55006 from START_REPLICATION then says so.
func (r *Reader) freeSlot(ctx context.Context, name, stream string) error {
	pool, err := r.rep.poolOf()
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(s.active_pid) FROM pg_replication_slots s
		JOIN pg_stat_replication a ON a.pid = s.active_pid
		WHERE s.slot_name = $1 AND a.application_name = ANY($2)`, name, []string{name, oldAppName(stream, r.sh.id)}); err != nil {
		return err
	}
	deadline := time.Now().Add(freeSlotWait)
	for time.Now().Before(deadline) {
		row, err := r.rep.slot(ctx, name)
		if err != nil || row.activePID == nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil // START_REPLICATION reports 55006 if it is still held
}

// unservable returns cause, or errExpired when every replica of the shard
// answered and none can serve from with the stream's slot (name): no
// slot, an invalidated one, one past the checkpoint, or a server on
// another timeline than tli, the stream's. The history the tablet needs is
// then gone. The error names the timeline.
func (s *Source) unservable(ctx context.Context, name string, sh *shard, from source.Checkpoint, tli int32, cause error) error {
	var elsewhere []string // replicas whose slot could serve, on another timeline
	for _, r := range sh.replicas {
		row, err := r.slot(ctx, name)
		if err != nil {
			return cause // cannot tell: maybe that one can
		}
		if !row.exists || row.invalidated != "" || !from.IsZero() && uint64(row.confirmed) > from.Term {
			continue
		}
		if tli == 0 {
			return cause
		}
		on, err := r.timeline(ctx)
		if err != nil || on == tli {
			return cause
		}
		elsewhere = append(elsewhere, fmt.Sprintf("%s on timeline %d", r.cfg.Alias, on))
	}
	at := pglogrepl.LSN(from.Term).String()
	if tli != 0 {
		at += fmt.Sprintf(" on timeline %d", tli)
	}
	if len(elsewhere) > 0 {
		at += " (the slots of " + strings.Join(elsewhere, ", ") + ")"
	}
	return fmt.Errorf("%w at %s: %w", errExpired, at, cause)
}

// receive handles one message from the server, waiting for it until
// rctx ends (a poll's or a linger's deadline, under ctx). got is false when
// none came.
func (r *Reader) receive(ctx, rctx context.Context) (got bool, err error) {
	r.mu.Lock()
	msg, err := r.conn.ReceiveMessage(rctx)
	r.mu.Unlock()
	if err != nil {
		if pgconn.Timeout(err) && ctx.Err() == nil {
			return false, nil
		}
		return false, err
	}
	switch m := msg.(type) {
	case *pgproto3.ErrorResponse:
		return false, pgconn.ErrorResponseToPgError(m)
	case *pgproto3.CopyData:
		if len(m.Data) == 0 {
			return true, nil
		}
		switch m.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
			if err != nil {
				return false, err
			}
			if r.open == nil {
				r.idle = max(r.idle, k.ServerWALEnd)
			}
			r.waiting = r.open == nil
			if k.ReplyRequested {
				r.mu.Lock()
				defer r.mu.Unlock()
				return true, r.sendStatus()
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(m.Data[1:])
			if err != nil {
				return false, err
			}
			r.waiting = false
			return true, r.decode(x.WALData)
		}
	}
	return true, nil
}

// decode applies one pgoutput message.
func (r *Reader) decode(data []byte) error {
	if err := checkMessage(data); err != nil {
		return fmt.Errorf("decode pgoutput message: %w", err)
	}
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("decode pgoutput message: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		r.rels[m.RelationID] = newRelation(m) // a new description: the table may have changed
	case *pglogrepl.BeginMessage:
		r.open = &openTxn{xid: m.Xid, commitTime: m.CommitTime}
	case *pglogrepl.InsertMessage:
		return r.add(m.RelationID, source.Insert, 0, nil, m.Tuple)
	case *pglogrepl.UpdateMessage:
		return r.add(m.RelationID, source.Update, m.OldTupleType, m.OldTuple, m.NewTuple)
	case *pglogrepl.DeleteMessage:
		return r.add(m.RelationID, source.Delete, m.OldTupleType, m.OldTuple, nil)
	case *pglogrepl.TruncateMessage: // a record per table (CASCADE's too)
		for _, rel := range m.RelationIDs {
			if err := r.add(rel, source.Truncate, 0, nil, nil); err != nil {
				return err
			}
		}
	case *pglogrepl.CommitMessage:
		if r.open == nil {
			return fmt.Errorf("pgoutput: commit at %s without begin", m.TransactionEndLSN)
		}
		end := m.TransactionEndLSN
		recs := r.open.records
		if r.snap != nil {
			r.snap.committed(r.open.xid)
		}
		r.open = nil
		if len(recs) == 0 {
			r.idle = max(r.idle, end)
			return nil
		}
		for i := range recs {
			recs[i].Position = source.Checkpoint{Term: uint64(end), Index: uint64(i + 1)}
			recs[i].CommitTime = m.CommitTime
		}
		r.ready = append(r.ready, whole{cp: recs[len(recs)-1].Position, records: recs})
	case *pglogrepl.LogicalDecodingMessage:
		if m.Prefix == snapshotPrefix && r.snap != nil && r.snap.pending != nil && m.LSN == r.snap.pending.lsn {
			r.delivered(r.snap.pending)
			return nil
		}
		// A heartbeat (or any message) outside a transaction: everything
		// that committed before it was sent before it.
		if !m.Transactional && r.open == nil {
			r.idle = max(r.idle, m.LSN)
		}
	}
	return nil
}

func (r *Reader) add(rel uint32, op source.Op, oldType uint8, old, new *pglogrepl.TupleData) error {
	if r.open == nil {
		return fmt.Errorf("pgoutput: %s outside a transaction", op)
	}
	rm, ok := r.rels[rel]
	if !ok {
		return fmt.Errorf("pgoutput: %s on relation %d before its description", op, rel)
	}
	var err error
	if rm.key == nil {
		if rm.key, err = r.keyOf(rm.RelationMessage); err != nil {
			return err
		}
		if rm.types, err = r.typesOf(rm.RelationMessage); err != nil {
			return err
		}
	}
	rec, err := record(rm, op, oldType, old, new)
	if err != nil {
		return err
	}
	rec.Tablet = r.sh.id
	r.open.records = append(r.open.records, rec)
	return nil
}

// keyOf marks a relation's key columns, read from the replica's catalog
// (once per relation description): under REPLICA IDENTITY USING INDEX
// that index's (the columns PostgreSQL sends on a delete, whatever the
// primary key), otherwise the primary key's; a table without either is
// keyed by its replica identity's flagged columns, and has no key under
// REPLICA IDENTITY FULL.
func (r *Reader) keyOf(rel *pglogrepl.RelationMessage) ([]bool, error) {
	pool, err := r.rep.poolOf()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT a.attname FROM pg_index i
		JOIN pg_class c ON c.oid = i.indrelid
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
		WHERE i.indrelid = $1 AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END`, rel.RelationID)
	if err != nil {
		return nil, fmt.Errorf("primary key of %s.%s: %w", rel.Namespace, rel.RelationName, err)
	}
	pk := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		pk[name] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("primary key of %s.%s: %w", rel.Namespace, rel.RelationName, err)
	}
	key := make([]bool, len(rel.Columns))
	for i, c := range rel.Columns {
		// Under REPLICA IDENTITY FULL every column is flagged: a table
		// without a primary key then has no key ({}), its rows told apart
		// by their values only.
		key[i] = pk[c.Name] || len(pk) == 0 && c.Flags&1 == 1 && rel.ReplicaIdentity != 'f'
	}
	return key, nil
}

// typesOf names a relation's column types as format_type does, from the
// type OIDs and modifiers of its description (once per description: a
// column's type changed by an ALTER comes with a new one).
func (r *Reader) typesOf(rel *pglogrepl.RelationMessage) (map[string]string, error) {
	pool, err := r.rep.poolOf()
	if err != nil {
		return nil, err
	}
	oids := make([]uint32, len(rel.Columns))
	mods := make([]int32, len(rel.Columns))
	for i, c := range rel.Columns {
		oids[i], mods[i] = c.DataType, c.TypeModifier
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var names []string
	err = pool.QueryRow(ctx, `SELECT array_agg(format_type(t.oid, t.mod) ORDER BY t.n)
		FROM unnest($1::oid[], $2::int4[]) WITH ORDINALITY AS t(oid, mod, n)`, oids, mods).Scan(&names)
	if err != nil {
		return nil, fmt.Errorf("column types of %s.%s: %w", rel.Namespace, rel.RelationName, err)
	}
	if len(names) != len(rel.Columns) {
		return nil, fmt.Errorf("column types of %s.%s: %d types for %d columns", rel.Namespace, rel.RelationName, len(names), len(rel.Columns))
	}
	types := make(map[string]string, len(names))
	for i, c := range rel.Columns {
		types[c.Name] = names[i]
	}
	return types, nil
}

var _ source.SlotReporter = (*Reader)(nil)

// SlotStats reads the replica's slot: its lag behind the replica's WAL (on
// a standby, the WAL it received or replayed) and safe_wal_size.
func (r *Reader) SlotStats(ctx context.Context, stream string) (source.SlotStats, error) {
	pool, err := r.rep.poolOf()
	if err != nil {
		return source.SlotStats{}, err
	}
	n := r.names
	if n.stream != stream || n.pub == "" {
		f, err := r.find(ctx, stream)
		if err != nil {
			return source.SlotStats{}, err
		}
		n = f.names
	}
	var st source.SlotStats
	err = pool.QueryRow(ctx, `SELECT COALESCE((CASE WHEN pg_is_in_recovery()
			THEN GREATEST(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()) ELSE pg_current_wal_lsn() END
			- confirmed_flush_lsn)::bigint, 0), COALESCE(safe_wal_size, -1)
		FROM pg_replication_slots WHERE slot_name = $1`, n.slot(r.sh.id)).Scan(&st.LagBytes, &st.SafeWALBytes)
	if err != nil {
		return st, fmt.Errorf("slot of %s on %s: %w", stream, r.rep.cfg.Alias, err)
	}
	st.LagBytes = max(st.LagBytes, 0)
	return st, nil
}

// sendStatus tells the server our committed position; r.mu is held.
func (r *Reader) sendStatus() error {
	r.lastStatus = time.Now()
	return pglogrepl.SendStandbyStatusUpdate(context.Background(), r.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: r.acked, WALFlushPosition: r.acked, WALApplyPosition: r.acked,
	})
}

// advanceOthers moves the stream's idle slots on the shard's other replicas
// up to lsn (never back, never one in use), best effort: a slot left
// behind only pins WAL, and a reader of it checks its position anyway.
func (r *Reader) advanceOthers(ctx context.Context, stream string, lsn pglogrepl.LSN) {
	if r.names.stream != stream || r.names.pub == "" {
		return // names not known: its readers check their slots anyway
	}
	name := r.names.slot(r.sh.id)
	for _, o := range r.sh.replicas {
		if o == r.rep {
			continue
		}
		pool, err := o.poolOf()
		if err != nil {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, _ = pool.Exec(actx, `SELECT pg_replication_slot_advance(slot_name, $2::pg_lsn) FROM pg_replication_slots
			WHERE slot_name = $1 AND active_pid IS NULL AND NOT conflicting AND confirmed_flush_lsn < $2::pg_lsn`, name, lsn.String())
		cancel()
	}
}
