package activities

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink"
	"github.com/tabletflow/tabletflow/source"
)

// slowListing is a fakeSource whose listing takes a while and is
// counted: the topology read a run's retry makes.
type slowListing struct {
	*fakeSource
	mu       sync.Mutex
	listings int
	replica  source.Replica
}

func (s *slowListing) ListTablets(ctx context.Context) ([]source.Tablet, error) {
	s.mu.Lock()
	s.listings++
	s.mu.Unlock()
	select { // a keyspace of thousands of tablets takes a while to list
	case <-time.After(300 * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return []source.Tablet{{ID: testTablet, Replicas: []source.Replica{s.replica}}}, nil
}

// retryRun is the start of a GetChanges attempt after the first, up to
// its check of the replica.
func retryRun(a *Activities, in GetChangesInput) *changesRun {
	info := activity.Info{Attempt: 2}
	return &changesRun{a: a, ctx: context.Background(), in: in, info: info, replica: in.Replica, sig: a.startSignals(context.Background(), info)}
}

// The retries of many tablets' runs at once (a replica that fails every
// tablet it serves) ask the topology about their replicas with one shared
// listing, as the tablet pickers do, not a listing of the whole keyspace
// each.
func TestRetriesOfManyRunsShareOneTopologyListing(t *testing.T) {
	src := &slowListing{fakeSource: &fakeSource{}, replica: source.Replica{Tablet: testTablet, Alias: testAlias, Serving: true, Healthy: true}}
	a := &Activities{Resources: &Resources{
		NewSource: func(config.Source) (source.Source, error) { return src, nil },
		NewSink:   func(config.Sink, string) (sink.Sink, error) { return newMemSink(&callLog{}), nil },
	}}
	const runs = 16
	var wg sync.WaitGroup
	errs := make([]error, runs)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := retryRun(a, input())
			defer r.sig.close()
			errs[i] = r.checkReplica()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err, "the replica is healthy")
	}
	require.Equal(t, 1, src.listings, "one listing for %d retries at once", runs)
}

// A retry finds its replica unhealthy in the shared listing: the run
// ends with ReplicaUnhealthy and the tablet selects another at once.
func TestARetryOnAnUnhealthyReplicaEndsReplicaUnhealthy(t *testing.T) {
	src := &slowListing{fakeSource: &fakeSource{}, replica: source.Replica{Tablet: testTablet, Alias: testAlias, Serving: true, Healthy: false}}
	a := &Activities{Resources: &Resources{NewSource: func(config.Source) (source.Source, error) { return src, nil }}}
	r := retryRun(a, input())
	defer r.sig.close()
	err := r.checkReplica()
	d := requireTyped(t, err, ErrReplicaUnhealthy)
	require.Equal(t, testAlias, d.Replica)
	require.Equal(t, "REPLICA_UNHEALTHY", d.Reason)
}

// A retry-same error of a run names the replica it failed on in its
// details, with the committed checkpoint: the one it moved to in place
// when it did (an earlier attempt's move, here), not the one its input
// named. The workflow charges that replica when the retries run out; the
// run's progress signal of the move may have been lost.
func TestARetrySameErrorNamesTheReplicaItFailedOn(t *testing.T) {
	const movedTo = "zone2-0000000201"
	for _, tt := range []struct {
		name    string
		moved   *Selection
		replica string
	}{
		{"on its replica", nil, testAlias},
		{"after a move in place", &Selection{Replica: source.Replica{Tablet: testTablet, Alias: movedTo, Serving: true, Healthy: true}, Candidates: 2}, movedTo},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.src.poll = func(_ context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
				if n == 0 {
					return batch(1, 3), nil
				}
				return source.Batch{}, errSourceDown
			}
			env := r.activityEnv(context.Background())
			if tt.moved != nil {
				env.SetHeartbeatDetails(Heartbeat{Switched: tt.moved})
			}
			_, err := r.run(env, input())
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			require.False(t, appErr.NonRetryable(), "retried by the policy")
			require.Equal(t, ErrRetrySame, appErr.Type())
			var d ErrorDetails
			require.NoError(t, appErr.Details(&d))
			require.Equal(t, tt.replica, d.Replica)
			require.Equal(t, cp(3), d.Checkpoint)
			require.Equal(t, "UNAVAILABLE", d.Reason)
		})
	}
}

// A run that ends in an error says in the error's details what it
// committed before (records and batches, its earlier attempts'
// included), for the tablet's counters: the error is all the workflow
// gets of a failed run, never its result.
func TestAFailedRunsErrorCountsWhatItCommitted(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		typ  string
	}{
		{"typed", errHistoryGone, ErrStreamExpired},
		{"retry same", errSourceDown, ErrRetrySame},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			r.src.poll = func(_ context.Context, n int, _ source.ChangesRequest) (source.Batch, error) {
				if n < 2 {
					return batch(uint64(3*n+1), uint64(3*n+3)), nil
				}
				return source.Batch{}, tt.err
			}
			env := r.activityEnv(context.Background())
			// An earlier attempt of this run committed 3 records in one batch.
			env.SetHeartbeatDetails(Heartbeat{Records: 3, Batches: 1})
			_, err := r.run(env, input())
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			require.Equal(t, tt.typ, appErr.Type())
			var d ErrorDetails
			require.NoError(t, appErr.Details(&d))
			require.Equal(t, int64(9), d.Records, "3 before, 6 in this attempt")
			require.Equal(t, int64(3), d.Batches)
		})
	}
}
