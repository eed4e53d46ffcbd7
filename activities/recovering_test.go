package activities

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// progressOf returns the progress signals a fake stream took, in order.
func progressOf(stream *fakeStream) []Progress {
	var got []Progress
	for _, s := range stream.signalled() {
		if p, ok := s.(Progress); ok {
			got = append(got, p)
		}
	}
	return got
}

// A run of a tablet that shows Retrying after a failed run (Recovering)
// tells its workflow at its first commit that it streams, as a retry's
// first commit does; a first attempt of a tablet that is streaming sends
// no signal.
func TestGetChangesOfARecoveringTabletSignalsStreamingAtItsFirstCommit(t *testing.T) {
	for _, recovering := range []bool{false, true} {
		r := newRig(t)
		stream := &fakeStream{}
		r.a.Client = stream
		r.script(batch(1, 3), batch(4, 6))
		in := input()
		in.Recovering = recovering
		_, err := r.run(r.activityEnv(context.Background()), in)
		require.NoError(t, err)
		got := progressOf(stream)
		if !recovering {
			require.Empty(t, got, "a streaming tablet's run sends no signal")
			continue
		}
		require.Len(t, got, 1, "one signal, at the first commit: %+v", got)
		require.Equal(t, "Streaming", got[0].State)
		require.Equal(t, int32(1), got[0].Attempt)
		require.Equal(t, in.Replica.Alias, got[0].Replica)
	}
}
