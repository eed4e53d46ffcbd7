package vitess

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabletflow/tabletflow/source"
)

// TestClassifyFollowsVitessTabletErrorTable has one row per row of
// Vitess's own table (go/vt/discovery/tablet_error_action.go, v24), then
// the adapter's own conditions. Errors are built as a vttablet or vtctld
// sends them: a gRPC status, MySQL errors carried in the message as
// Vitess wraps them.
func TestClassifyFollowsVitessTabletErrorTable(t *testing.T) {
	st := func(c codes.Code, msg string) error { return status.Error(c, msg) }
	tests := []struct {
		name   string
		err    error
		action source.Action
		reason string
	}{
		// FAILED_PRECONDITION: retry the same tablet (not serving, wrong type for now).
		{"failed precondition", st(codes.FailedPrecondition, "operation not allowed in state NOT_SERVING"), source.RetrySame, "FAILED_PRECONDITION"},
		// UNAVAILABLE: retry the same tablet (down, restarting).
		{"unavailable", st(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:16101: connect: connection refused\""), source.RetrySame, "UNAVAILABLE"},
		// INVALID_ARGUMENT with GTIDSet Mismatch: a replica behind the position; elsewhere.
		{"gtid set mismatch", st(codes.InvalidArgument, "GTIDSet Mismatch: requested source position:MariaDB/0-966683556-189, current target vrep position: MariaDB/0-966683556-113"),
			source.RetryElsewhere, "POSITION_MISMATCH"},
		// Other INVALID_ARGUMENT: fail.
		{"other invalid argument", st(codes.InvalidArgument, "could not decode position: parse error"), source.Fatal, "INVALID_ARGUMENT"},
		// INVALID_ARGUMENT wins over an errno in the message.
		{"invalid argument with errno", st(codes.InvalidArgument, "bad value (errno 1205) (sqlstate HY000)"), source.Fatal, "INVALID_ARGUMENT"},
		// INTERNAL (journal participants missing): fail, a new stream is needed.
		{"internal", st(codes.Internal, "journal participants do not match"), source.Fatal, "INTERNAL"},
		// INTERNAL wins over an ephemeral errno too.
		{"internal with ephemeral errno", st(codes.Internal, "x (errno 1213) (sqlstate 40001)"), source.Fatal, "INTERNAL"},
		// UNKNOWN with 1236: the binary logs holding the position were purged; elsewhere.
		{"purged 1236", st(codes.Unknown, "stream (at source tablet) error @ MariaDB/0-100-57: Could not find GTID state requested by slave in any binlog files. Probably the slave state is too old and required binlog files have been purged. (errno 1236) (sqlstate HY000)"),
			source.RetryElsewhere, "BINLOG_PURGED"},
		// UNKNOWN with 1789: likewise, MySQL's GTID purged error.
		{"purged 1789", st(codes.Unknown, "The slave is connecting using CHANGE MASTER TO MASTER_AUTO_POSITION = 1, but the master has purged binary logs containing GTIDs that the slave requires. (errno 1789) (sqlstate HY000)"),
			source.RetryElsewhere, "BINLOG_PURGED"},
		// The native MySQL form of the message is read too.
		{"purged native form", st(codes.Unknown, "ERROR 1236 (HY000): binary log purged"), source.RetryElsewhere, "BINLOG_PURGED"},
		// 1236 under another code is not Vitess's purged case: not ephemeral, so fail.
		{"1236 under aborted", st(codes.Aborted, "x (errno 1236) (sqlstate HY000)"), source.Fatal, "MYSQL_1236"},
		// Ephemeral SQL errors: retry the same tablet, one row each.
		{"deadlock 1213", st(codes.Unknown, "Deadlock found (errno 1213) (sqlstate 40001)"), source.RetrySame, "MYSQL_1213"},
		{"lock wait 1205", st(codes.Unknown, "Lock wait timeout exceeded (errno 1205) (sqlstate HY000)"), source.RetrySame, "MYSQL_1205"},
		{"max execution time 3024", st(codes.Unknown, "Query execution was interrupted, maximum statement execution time exceeded (errno 3024) (sqlstate HY000)"), source.RetrySame, "MYSQL_3024"},
		{"interrupted 1317", st(codes.Aborted, "Query execution was interrupted (errno 1317) (sqlstate 70100)"), source.RetrySame, "MYSQL_1317"},
		{"server gone 2006", st(codes.Unknown, "MySQL server has gone away (errno 2006) (sqlstate HY000)"), source.RetrySame, "MYSQL_2006"},
		{"server lost 2013", st(codes.Unknown, "Lost connection to MySQL server during query (errno 2013) (sqlstate HY000)"), source.RetrySame, "MYSQL_2013"},
		{"connection error 2002", st(codes.Unknown, "ERROR 2002 (HY000): Can't connect"), source.RetrySame, "MYSQL_2002"},
		{"too many connections 1203", st(codes.ResourceExhausted, "x (errno 1203) (sqlstate 42000)"), source.RetrySame, "MYSQL_1203"},
		{"shutdown 1053", st(codes.Unknown, "Server shutdown in progress (errno 1053) (sqlstate 08S01)"), source.RetrySame, "MYSQL_1053"},
		{"read only 1874", st(codes.Unknown, "InnoDB is in read only mode (errno 1874) (sqlstate HY000)"), source.RetrySame, "MYSQL_1874"},
		{"unknown error 1105", st(codes.Unknown, "x (errno 1105) (sqlstate HY000)"), source.RetrySame, "MYSQL_1105"},
		// A non-ephemeral SQL error: fail.
		{"access denied 1045", st(codes.Unknown, "Access denied for user 'vt_filtered'@'localhost' (errno 1045) (sqlstate 28000)"), source.Fatal, "MYSQL_1045"},
		{"no such table 1146", st(codes.Unknown, "Table 'vt_commerce.x' doesn't exist (errno 1146) (sqlstate 42S02)"), source.Fatal, "MYSQL_1146"},
		// No MySQL error: the code stands for the number Vitess maps it to.
		// CANCELLED, DEADLINE_EXCEEDED, ABORTED: 1317, ephemeral.
		{"cancelled", st(codes.Canceled, "context canceled"), source.RetrySame, "CANCELLED"},
		{"deadline", st(codes.DeadlineExceeded, "context deadline exceeded"), source.RetrySame, "DEADLINE_EXCEEDED"},
		{"aborted", st(codes.Aborted, "unexpected server EOF while parsing events"), source.RetrySame, "ABORTED"},
		// PERMISSION_DENIED, UNAUTHENTICATED: 1045, fail.
		{"permission denied", st(codes.PermissionDenied, "auth failure: caller \"u\" provided invalid credentials"), source.Fatal, "PERMISSION_DENIED"},
		{"unauthenticated", st(codes.Unauthenticated, "username and password must be provided"), source.Fatal, "UNAUTHENTICATED"},
		// RESOURCE_EXHAUSTED: 1203 (ephemeral), but a message over gRPC's limit is 1153 (fail).
		{"resource exhausted", st(codes.ResourceExhausted, "stream health buffer overflowed. client should reconnect for up-to-date status"), source.RetrySame, "RESOURCE_EXHAUSTED"},
		{"message too large", st(codes.ResourceExhausted, "grpc: received message larger than max (300000000 vs. 268435456)"), source.Fatal, "MESSAGE_TOO_LARGE"},
		// UNIMPLEMENTED: 1235, fail (a vttablet without the queryservice).
		{"unimplemented", st(codes.Unimplemented, "unknown service queryservice.Query"), source.Fatal, "UNIMPLEMENTED"},
		// Anything else maps to 1105, which Vitess counts ephemeral.
		{"unknown", st(codes.Unknown, "vttablet: rpc error"), source.RetrySame, "UNKNOWN"},
		{"not found", st(codes.NotFound, "node doesn't exist: keyspaces/commerce/shards/-80/Shard"), source.RetrySame, "NOT_FOUND"},
		// An error that is no gRPC status is UNKNOWN to Vitess.
		{"plain error", errors.New("boom"), source.RetrySame, "UNKNOWN"},
		{"context deadline", fmt.Errorf("vstream: %w", context.DeadlineExceeded), source.RetrySame, "DEADLINE_EXCEEDED"},
		// A wrapped status is read through the wrapping.
		{"wrapped mismatch", fmt.Errorf("vstream of shard -80 from zone2-0000000101 at MariaDB/0-1-9: %w",
			st(codes.InvalidArgument, "GTIDSet Mismatch: requested source position:MariaDB/0-1-9, current target vrep position: MariaDB/0-1-3")),
			source.RetryElsewhere, "POSITION_MISMATCH"},
		// The adapter's own conditions.
		{"history gone", newError(source.Expired, "HISTORY_GONE", "no vttablet of shard -80 holds position MariaDB/0-1-9 any more"), source.Expired, "HISTORY_GONE"},
		{"resharded", fmt.Errorf("shard -80: %w", newError(source.Fatal, "RESHARDED", "journal")), source.Fatal, "RESHARDED"},
		{"start from", newError(source.Fatal, "START_FROM", "startFrom"), source.Fatal, "START_FROM"},
		{"bad checkpoint", fmt.Errorf("%w: 1.2", source.ErrBadCheckpoint), source.Fatal, "BAD_CHECKPOINT"},
		{"unknown tablet", fmt.Errorf("%w: x", source.ErrUnknownTablet), source.Fatal, "UNKNOWN_TABLET"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Classify(tt.err)
			require.Equal(t, tt.action, got.Action, "action of %v: got %s", tt.err, got.Action)
			require.Equal(t, tt.reason, got.Reason)
		})
	}
	require.Equal(t, source.Classification{}, Classify(nil))
}

// TestEveryEphemeralErrorRetriesTheSameTablet: each MySQL error Vitess
// counts ephemeral, under the UNKNOWN code, retries in place.
func TestEveryEphemeralErrorRetriesTheSameTablet(t *testing.T) {
	require.Len(t, ephemeral, 30, "Vitess v24 lists 30 ephemeral errors")
	for n := range ephemeral {
		c := Classify(status.Error(codes.Unknown, fmt.Sprintf("x (errno %d) (sqlstate HY000)", n)))
		require.Equal(t, source.RetrySame, c.Action, "errno %d", n)
	}
}
