package vitess

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabletflow/tabletflow/source"
)

// Error is one of the adapter's own conditions, with the action it
// calls for and a reason for the status.
type Error struct {
	Action source.Action
	Reason string
	Msg    string
	// For Split: the new shards and the hand-off they start from.
	Children []string
	Handoff  source.Checkpoint
}

func (e *Error) Error() string { return e.Msg }

func newError(action source.Action, reason, format string, args ...any) *Error {
	return &Error{Action: action, Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// gtidSetMismatch is what a vttablet's vstreamer answers (INVALID_ARGUMENT)
// when it is behind the position asked for.
const gtidSetMismatch = "GTIDSet Mismatch"

// MySQL error numbers Vitess's table names.
const (
	erMasterFatalReadingBinlog     = 1236 // the binary logs holding the position were purged
	erSourceHasPurgedRequiredGtids = 1789 // likewise, for a GTID set
)

// ephemeral are the MySQL and client error numbers Vitess's table retries
// on the same tablet (its "ephemeral SQL errors"): connection errors, lock
// waits and deadlocks, timeouts, interruptions, a server out of resources
// or shutting down, and the unknown error.
var ephemeral = map[int]bool{
	2000: true, // CR_UNKNOWN_ERROR
	2002: true, // CR_CONNECTION_ERROR
	2003: true, // CR_CONN_HOST_ERROR
	2005: true, // CR_UNKNOWN_HOST
	2006: true, // CR_SERVER_GONE_ERROR
	2012: true, // CR_SERVER_HANDSHAKE_ERR
	2013: true, // CR_SERVER_LOST
	2018: true, // CR_NAMEDPIPE_STATE_ERROR
	2026: true, // CR_SSL_CONNECTION_ERROR
	2027: true, // CR_MALFORMED_PACKET
	1021: true, // ER_DISK_FULL
	1037: true, // ER_OUTOFMEMORY
	1038: true, // ER_OUT_OF_SORTMEMORY
	1041: true, // ER_OUT_OF_RESOURCES
	1053: true, // ER_SERVER_SHUTDOWN
	1078: true, // ER_GOT_SIGNAL
	1080: true, // ER_FORCING_CLOSE
	1105: true, // ER_UNKNOWN_ERROR
	1129: true, // ER_HOST_IS_BLOCKED
	1135: true, // ER_CANT_CREATE_THREAD
	1203: true, // ER_TOO_MANY_USER_CONNECTIONS
	1205: true, // ER_LOCK_WAIT_TIMEOUT
	1206: true, // ER_LOCK_TABLE_FULL
	1213: true, // ER_LOCK_DEADLOCK
	1226: true, // ER_USER_LIMIT_REACHED
	1317: true, // ER_QUERY_INTERRUPTED
	1815: true, // ER_INTERNAL_ERROR
	1874: true, // ER_INNODB_READ_ONLY
	3024: true, // ER_QUERY_TIMEOUT
	3168: true, // ER_SERVER_ISNT_AVAILABLE
}

var (
	// errnoRe finds a MySQL error as Vitess wraps it: "… (errno 1236) (sqlstate HY000)".
	errnoRe = regexp.MustCompile(`\(errno ([0-9]+)\) \(sqlstate [0-9a-zA-Z]{5}\)`)
	// nativeErrnoRe finds it as MySQL prints it: "ERROR 1236 (HY000): …".
	nativeErrnoRe = regexp.MustCompile(`ERROR ([0-9]+) \([0-9a-zA-Z]{5}\):`)
	// packetTooLargeRe: gRPC refused a message over its size limit.
	packetTooLargeRe = regexp.MustCompile(`grpc: (received|trying to send) message larger than max \(\d+ vs\. \d+\)`)
)

// Classify maps an error from vtctld, a vttablet or the adapter to an
// action, by Vitess's own table (go/vt/discovery/tablet_error_action.go in
// v24, which its vstream manager and VReplication use), then the
// adapter's own conditions:
//
//	FAILED_PRECONDITION, UNAVAILABLE                   → RetrySame
//	INVALID_ARGUMENT containing "GTIDSet Mismatch"     → RetryElsewhere (POSITION_MISMATCH)
//	other INVALID_ARGUMENT, INTERNAL                   → Fatal
//	UNKNOWN with MySQL error 1236 or 1789              → RetryElsewhere (BINLOG_PURGED)
//	a MySQL error in the message: ephemeral → RetrySame, any other → Fatal
//	no MySQL error: the number Vitess maps the code to decides:
//	  CANCELLED, DEADLINE_EXCEEDED, ABORTED (1317), RESOURCE_EXHAUSTED
//	  (1203; 1041 for a throttled transaction), every other code (1105)
//	                                                   → RetrySame
//	  PERMISSION_DENIED, UNAUTHENTICATED (1045), UNIMPLEMENTED (1235),
//	  RESOURCE_EXHAUSTED for a message over gRPC's limit (1153) → Fatal
//	no tablet of the shard has the position any more   → Expired (HISTORY_GONE)
//
// An error that is not a gRPC status is UNKNOWN to Vitess, and so retried
// (a context's deadline or cancellation too).
func Classify(err error) source.Classification {
	if err == nil {
		return source.Classification{}
	}
	var own *Error
	if errors.As(err, &own) {
		return source.Classification{Action: own.Action, Reason: own.Reason, Children: own.Children, Handoff: own.Handoff}
	}
	if errors.Is(err, source.ErrBadCheckpoint) {
		return source.Classification{Action: source.Fatal, Reason: "BAD_CHECKPOINT"}
	}
	if errors.Is(err, source.ErrUnknownTablet) || errors.Is(err, source.ErrUnknownReplica) {
		return source.Classification{Action: source.Fatal, Reason: "UNKNOWN_TABLET"}
	}
	code, msg := codes.Unknown, err.Error()
	if st, ok := status.FromError(err); ok {
		code, msg = st.Code(), st.Message()
	} else {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			code = codes.DeadlineExceeded
		case errors.Is(err, context.Canceled):
			code = codes.Canceled
		}
	}
	return classifyStatus(code, msg)
}

// classifyStatus is Vitess's table for a status code and message.
func classifyStatus(code codes.Code, msg string) source.Classification {
	retry := func(reason string) source.Classification {
		return source.Classification{Action: source.RetrySame, Reason: reason}
	}
	fatal := func(reason string) source.Classification {
		return source.Classification{Action: source.Fatal, Reason: reason}
	}
	switch code {
	case codes.FailedPrecondition, codes.Unavailable:
		return retry(source.GRPCCodeName(code))
	case codes.InvalidArgument:
		if strings.Contains(msg, gtidSetMismatch) {
			return source.Classification{Action: source.RetryElsewhere, Reason: "POSITION_MISMATCH"}
		}
		return fatal(source.GRPCCodeName(code))
	case codes.Internal:
		return fatal(source.GRPCCodeName(code))
	}
	errno, found := mysqlErrno(msg)
	if found {
		switch {
		case code == codes.Unknown && (errno == erMasterFatalReadingBinlog || errno == erSourceHasPurgedRequiredGtids):
			return source.Classification{Action: source.RetryElsewhere, Reason: "BINLOG_PURGED"}
		case ephemeral[errno]:
			return retry("MYSQL_" + strconv.Itoa(errno))
		}
		return fatal("MYSQL_" + strconv.Itoa(errno))
	}
	switch code {
	case codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented:
		return fatal(source.GRPCCodeName(code))
	case codes.ResourceExhausted:
		if packetTooLargeRe.MatchString(msg) {
			return fatal("MESSAGE_TOO_LARGE")
		}
	}
	return retry(source.GRPCCodeName(code))
}

// mysqlErrno finds the MySQL error number a message carries, as Vitess
// wraps it or as MySQL prints it.
func mysqlErrno(msg string) (int, bool) {
	m := errnoRe.FindStringSubmatch(msg)
	if m == nil {
		m = nativeErrnoRe.FindStringSubmatch(msg)
	}
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n > 65535 {
		return 1105, true // as Vitess reads a number it cannot parse: ER_UNKNOWN_ERROR
	}
	return n, true
}
