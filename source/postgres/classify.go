package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tabletflow/tabletflow/source"
)

// The adapter's own outcomes, decided from the slot's row in
// pg_replication_slots before reading (never from a message text).
var (
	// errSlotMissing: the replica has no slot for the stream (a standby
	// rebuilt, a slot dropped by hand). The reader re-creates it; the new
	// slot serves once the tablet's checkpoint passes its start.
	errSlotMissing = errors.New("replication slot does not exist on this replica")
	// errSlotInvalidated: the replica's slot lost the WAL or catalog rows
	// it needs (wal_status lost, an invalidation reason).
	errSlotInvalidated = errors.New("replication slot is invalidated on this replica")
	// errSlotAhead: the slot's confirmed_flush_lsn is past the checkpoint;
	// PostgreSQL would silently skip to it, so the replica cannot serve
	// this checkpoint (the analogue of Vitess's GTIDSet mismatch).
	errSlotAhead = errors.New("replication slot is ahead of the checkpoint")
	// errTimeline: the replica is on another timeline than the one the
	// stream's checkpoints are on (see timelineError).
	errTimeline = errors.New("replica is on another timeline than the stream's checkpoints")
	// errNotVisible: a snapshot chunk's select waited in vain for commits
	// the change log had delivered to become visible (one waiting for a
	// synchronous standby); not the replica's fault.
	errNotVisible = errors.New("delivered commits still invisible to the snapshot's select")
	// errExpired: no replica of the shard can serve the checkpoint.
	errExpired = errors.New("no replica of the shard can serve the checkpoint")
	// errNoDSN: a replica's DSN variable is not set in the worker.
	errNoDSN = errors.New("DSN environment variable not set")
	// errPublication: the stream's publication is missing or does not
	// publish what the stream reads (see publicationError); checked at
	// every reader start.
	errPublication = errors.New("the stream's publication does not publish what it reads")
)

// timelineError: a replica's server is on another timeline than the one
// recorded for the stream when it was made, which every checkpoint of the
// stream is on. A promoted standby, or a server following one, has WAL of
// its own past the timeline's fork, so an LSN of the stream's may mean
// other changes there (or none): it cannot serve the stream's checkpoints,
// whatever its slot says.
type timelineError struct {
	alias  string
	server int32 // the replica's timeline (IDENTIFY_SYSTEM)
	stream int32 // the stream's, as recorded on the primary
}

func (e *timelineError) Error() string {
	return fmt.Sprintf("%v: %s is on timeline %d, the stream's checkpoints are on timeline %d", errTimeline, e.alias, e.server, e.stream)
}

func (e *timelineError) Unwrap() error { return errTimeline }

// Classify maps an error from the adapter or from PostgreSQL to an action.
// It reads the adapter's typed errors and SQLSTATE codes, never a message
// text (which is in the server's lc_messages language). Where one code
// covers cases that need different actions (55000, 40001: a slot
// invalidated, or a passing state), the reader tells them apart by the
// state the server leaves, read from its catalog, and wraps the error in
// its typed cause (Reader.stated). A server not set up for decoding shows
// as a slot missing (it cannot be made) or invalidated
// (wal_level_insufficient).
//
//	slot ahead of the checkpoint                 → RetryElsewhere POSITION_MISMATCH
//	replica on another timeline than the stream's → RetryElsewhere TIMELINE_MISMATCH
//	slot missing                                 → RetryElsewhere SLOT_MISSING
//	slot invalidated (by its row; also after a
//	55000 or 40001 that left it so)              → RetryElsewhere SLOT_INVALIDATED
//	58P01 WAL segment removed                    → RetryElsewhere WAL_REMOVED
//	0A000 (decoding not possible here)           → RetryElsewhere NOT_CONFIGURED
//	53300, 53400 (connections, wal senders, slots) → RetryElsewhere NO_CAPACITY
//	no replica can serve the checkpoint          → Expired
//	delivered commits still invisible to a snapshot select → RetrySame COMMIT_NOT_VISIBLE
//	55006 slot active, 57P01-57P03, class 08, connection and
//	network errors, timeouts, other 40001/55000  → RetrySame
//	42704 (a slot or the publication gone since the reader's start
//	checked both; the next start tells which)    → RetrySame UNDEFINED_OBJECT
//	SetTables failing once it has begun to change the shards → RetrySame TABLES_PARTIAL
//	a table of a new source.tables not there, not the role's or without a
//	primary key (SetTables), or a snapshot job's table not one the stream
//	reads → Fatal BAD_TABLES
//	publication missing or not publishing what the stream reads,
//	28000, 28P01, 42501, a DSN variable not set,
//	a bad checkpoint, an unknown tablet or replica → Fatal
func Classify(err error) source.Classification {
	c := func(a source.Action, reason string) source.Classification {
		return source.Classification{Action: a, Reason: reason}
	}
	switch {
	case err == nil:
		return source.Classification{}
	case errors.Is(err, errExpired): // wraps the replica's own cause
		return c(source.Expired, "HISTORY_GONE")
	case errors.Is(err, errSlotAhead):
		return c(source.RetryElsewhere, "POSITION_MISMATCH")
	case errors.Is(err, errTimeline):
		return c(source.RetryElsewhere, "TIMELINE_MISMATCH")
	case errors.Is(err, errSlotMissing):
		return c(source.RetryElsewhere, "SLOT_MISSING")
	case errors.Is(err, errSlotInvalidated):
		return c(source.RetryElsewhere, "SLOT_INVALIDATED")
	case errors.Is(err, errNotVisible):
		return c(source.RetrySame, "COMMIT_NOT_VISIBLE")
	case errors.Is(err, errPublication):
		return c(source.Fatal, "PUBLICATION_MISSING")
	case errors.Is(err, errTablesPartial): // whatever the cause: some shards may have changed
		return c(source.RetrySame, "TABLES_PARTIAL")
	case errors.Is(err, errTables):
		return c(source.Fatal, "BAD_TABLES")
	case errors.Is(err, errNoDSN):
		return c(source.Fatal, "NO_DSN")
	case errors.Is(err, source.ErrBadCheckpoint):
		return c(source.Fatal, "BAD_CHECKPOINT")
	case errors.Is(err, source.ErrUnknownTablet), errors.Is(err, source.ErrUnknownReplica):
		return c(source.Fatal, "UNKNOWN_REPLICA")
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return classifyCode(pg)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err):
		return c(source.RetrySame, "TIMEOUT")
	case errors.Is(err, context.Canceled):
		return c(source.RetrySame, "CANCELLED")
	}
	var connect *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connect) || errors.As(err, &netErr) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return c(source.RetrySame, "UNAVAILABLE")
	}
	return c(source.RetrySame, "UNKNOWN")
}

// classifyCode maps a server error by its SQLSTATE alone.
func classifyCode(pg *pgconn.PgError) source.Classification {
	c := func(a source.Action, reason string) source.Classification {
		return source.Classification{Action: a, Reason: reason + " (" + pg.Code + ")"}
	}
	switch pg.Code {
	case "55006": // object_in_use: the slot is held by another session
		return c(source.RetrySame, "SLOT_ACTIVE")
	case "55000": // object_not_in_prerequisite_state; a slot invalidated or
		// a server not set up for decoding comes typed (Reader.stated)
		return c(source.RetrySame, "NOT_READY")
	case "40001": // serialization_failure: on a standby, a recovery
		// conflict; one that invalidated the slot comes typed
		return c(source.RetrySame, "RECOVERY_CONFLICT")
	case "0A000": // feature_not_supported: decoding not possible here
		return c(source.RetryElsewhere, "NOT_CONFIGURED")
	case "42704": // undefined_object: the slot (START_REPLICATION) or, on 16 and 17,
		// the publication (decoding) went after the reader's start checked
		// both; a retry's start tells which (SLOT_MISSING, PUBLICATION_MISSING).
		// PostgreSQL 18 sends no error for a missing publication at all.
		return c(source.RetrySame, "UNDEFINED_OBJECT")
	case "58P01": // undefined_file: a WAL segment already removed
		return c(source.RetryElsewhere, "WAL_REMOVED")
	case "53300", "53400": // too many connections / wal senders; configuration limit (slots)
		return c(source.RetryElsewhere, "NO_CAPACITY")
	case "57P01", "57P02", "57P03": // admin or crash shutdown, cannot connect now
		return c(source.RetrySame, "UNAVAILABLE")
	case "28000", "28P01": // invalid authorization, password
		return c(source.Fatal, "AUTH")
	case "42501": // insufficient_privilege
		return c(source.Fatal, "PERMISSION")
	}
	if strings.HasPrefix(pg.Code, "08") { // connection exceptions
		return c(source.RetrySame, "UNAVAILABLE")
	}
	return c(source.RetrySame, "SERVER_ERROR")
}

// stateWait bounds how long Reader.stated looks for the state a server
// error left: a recovery conflict ends the reader's session first and
// marks the slot invalidated just after.
const stateWait = 2 * time.Second

// stated types a server error whose action depends on what the server
// says in words (55000, 40001; in its lc_messages language) by the state
// it leaves instead: the reader's slot invalidated (errSlotInvalidated:
// 55000 "can no longer get changes from replication slot", 40001 "… a
// logical replication slot that must be invalidated"). Other errors, and
// ones that leave the slot valid, pass as they are. (A server not set up
// for decoding shows otherwise: a primary without wal_level logical
// cannot hold the slot, SLOT_MISSING; a standby whose primary lowered it
// invalidates the slot, wal_level_insufficient.)
func (r *Reader) stated(err error) error {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "55000" && pg.Code != "40001" || r.names.pub == "" {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), stateWait)
	defer cancel()
	name := r.names.slot(r.sh.id)
	for {
		row, qerr := r.rep.slot(ctx, name)
		switch {
		case qerr == nil && row.invalidated != "":
			return fmt.Errorf("%w (%s: %s): %w", errSlotInvalidated, r.rep.cfg.Alias, row.invalidated, err)
		case qerr != nil, !row.exists, pg.Code != "40001":
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}
