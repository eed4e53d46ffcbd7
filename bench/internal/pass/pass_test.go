package pass

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

func TestNewCountsTheSteadyRateAfterTheFirstCommit(t *testing.T) {
	f := New(1000, 2*time.Second, 500*time.Millisecond, 100, 10, nil)
	require.Equal(t, 2.0, f.Seconds)
	require.Equal(t, 500.0, f.RecordsPerS)
	require.Equal(t, 0.5, f.FirstCommitS)
	require.Equal(t, 600.0, f.SteadyRecordsPerS) // 900 records in 1.5 s
	require.Equal(t, 10, f.Batches)
	// All in one batch: no steady rate.
	require.Zero(t, New(1000, time.Second, time.Second, 1000, 1, nil).SteadyRecordsPerS)
}

func TestSplitLeavesReadingWhatWritingAndAckingDidNotTake(t *testing.T) {
	var f Figures
	f.Split(3*time.Second, 1200400*time.Microsecond, 300*time.Millisecond)
	require.Equal(t, 1.5, f.ReadS)
	require.Equal(t, 1.2, f.WriteS)
	require.Equal(t, 0.3, f.AckS)
	require.Contains(t, f.String(), "wall: read 1.50s, write+sync 1.20s, ack 0.30s")
	f.AckS = 0
	require.NotContains(t, f.String(), "ack")
	require.NotContains(t, Figures{}.String(), "wall")
}

// fakeReader answers GetChanges from batches in turn, and records acks.
type fakeReader struct {
	source.ReplicaReader
	batches []source.Batch
	asked   []source.Checkpoint
	acks    []source.Checkpoint
}

func (r *fakeReader) GetChanges(_ context.Context, req source.ChangesRequest) (source.Batch, error) {
	r.asked = append(r.asked, req.From)
	if len(r.batches) == 0 {
		return source.Batch{}, errors.New("no more")
	}
	b := r.batches[0]
	r.batches = r.batches[1:]
	return b, nil
}

func (r *fakeReader) Ack(_ context.Context, _, _ string, cp source.Checkpoint) error {
	r.acks = append(r.acks, cp)
	return nil
}

// fakeWriter keeps what is committed.
type fakeWriter struct {
	sink.TabletWriter
	cp      source.Checkpoint
	written int
}

func (w *fakeWriter) Checkpoint() source.Checkpoint { return w.cp }
func (w *fakeWriter) Write(_ context.Context, records []source.Record) error {
	w.written += len(records)
	return nil
}
func (w *fakeWriter) Commit(_ context.Context, cp source.Checkpoint) error { w.cp = cp; return nil }

func TestAdapterCommitsWhatIsPastTheSinkAndStopsWhenDone(t *testing.T) {
	cp := func(term uint64) source.Checkpoint { return source.Checkpoint{Term: term} }
	recs := func(n int) []source.Record { return make([]source.Record, n) }
	rd := &fakeReader{batches: []source.Batch{
		{Checkpoint: cp(1)},                   // idle: nothing committed, no batch counted
		{Checkpoint: cp(3), Records: recs(2)}, // the first batch
		{Checkpoint: cp(3)},                   // not past the sink's checkpoint
		{Checkpoint: cp(5), Records: recs(3)},
		{Checkpoint: cp(9), Records: recs(4)}, // not read: done before
	}}
	tw := &fakeWriter{}
	l, err := Adapter(context.Background(), rd, tw, source.ChangesRequest{Stream: "s", Tablet: "t", From: cp(0)}, time.Now(),
		func(at source.Checkpoint, n uint64) bool { return at.Term >= 5 })
	require.NoError(t, err)
	require.Equal(t, uint64(5), l.Records)
	require.Equal(t, uint64(2), l.FirstCount)
	require.Equal(t, 2, l.Batches)
	require.Equal(t, 5, tw.written)
	require.Equal(t, cp(5), tw.cp)
	require.Equal(t, []source.Checkpoint{cp(0), cp(1), cp(3), cp(3)}, rd.asked, "each read from where the last ended")
	require.Equal(t, []source.Checkpoint{cp(1), cp(3), cp(5)}, rd.acks)

	_, err = Adapter(context.Background(), &fakeReader{}, &fakeWriter{}, source.ChangesRequest{}, time.Now(),
		func(source.Checkpoint, uint64) bool { return false })
	require.ErrorContains(t, err, "after 0 records: no more")
}
