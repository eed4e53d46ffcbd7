package tabletd

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

// statusErr builds a gRPC status error as tabletd returns it: a code, a
// message and, when info is not nil, an ErrorInfo detail.
func statusErr(t *testing.T, code codes.Code, msg string, info *sourcepb.ErrorInfo) error {
	t.Helper()
	st := status.New(code, msg)
	if info != nil {
		var err error
		st, err = st.WithDetails(info)
		require.NoError(t, err)
	}
	return st.Err()
}

func TestClassifyMapsTabletdErrorsToActions(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want source.Classification
	}{
		// A server down or restarting: retry the same replica.
		{name: "unavailable",
			err:  statusErr(t, codes.Unavailable, "connection refused", nil),
			want: source.Classification{Action: source.RetrySame, Reason: "UNAVAILABLE"}},
		// A replica not serving for now: retry it, naming the detail's reason.
		{name: "failed precondition not serving",
			err: statusErr(t, codes.FailedPrecondition, "replica not serving",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_NOT_SERVING, Tablet: "t-0001"}),
			want: source.Classification{Action: source.RetrySame, Reason: "NOT_SERVING"}},
		// FAILED_PRECONDITION with no detail is still transient.
		{name: "failed precondition without detail",
			err:  statusErr(t, codes.FailedPrecondition, "not now", nil),
			want: source.Classification{Action: source.RetrySame, Reason: "FAILED_PRECONDITION"}},
		// The replica lost the history: exclude it and read another.
		{name: "position mismatch",
			err: statusErr(t, codes.InvalidArgument, "GTIDSet mismatch",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_POSITION_MISMATCH, Tablet: "t-0001"}),
			want: source.Classification{Action: source.RetryElsewhere, Reason: "POSITION_MISMATCH"}},
		// The tablet split: continue with its children from the hand-off.
		{name: "tablet split",
			err: statusErr(t, codes.OutOfRange, "tablet t-0001 split",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_TABLET_SPLIT, Tablet: "t-0001",
					Children: []string{"t-0009", "t-0010"}, HandoffCheckpoint: "1.33"}),
			want: source.Classification{Action: source.Split, Reason: "TABLET_SPLIT",
				Children: []string{"t-0009", "t-0010"}, Handoff: source.Checkpoint{Term: 1, Index: 33}}},
		// A split with no children cannot be followed.
		{name: "tablet split without children",
			err: statusErr(t, codes.OutOfRange, "tablet t-0001 split",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_TABLET_SPLIT, Tablet: "t-0001",
					HandoffCheckpoint: "1.33"}),
			want: source.Classification{Action: source.Fatal, Reason: "BAD_SPLIT_DETAIL"}},
		// A split whose hand-off does not parse cannot be followed.
		{name: "tablet split with bad handoff",
			err: statusErr(t, codes.OutOfRange, "tablet t-0001 split",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_TABLET_SPLIT, Tablet: "t-0001",
					Children: []string{"t-0009", "t-0010"}, HandoffCheckpoint: "1.x"}),
			want: source.Classification{Action: source.Fatal, Reason: "BAD_SPLIT_DETAIL"}},
		// A split without a hand-off checkpoint cannot be followed either.
		{name: "tablet split with empty handoff",
			err: statusErr(t, codes.OutOfRange, "tablet t-0001 split",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_TABLET_SPLIT, Tablet: "t-0001",
					Children: []string{"t-0009", "t-0010"}}),
			want: source.Classification{Action: source.Fatal, Reason: "BAD_SPLIT_DETAIL"}},
		// The history the stream needs is gone.
		{name: "stream expired",
			err: statusErr(t, codes.OutOfRange, "history freed",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_STREAM_EXPIRED, Tablet: "t-0001"}),
			want: source.Classification{Action: source.Expired, Reason: "STREAM_EXPIRED"}},
		// Permissions do not fix themselves.
		{name: "permission denied",
			err:  statusErr(t, codes.PermissionDenied, "no", nil),
			want: source.Classification{Action: source.Fatal, Reason: "PERMISSION_DENIED"}},
		// Nor do credentials.
		{name: "unauthenticated",
			err:  statusErr(t, codes.Unauthenticated, "who are you", nil),
			want: source.Classification{Action: source.Fatal, Reason: "UNAUTHENTICATED"}},
		// A bad request field: retrying sends the same request.
		{name: "invalid argument bad request",
			err: statusErr(t, codes.InvalidArgument, "max_records out of range",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_BAD_REQUEST, Field: "max_records"}),
			want: source.Classification{Action: source.Fatal, Reason: "BAD_REQUEST"}},
		// A checkpoint the server rejects: retrying sends it again.
		{name: "invalid argument bad checkpoint",
			err: statusErr(t, codes.InvalidArgument, "beyond the log's end",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_BAD_CHECKPOINT}),
			want: source.Classification{Action: source.Fatal, Reason: "BAD_CHECKPOINT"}},
		// INVALID_ARGUMENT with no detail is not a position mismatch.
		{name: "invalid argument without detail",
			err:  statusErr(t, codes.InvalidArgument, "bad", nil),
			want: source.Classification{Action: source.Fatal, Reason: "INVALID_ARGUMENT"}},
		// The stream was deleted or never created.
		{name: "unknown stream",
			err: statusErr(t, codes.NotFound, "no stream s1",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_UNKNOWN_STREAM}),
			want: source.Classification{Action: source.Fatal, Reason: "UNKNOWN_STREAM"}},
		// An injected fault acts as its code and is reported by the code.
		{name: "injected unavailable",
			err: statusErr(t, codes.Unavailable, "injected fault",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_INJECTED}),
			want: source.Classification{Action: source.RetrySame, Reason: "UNAVAILABLE"}},
		// A gRPC deadline is transient.
		{name: "status deadline exceeded",
			err:  statusErr(t, codes.DeadlineExceeded, "deadline", nil),
			want: source.Classification{Action: source.RetrySame, Reason: "DEADLINE_EXCEEDED"}},
		// Wrapping does not hide the status or its detail.
		{name: "wrapped position mismatch",
			err: fmt.Errorf("get changes: %w", statusErr(t, codes.InvalidArgument, "GTIDSet mismatch",
				&sourcepb.ErrorInfo{Reason: sourcepb.Reason_POSITION_MISMATCH})),
			want: source.Classification{Action: source.RetryElsewhere, Reason: "POSITION_MISMATCH"}},
		// A plain context deadline (not a status) is transient.
		{name: "context deadline exceeded",
			err:  context.DeadlineExceeded,
			want: source.Classification{Action: source.RetrySame, Reason: "DEADLINE_EXCEEDED"}},
		// A plain context cancellation (not a status) is transient.
		{name: "context canceled",
			err:  context.Canceled,
			want: source.Classification{Action: source.RetrySame, Reason: "CANCELLED"}},
		// A wrapped context error too.
		{name: "wrapped context deadline exceeded",
			err:  fmt.Errorf("get changes: %w", context.DeadlineExceeded),
			want: source.Classification{Action: source.RetrySame, Reason: "DEADLINE_EXCEEDED"}},
		// A malformed checkpoint in a response cannot be retried away.
		{name: "bad checkpoint in response",
			err:  fmt.Errorf("get changes: checkpoint: %w", source.ErrBadCheckpoint),
			want: source.Classification{Action: source.Fatal, Reason: "BAD_CHECKPOINT"}},
		// An unrecognised error is assumed transient.
		{name: "plain error",
			err:  errors.New("something odd"),
			want: source.Classification{Action: source.RetrySame, Reason: "UNKNOWN"}},
		// No error, nothing to do.
		{name: "nil", err: nil, want: source.Classification{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, Classify(tt.err))
		})
	}
}

func TestClassifySeesThroughWrapping(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		// A transient code.
		{name: "unavailable", err: statusErr(t, codes.Unavailable, "down", nil)},
		// A detail that sends the stream elsewhere.
		{name: "position mismatch", err: statusErr(t, codes.InvalidArgument, "mismatch",
			&sourcepb.ErrorInfo{Reason: sourcepb.Reason_POSITION_MISMATCH})},
		// A detail with payload (children, hand-off).
		{name: "tablet split", err: statusErr(t, codes.OutOfRange, "split",
			&sourcepb.ErrorInfo{Reason: sourcepb.Reason_TABLET_SPLIT,
				Children: []string{"t-0009", "t-0010"}, HandoffCheckpoint: "1.33"})},
		// A detail that ends the tablet's stream.
		{name: "stream expired", err: statusErr(t, codes.OutOfRange, "expired",
			&sourcepb.ErrorInfo{Reason: sourcepb.Reason_STREAM_EXPIRED})},
		// A fatal code.
		{name: "permission denied", err: statusErr(t, codes.PermissionDenied, "no", nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := Classify(tt.err)
			require.Equal(t, want, Classify(fmt.Errorf("get changes: %w", tt.err)))
			require.Equal(t, want, Classify(fmt.Errorf("tablet t-0001: %w", fmt.Errorf("get changes: %w", tt.err))))
		})
	}
}

func TestClassifyNeverReadsTheMessage(t *testing.T) {
	tests := []struct {
		name   string
		code   codes.Code
		info   *sourcepb.ErrorInfo
		msgs   []string
		wanted source.Classification
	}{
		// A message naming a position mismatch without the detail is still a
		// plain INVALID_ARGUMENT.
		{name: "invalid argument naming position mismatch", code: codes.InvalidArgument,
			msgs:   []string{"bad", "POSITION_MISMATCH", "GTIDSet Mismatch: replica lost history"},
			wanted: source.Classification{Action: source.Fatal, Reason: "INVALID_ARGUMENT"}},
		// A message naming a split without the detail is no split.
		{name: "unavailable naming split", code: codes.Unavailable,
			msgs:   []string{"down", "TABLET_SPLIT into t-0009 t-0010 at 1.33"},
			wanted: source.Classification{Action: source.RetrySame, Reason: "UNAVAILABLE"}},
		// A message naming expiry without the detail is no expiry.
		{name: "out of range naming expiry", code: codes.OutOfRange,
			msgs:   []string{"out of range", "STREAM_EXPIRED: history freed"},
			wanted: source.Classification{Action: source.Fatal, Reason: "OUT_OF_RANGE"}},
		// A detail wins over a message that contradicts it.
		{name: "not serving with contradicting message", code: codes.FailedPrecondition,
			info:   &sourcepb.ErrorInfo{Reason: sourcepb.Reason_NOT_SERVING},
			msgs:   []string{"not serving", "PERMISSION_DENIED", ""},
			wanted: source.Classification{Action: source.RetrySame, Reason: "NOT_SERVING"}},
		// A message naming a transient cause does not soften a fatal code.
		{name: "permission denied naming unavailable", code: codes.PermissionDenied,
			msgs:   []string{"no", "UNAVAILABLE, please retry", "deadline exceeded"},
			wanted: source.Classification{Action: source.Fatal, Reason: "PERMISSION_DENIED"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, msg := range tt.msgs {
				got := Classify(statusErr(t, tt.code, msg, tt.info))
				require.Equal(t, tt.wanted, got, "message %q", msg)
			}
		})
	}
}

func TestClassifySplitChildrenDoNotAliasTheDetail(t *testing.T) {
	info := &sourcepb.ErrorInfo{Reason: sourcepb.Reason_TABLET_SPLIT,
		Children: []string{"t-0009", "t-0010"}, HandoffCheckpoint: "1.33"}
	err := statusErr(t, codes.OutOfRange, "split", info)

	first := Classify(err)
	first.Children[0] = "changed"
	require.Equal(t, []string{"t-0009", "t-0010"}, Classify(err).Children)
}
