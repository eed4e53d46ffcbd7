package activities

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/sink/jsonl"
)

func TestClassifySink(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want sinkClass
	}{
		// Another writer committed: this one stops, a new run reopens.
		{name: "fenced", err: fmt.Errorf("sink commit at 1.9: %w", sink.ErrFenced), want: sinkClass{ErrFenced, "FENCED"}},
		// A fenced commit whose clean-up also failed is still fenced.
		{name: "fenced and cleanup failed", err: errors.Join(sink.ErrFenced, &fs.PathError{Op: "truncate", Err: syscall.EIO}),
			want: sinkClass{ErrFenced, "FENCED"}},
		// Another writer holds the tablet: wait, same replica.
		{name: "locked", err: fmt.Errorf("open sink for tablet t-0001: %w", sink.ErrLocked), want: sinkClass{ErrSinkUnavailable, "SINK_LOCKED"}},
		// The sink was closed under the writer (the worker is stopping).
		{name: "closed", err: sink.ErrClosed, want: sinkClass{ErrSinkUnavailable, "SINK_CLOSED"}},
		// The commit did not finish within its timeout.
		{name: "commit timeout", err: fmt.Errorf("sink commit at 1.9: %w", context.DeadlineExceeded), want: sinkClass{ErrSinkUnavailable, "SINK_TIMEOUT"}},
		// A cancelled sink call (the commit's context is not cut, but a
		// sink may see a cancelled one at Open).
		{name: "cancelled", err: context.Canceled, want: sinkClass{ErrSinkUnavailable, "SINK_CANCELLED"}},
		// Disk full: transient, an operator frees space.
		{name: "disk full", err: &fs.PathError{Op: "write", Path: "t-0001.jsonl", Err: syscall.ENOSPC}, want: sinkClass{ErrSinkUnavailable, "SINK_IO"}},
		// Any error the sink does not name is taken as transient.
		{name: "unknown", err: errors.New("connection reset"), want: sinkClass{ErrSinkUnavailable, "SINK_IO"}},
		// Corrupt storage: the tablet fails with the reason.
		{name: "corrupt", err: sink.ErrCorrupt, want: sinkClass{ErrSinkFailed, "SINK_CORRUPT"}},
		// The JSONL adapter's errors are cases of the sink's, found
		// through wrapping without this package knowing the adapter.
		{name: "jsonl corrupt", err: fmt.Errorf("open tablet t-0001: %w: data file holds 10 bytes", jsonl.ErrCorrupt), want: sinkClass{ErrSinkFailed, "SINK_CORRUPT"}},
		// A corrupt sink that also failed an I/O call is still corrupt.
		{name: "corrupt and io", err: errors.Join(&fs.PathError{Op: "read", Err: syscall.EIO}, jsonl.ErrCorrupt), want: sinkClass{ErrSinkFailed, "SINK_CORRUPT"}},
		// A record the sink cannot store.
		{name: "jsonl bad record", err: fmt.Errorf("sink write: %w: position 1.5: op \"upsert\"", jsonl.ErrBadRecord), want: sinkClass{ErrSinkFailed, "SINK_BAD_RECORD"}},
		// A tablet ID the sink cannot store under.
		{name: "jsonl bad tablet", err: jsonl.ErrBadTablet, want: sinkClass{ErrSinkFailed, "SINK_BAD_TABLET"}},
		// A commit going backwards (a source handing out positions out of
		// order).
		{name: "jsonl bad commit", err: fmt.Errorf("sink commit at 1.2: %w", jsonl.ErrBadCommit), want: sinkClass{ErrSinkFailed, "SINK_BAD_COMMIT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, classifySink(tt.err))
		})
	}
}
