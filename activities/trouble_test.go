package activities

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"

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
