package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
)

func TestClassifyBySQLStateAndTypedErrors(t *testing.T) {
	pg := func(code, msg, detail string) error {
		return fmt.Errorf("start replication: %w", &pgconn.PgError{Code: code, Message: msg, Detail: detail})
	}
	tests := []struct {
		name   string
		err    error
		action source.Action
		reason string
	}{
		{"slot ahead of the checkpoint", fmt.Errorf("%w (zone2-s1a)", errSlotAhead), source.RetryElsewhere, "POSITION_MISMATCH"},
		{"slot missing (ours)", errSlotMissing, source.RetryElsewhere, "SLOT_MISSING"},
		{"slot invalidated (ours)", errSlotInvalidated, source.RetryElsewhere, "SLOT_INVALIDATED"},
		{"no replica can serve", fmt.Errorf("%w at 0/1: %w", errExpired, errSlotAhead), source.Expired, "HISTORY_GONE"},
		// A promoted standby (or one following it): its LSNs past the fork
		// are other WAL than the stream's checkpoints'.
		{"replica on another timeline", fmt.Errorf("start: %w", &timelineError{alias: "zone2-s1a", server: 2, stream: 1}), source.RetryElsewhere, "TIMELINE_MISMATCH"},
		// No replica left on the stream's timeline: expired, not "elsewhere".
		{"no replica on the stream's timeline", fmt.Errorf("%w at 0/1 on timeline 1: %w", errExpired, &timelineError{alias: "zone2-s1a", server: 2, stream: 1}), source.Expired, "HISTORY_GONE"},
		{"snapshot select waited in vain", fmt.Errorf("snapshot of public.items on zone1-s1p: %w: transactions [761]", errNotVisible), source.RetrySame, "COMMIT_NOT_VISIBLE"},
		{"DSN variable not set", fmt.Errorf("x: %w", errNoDSN), source.Fatal, "NO_DSN"},
		{"bad checkpoint", source.ErrBadCheckpoint, source.Fatal, "BAD_CHECKPOINT"},
		{"unknown replica", source.ErrUnknownReplica, source.Fatal, "UNKNOWN_REPLICA"},
		{"55006 slot active", pg("55006", `replication slot "tf_x_s1" is active for PID 42`, ""), source.RetrySame, "SLOT_ACTIVE (55006)"},
		// 55000 and 40001 by their codes alone: what the server says in
		// words is in its lc_messages language. A slot they invalidated
		// comes typed by the reader, which reads the slot's row
		// (Reader.stated).
		{"55000 can no longer get changes, the slot's row read", fmt.Errorf("%w (zone2-s1a: wal_removed): %w", errSlotInvalidated,
			&pgconn.PgError{Code: "55000", Message: `can no longer get changes from replication slot "tf_x_s1"`}), source.RetryElsewhere, "SLOT_INVALIDATED"},
		{"55000 in French, the slot's row read", fmt.Errorf("%w (zone2-s1a: wal_removed): %w", errSlotInvalidated,
			&pgconn.PgError{Code: "55000", Message: `ne peut plus obtenir les modifications à partir du slot de réplication « tf_x_s1 »`}), source.RetryElsewhere, "SLOT_INVALIDATED"},
		{"40001 slot conflict, the slot's row read", fmt.Errorf("%w (zone2-s1a: rows_removed): %w", errSlotInvalidated,
			&pgconn.PgError{Code: "40001", Message: "terminating connection due to conflict with recovery", Detail: "User was using a logical replication slot that must be invalidated."}), source.RetryElsewhere, "SLOT_INVALIDATED"},
		{"55000 can no longer get changes, untyped", pg("55000", `can no longer get changes from replication slot "tf_x_s1"`, ""), source.RetrySame, "NOT_READY (55000)"},
		{"55000 decoding on standby needs wal_level", pg("55000", "logical decoding on standby requires \"wal_level\" >= \"logical\" on the primary", ""), source.RetrySame, "NOT_READY (55000)"},
		{"55000 other", pg("55000", "cannot advance replication slot to 0/1, minimum is 0/2", ""), source.RetrySame, "NOT_READY (55000)"},
		{"55000 in German", pg("55000", `kann keine Änderungen mehr aus Replikations-Slot »tf_x_s1« lesen`, ""), source.RetrySame, "NOT_READY (55000)"},
		{"40001 slot conflict, untyped", pg("40001", "terminating connection due to conflict with recovery", "User was using a logical replication slot that must be invalidated."), source.RetrySame, "RECOVERY_CONFLICT (40001)"},
		{"40001 in French", pg("40001", "arrêt de la connexion en raison d'un conflit avec la restauration", "L'utilisateur utilisait un slot de réplication logique qui doit être invalidé."), source.RetrySame, "RECOVERY_CONFLICT (40001)"},
		{"40001 other recovery conflict", pg("40001", "canceling statement due to conflict with recovery", "User query might have needed to see row versions that must be removed."), source.RetrySame, "RECOVERY_CONFLICT (40001)"},
		{"0A000 not while in recovery", pg("0A000", "logical replication slot cannot be used while in recovery", ""), source.RetryElsewhere, "NOT_CONFIGURED (0A000)"},
		// 42704 by its code alone: what went (a slot, the publication) is
		// told by the next start's checks, not by the message.
		{"42704 slot does not exist", pg("42704", `replication slot "tf_x_s1" does not exist`, ""), source.RetrySame, "UNDEFINED_OBJECT (42704)"},
		{"42704 publication does not exist", pg("42704", `publication "tabletflow_x" does not exist`, ""), source.RetrySame, "UNDEFINED_OBJECT (42704)"},
		{"42704 in another language", pg("42704", `la publication « tabletflow_x » n'existe pas`, ""), source.RetrySame, "UNDEFINED_OBJECT (42704)"},
		{"publication missing (ours)", fmt.Errorf("start: %w", &publicationError{pub: "tabletflow_x", alias: "zone1-s1p", missing: true}), source.Fatal, "PUBLICATION_MISSING"},
		{"publication lacks a table (ours)", &publicationError{pub: "tabletflow_x", alias: "zone1-s1p", tables: []string{"public.items"}}, source.Fatal, "PUBLICATION_MISSING"},
		{"58P01 WAL removed", pg("58P01", "requested WAL segment 000000010000000000000001 has already been removed", ""), source.RetryElsewhere, "WAL_REMOVED (58P01)"},
		{"53300 too many connections", pg("53300", "sorry, too many clients already", ""), source.RetryElsewhere, "NO_CAPACITY (53300)"},
		{"53400 all slots in use", pg("53400", "all replication slots are in use", ""), source.RetryElsewhere, "NO_CAPACITY (53400)"},
		{"57P01 admin shutdown", pg("57P01", "terminating connection due to administrator command", ""), source.RetrySame, "UNAVAILABLE (57P01)"},
		{"57P03 cannot connect now", pg("57P03", "the database system is starting up", ""), source.RetrySame, "UNAVAILABLE (57P03)"},
		{"08006 connection failure", pg("08006", "connection failure", ""), source.RetrySame, "UNAVAILABLE (08006)"},
		{"28P01 wrong password", pg("28P01", `password authentication failed for user "tabletflow"`, ""), source.Fatal, "AUTH (28P01)"},
		{"28000 no pg_hba entry", pg("28000", "no pg_hba.conf entry", ""), source.Fatal, "AUTH (28000)"},
		{"42501 permission", pg("42501", "permission denied to start WAL sender", ""), source.Fatal, "PERMISSION (42501)"},
		{"another code", pg("XX000", "internal error", ""), source.RetrySame, "SERVER_ERROR (XX000)"},
		{"connect refused", &pgconn.ConnectError{}, source.RetrySame, "UNAVAILABLE"},
		{"network error", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, source.RetrySame, "UNAVAILABLE"},
		{"unexpected EOF", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), source.RetrySame, "UNAVAILABLE"},
		{"deadline", context.DeadlineExceeded, source.RetrySame, "TIMEOUT"},
		{"cancelled", context.Canceled, source.RetrySame, "CANCELLED"},
		{"anything else", errors.New("odd"), source.RetrySame, "UNKNOWN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Classify(tt.err)
			require.Equal(t, tt.action, c.Action, "action of %v", tt.err)
			require.Equal(t, tt.reason, c.Reason)
			// A server error's text never decides: the same error in
			// any words is classified the same.
			var e *pgconn.PgError
			if errors.As(tt.err, &e) {
				for _, words := range [][2]string{{"", ""}, {"ein Fehler", "mit Einzelheiten"}, {e.Detail, e.Message}} {
					saved := *e
					e.Message, e.Detail, e.Hint = words[0], words[1], words[0]
					require.Equal(t, c, Classify(tt.err), "%s said %q / %q", e.Code, words[0], words[1])
					*e = saved
				}
			}
		})
	}
	require.Zero(t, Classify(nil))
}

func TestTimelineErrorNamesBothTimelines(t *testing.T) {
	err := &timelineError{alias: "zone2-s1a", server: 2, stream: 1}
	require.ErrorIs(t, err, errTimeline)
	require.Equal(t, "replica is on another timeline than the stream's checkpoints: zone2-s1a is on timeline 2, the stream's checkpoints are on timeline 1", err.Error())
}
