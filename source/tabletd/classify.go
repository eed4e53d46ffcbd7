package tabletd

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

// Classify maps an error from tabletd to an action. It reads the status
// code and the typed ErrorInfo detail, never the message:
//
//	POSITION_MISMATCH (INVALID_ARGUMENT)          → RetryElsewhere
//	TABLET_SPLIT                                  → Split, with children and hand-off
//	STREAM_EXPIRED                                → Expired
//	UNAVAILABLE, FAILED_PRECONDITION (not serving, lagging), DEADLINE_EXCEEDED,
//	ABORTED, RESOURCE_EXHAUSTED, INTERNAL, UNKNOWN, CANCELLED,
//	a context error                               → RetrySame
//	PERMISSION_DENIED, UNAUTHENTICATED, other INVALID_ARGUMENT, NOT_FOUND,
//	OUT_OF_RANGE, ALREADY_EXISTS, UNIMPLEMENTED, a malformed response → Fatal
func Classify(err error) source.Classification {
	if err == nil {
		return source.Classification{}
	}
	if errors.Is(err, source.ErrBadCheckpoint) {
		return source.Classification{Action: source.Fatal, Reason: "BAD_CHECKPOINT"}
	}
	st, ok := status.FromError(err)
	if !ok {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return source.Classification{Action: source.RetrySame, Reason: "DEADLINE_EXCEEDED"}
		case errors.Is(err, context.Canceled):
			return source.Classification{Action: source.RetrySame, Reason: "CANCELLED"}
		}
		return source.Classification{Action: source.RetrySame, Reason: "UNKNOWN"}
	}
	info := errorInfo(st)
	switch info.GetReason() {
	case sourcepb.Reason_POSITION_MISMATCH:
		return source.Classification{Action: source.RetryElsewhere, Reason: "POSITION_MISMATCH"}
	case sourcepb.Reason_TABLET_SPLIT:
		handoff, perr := source.ParseCheckpoint(info.HandoffCheckpoint)
		if perr != nil || handoff.IsZero() || len(info.Children) == 0 {
			return source.Classification{Action: source.Fatal, Reason: "BAD_SPLIT_DETAIL"}
		}
		return source.Classification{Action: source.Split, Reason: "TABLET_SPLIT",
			Children: append([]string(nil), info.Children...), Handoff: handoff}
	case sourcepb.Reason_STREAM_EXPIRED:
		return source.Classification{Action: source.Expired, Reason: "STREAM_EXPIRED"}
	}
	reason := source.GRPCCodeName(st.Code())
	if r := info.GetReason(); r != sourcepb.Reason_REASON_UNSPECIFIED && r != sourcepb.Reason_INJECTED {
		reason = r.String()
	}
	switch st.Code() {
	case codes.Unavailable, codes.FailedPrecondition, codes.DeadlineExceeded, codes.Aborted,
		codes.ResourceExhausted, codes.Internal, codes.Unknown, codes.Canceled:
		return source.Classification{Action: source.RetrySame, Reason: reason}
	}
	return source.Classification{Action: source.Fatal, Reason: reason}
}

// errorInfo returns the status's ErrorInfo detail, or nil.
func errorInfo(st *status.Status) *sourcepb.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*sourcepb.ErrorInfo); ok {
			return info
		}
	}
	return nil
}
