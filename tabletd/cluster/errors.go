package cluster

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
)

const (
	codeFailedPrecondition = codes.FailedPrecondition
	codeInvalidArgument    = codes.InvalidArgument
	codeNotFound           = codes.NotFound
	codeOutOfRange         = codes.OutOfRange
)

// errf returns a status error with an ErrorInfo detail. field names the
// request field at fault, if any.
func errf(code codes.Code, reason sourcepb.Reason, field, format string, args ...any) error {
	return errInfo(code, &sourcepb.ErrorInfo{Reason: reason, Field: field}, fmt.Sprintf(format, args...))
}

func errInfo(code codes.Code, info *sourcepb.ErrorInfo, msg string) error {
	st, err := status.New(code, msg).WithDetails(info)
	if err != nil { // only fails for a nil detail
		return status.Error(code, msg)
	}
	return st.Err()
}

func errBadRequest(field, format string, args ...any) error {
	return errf(codeInvalidArgument, sourcepb.Reason_BAD_REQUEST, field, field+": "+format, args...)
}

func errUnknownTablet(id string) error {
	return errInfo(codeNotFound, &sourcepb.ErrorInfo{Reason: sourcepb.Reason_UNKNOWN_TABLET, Tablet: id, Field: "tablet"},
		fmt.Sprintf("unknown tablet %q", id))
}

func errUnknownStream(id string) error {
	return errf(codeNotFound, sourcepb.Reason_UNKNOWN_STREAM, "stream", "unknown stream %q", id)
}

func errUnknownServer(alias string) error {
	return errf(codeNotFound, sourcepb.Reason_UNKNOWN_SERVER, "server", "unknown server %q", alias)
}
