package activities

import (
	"context"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/config"
	"github.com/tabletflow/tabletflow/sink/sinktest"
	"github.com/tabletflow/tabletflow/source"
)

// otherAlias is the test tablet's second replica in the reroute tests.
const otherAlias = "zone2-0000000201"

func twoReplicas() []source.Replica {
	return []source.Replica{
		{Tablet: testTablet, Alias: testAlias, Cell: "zone1", Serving: true, Healthy: true},
		{Tablet: testTablet, Alias: otherAlias, Cell: "zone2", Serving: true, Healthy: true},
	}
}

// movePoll scripts a move between two replicas: from hands out records
// 1–3 then waits (a quiet tablet), to three records from wherever it is
// asked, then the run's time is up.
func movePoll(r *rig, from, to string) func(context.Context, int, source.ChangesRequest) (source.Batch, error) {
	served := map[string]int{}
	return func(ctx context.Context, n int, req source.ChangesRequest) (source.Batch, error) {
		alias := r.src.readersOf()[n]
		served[alias]++ // the poller reads one replica at a time
		switch {
		case alias == from && served[alias] == 1:
			return batch(1, 3), nil
		case alias == to && served[alias] == 1:
			return source.Batch{Records: sinktest.Records(testTablet, req.From.Index+1, req.From.Index+3),
				Checkpoint: cp(req.From.Index + 3), CaughtUp: true}, nil
		case alias == to:
			r.clock.end()
		}
		<-ctx.Done()
		return source.Batch{}, ctx.Err()
	}
}

// rerouteRig is a GetChanges whose tablet has two replicas: the first
// hands out records 1–3 then waits (a quiet tablet), the second records
// 4–6 from wherever it is asked, then the run's time is up.
func rerouteRig(t *testing.T) (*rig, *fakeStream) {
	r, stream := watchedRig(t, twoReplicas())
	r.a.RecheckEvery = time.Hour // the watcher's read wakes the run, not a periodic check
	r.src.poll = movePoll(r, testAlias, otherAlias)
	go func() { // after the first commit (runWithin fails the test if it never comes)
		for r.mem.checkpoint(testTablet) != cp(3) {
			time.Sleep(5 * time.Millisecond)
		}
		stream.set(config.ExcludeList{{Alias: testAlias, Reason: "maintenance"}})
	}()
	return r, stream
}

// An operator's exclusion moves a run to another replica in place: the
// records go on from the committed checkpoint, none twice, and the
// tablet workflow hears where the run reads now (its progress signal,
// the heartbeat a retry resumes from, the result).
func TestGetChangesMovesToAnotherReplicaInPlaceWhenTheOperatorExcludesItsReplica(t *testing.T) {
	r, stream := rerouteRig(t)
	in := input()
	in.Reroute = &Reroute{}
	res, err := r.runWithin(t, in, "the run did not move and finish")
	require.NoError(t, err)

	require.Equal(t, StoppedRunEnded, res.Stopped, "the run goes on after the move")
	require.NotNil(t, res.Switched)
	require.Equal(t, otherAlias, res.Switched.Replica.Alias)
	require.Equal(t, cp(6), res.Checkpoint)
	require.Equal(t, sinktest.Records(testTablet, 1, 6), r.mem.records(testTablet), "every record once, in order")

	reqs, readers := r.src.requests(), r.src.readersOf()
	require.Equal(t, testAlias, readers[0])
	var moved bool
	for i, alias := range readers {
		if alias == otherAlias && !moved {
			moved = true
			require.Equal(t, cp(3), reqs[i].From, "the new replica is read from the committed checkpoint")
		}
		if moved {
			require.Equal(t, otherAlias, alias, "no read of the excluded replica after the move")
		}
	}
	require.True(t, moved)

	var switched []Progress
	for _, s := range stream.signalled() {
		if p, ok := s.(Progress); ok && p.Switched != nil {
			switched = append(switched, p)
		}
	}
	require.Len(t, switched, 1, "one progress signal for the move")
	require.Equal(t, Progress{State: "Streaming", Attempt: 1, Replica: otherAlias, Switched: switched[0].Switched}, switched[0])
	require.Equal(t, otherAlias, switched[0].Switched.Replica.Alias)
	require.Equal(t, 1, switched[0].Switched.Candidates, "the excluded replica is no candidate")

	beats := r.spy.heartbeats()
	require.NotNil(t, beats[len(beats)-1].hb.Switched, "a retry resumes on the replica moved to")
	require.Equal(t, otherAlias, beats[len(beats)-1].hb.Switched.Replica.Alias)
}

// A run that moves in place to a fallback replica (the operator excluded
// the preferred cell's one) ends FallbackRun after the move, however long
// its run.duration: the next run picks again, so the tablet returns to
// the preferred replica once the operator includes it, as promptly as
// after a fallback pick at a run's start. A move to a preferred replica
// keeps the run's own end.
func TestGetChangesOnAFallbackReplicaMovedToInPlaceEndsAfterFallbackRun(t *testing.T) {
	for _, tt := range []struct {
		name      string
		otherCell string
		wantEnds  bool
	}{
		{name: "fallback", otherCell: "zone2", wantEnds: true},
		{name: "preferred", otherCell: "zone1", wantEnds: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := rerouteRig(t)
			r.src.replicas[1].Cell = tt.otherCell
			r.a.RecheckEvery = 5 * time.Millisecond // the fake clock's advance is seen at the next check
			orig := r.src.poll
			r.src.poll = func(ctx context.Context, n int, req source.ChangesRequest) (source.Batch, error) {
				if r.src.readersOf()[n] == otherAlias && req.From == cp(6) {
					<-ctx.Done() // a quiet tablet on the new replica: only the run's end ends the run
					return source.Batch{}, ctx.Err()
				}
				return orig(ctx, n, req)
			}
			in := input() // RunFor: an hour
			in.Reroute = &Reroute{Selection: config.Selection{Cells: []string{"zone1"}, CellPreference: "preferLocal"}}
			done := r.start(in)
			deadline := time.Now().Add(30 * time.Second)
			for r.mem.checkpoint(testTablet) != cp(6) {
				require.True(t, time.Now().Before(deadline), "the run did not move and commit")
				time.Sleep(5 * time.Millisecond)
			}
			r.clock.advance(FallbackRun + time.Second)
			select {
			case o := <-done:
				require.True(t, tt.wantEnds, "a run on a preferred replica ended before its run.duration: %+v", o.res)
				require.NoError(t, o.err)
				require.Equal(t, StoppedRunEnded, o.res.Stopped)
				require.True(t, o.res.Switched.Fallback)
				require.Equal(t, cp(6), o.res.Checkpoint)
			case <-time.After(time.Second):
				require.False(t, tt.wantEnds, "a run on a fallback replica did not end FallbackRun after its move")
				r.clock.end()
				o := <-done
				require.NoError(t, o.err)
				require.False(t, o.res.Switched.Fallback)
			}
		})
	}
}

// A run on a fallback replica picks again when its FallbackRun is up and,
// the operator having included the preferred replica meanwhile, moves back
// to it in place: the run goes on (no run's end, which under load costs
// the tablet seconds of reads), records go on from the committed
// checkpoint, none twice, and the tablet hears it is off the fallback.
func TestGetChangesOnAFallbackMovesBackInPlaceWhenItsTimeIsUp(t *testing.T) {
	r, stream := watchedRig(t, twoReplicas())
	stream.set(config.ExcludeList{{Alias: testAlias, Reason: "maintenance"}})
	r.a.RecheckEvery = 5 * time.Millisecond // the fake clock's advance is seen at the next check
	r.src.poll = movePoll(r, otherAlias, testAlias)
	in := input() // RunFor: an hour
	in.Replica = twoReplicas()[1]
	in.Reroute = &Reroute{Selection: config.Selection{Cells: []string{"zone1"}, CellPreference: "preferLocal"}, Fallback: true}
	done := r.start(in)
	deadline := time.Now().Add(30 * time.Second)
	for r.mem.checkpoint(testTablet) != cp(3) {
		require.True(t, time.Now().Before(deadline), "the fallback was not read")
		time.Sleep(5 * time.Millisecond)
	}
	stream.set(config.ExcludeList{}) // the operator includes the preferred replica
	for list, _ := r.a.Watcher.Watched(testStream); len(list) > 0; list, _ = r.a.Watcher.Watched(testStream) {
		require.True(t, time.Now().Before(deadline), "the watcher did not read the include")
		time.Sleep(5 * time.Millisecond)
	}
	r.clock.advance(FallbackRun + time.Second)
	var o outcome
	select {
	case o = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the run did not move back and finish")
	}
	require.NoError(t, o.err)
	require.Equal(t, StoppedRunEnded, o.res.Stopped)
	require.NotNil(t, o.res.Switched, "the run ended on the fallback instead of moving back in place")
	require.Equal(t, testAlias, o.res.Switched.Replica.Alias)
	require.False(t, o.res.Switched.Fallback)
	require.Equal(t, cp(6), o.res.Checkpoint)
	require.Equal(t, sinktest.Records(testTablet, 1, 6), r.mem.records(testTablet), "every record once, in order")
	reqs, readers := r.src.requests(), r.src.readersOf()
	for i, alias := range readers {
		if alias == testAlias {
			require.Equal(t, cp(3), reqs[i].From, "the preferred replica is read from the committed checkpoint")
			require.NotContains(t, readers[i:], otherAlias, "the fallback read after the move")
			break
		}
	}
}

// A slow server does not slow the reads: the move's progress signal waits
// in its queue while the run commits from the new replica, and reaches
// the workflow before the run returns.
func TestGetChangesReadsOnWhileItsProgressSignalsWait(t *testing.T) {
	r, stream := rerouteRig(t)
	stream.hold = make(chan struct{})
	in := input()
	in.Reroute = &Reroute{}
	done := r.start(in)
	deadline := time.Now().Add(10 * time.Second)
	for r.mem.checkpoint(testTablet) != cp(6) {
		require.True(t, time.Now().Before(deadline), "the run did not commit the new replica's records while its signals waited")
		time.Sleep(5 * time.Millisecond)
	}
	require.Empty(t, stream.signalled())
	select {
	case <-done:
		t.Fatal("the run returned before its signals were sent")
	default:
	}
	close(stream.hold)
	var o outcome
	select {
	case o = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not return once its signals were taken")
	}
	require.NoError(t, o.err)
	require.Equal(t, otherAlias, o.res.Switched.Replica.Alias)
	var got []Progress
	for _, s := range stream.signalled() {
		if p, ok := s.(Progress); ok {
			got = append(got, p)
		}
	}
	require.Len(t, got, 1, "the move's signal, sent once the server took it")
	require.Equal(t, otherAlias, got[0].Switched.Replica.Alias)
}

// watchedRig is a rig over replicas whose stream and operator-list
// watcher are fakes (the list empty until the test sets it).
func watchedRig(t *testing.T, replicas []source.Replica) (*rig, *fakeStream) {
	r := newRig(t)
	r.src.replicas = replicas
	stream := &fakeStream{}
	r.a.Client = stream
	r.a.Watcher = &Watcher{Client: stream, Interval: 20 * time.Millisecond}
	return r, stream
}

// mismatchPoll: from hands out records 1–3, then says it lost the
// history (POSITION_MISMATCH); any other replica three records from
// wherever it is asked, then the run's time is up.
func mismatchPoll(r *rig, from string) func(context.Context, int, source.ChangesRequest) (source.Batch, error) {
	served := map[string]int{}
	return func(ctx context.Context, n int, req source.ChangesRequest) (source.Batch, error) {
		alias := r.src.readersOf()[n]
		served[alias]++
		switch {
		case alias == from && served[alias] == 1:
			return batch(1, 3), nil
		case alias == from:
			return source.Batch{}, errMismatch
		case served[alias] == 1:
			return source.Batch{Records: sinktest.Records(testTablet, req.From.Index+1, req.From.Index+3),
				Checkpoint: cp(req.From.Index + 3), CaughtUp: true}, nil
		}
		r.clock.end()
		<-ctx.Done()
		return source.Batch{}, ctx.Err()
	}
}

// preferCell is a selection that ranks cell's replicas first.
func preferCell(cell string) config.Selection {
	return config.Selection{Cells: []string{cell}, CellPreference: "preferLocal"}
}

// A replica that lost the history the tablet needs (POSITION_MISMATCH)
// is left in place, as an operator's exclusion is: the run reads another
// replica on from the committed checkpoint, none twice, without ending,
// and the tablet workflow hears which replica it left and why (the
// progress signal, the heartbeat a retry resumes from, the result), to
// exclude it as if the run had failed on it.
func TestGetChangesLeavesAReplicaThatLostTheHistoryInPlace(t *testing.T) {
	r, stream := watchedRig(t, twoReplicas())
	r.src.poll = mismatchPoll(r, testAlias)
	var busy atomic.Int32
	r.a.Busy = func() { busy.Add(1) }
	in := input()
	in.Batch.MaxRecords = 100 // no read is full: only the move says the worker is busy
	// The picker would pick the replica that lost the history again.
	in.Reroute = &Reroute{Selection: preferCell("zone1")}
	res, err := r.runWithin(t, in, "the run did not move and finish")
	require.NoError(t, err, "the mismatch ended the run instead of moving it in place")

	left := config.ExcludeList{{Alias: testAlias, Tablet: testTablet, Reason: "POSITION_MISMATCH"}}
	require.Equal(t, StoppedRunEnded, res.Stopped)
	require.NotNil(t, res.Switched)
	require.Equal(t, otherAlias, res.Switched.Replica.Alias)
	require.Equal(t, left, res.Left)
	require.Equal(t, cp(6), res.Checkpoint)
	require.Equal(t, sinktest.Records(testTablet, 1, 6), r.mem.records(testTablet), "every record once, in order")
	reqs, readers := r.src.requests(), r.src.readersOf()
	i := slices.Index(readers, otherAlias)
	require.Positive(t, i)
	require.Equal(t, cp(3), reqs[i].From, "the other replica is read from the committed checkpoint")
	require.NotContains(t, readers[i:], testAlias, "the replica that lost the history was read after the move")

	var moves []Progress
	for _, s := range stream.signalled() {
		if p, ok := s.(Progress); ok && p.Switched != nil {
			moves = append(moves, p)
		}
	}
	require.Len(t, moves, 1, "one progress signal for the move")
	require.Equal(t, otherAlias, moves[0].Replica)
	require.Equal(t, &left[0], moves[0].Left)
	beats := r.spy.heartbeats()
	require.Equal(t, left, beats[len(beats)-1].hb.Left, "a retry does not pick the replica again")
	require.Equal(t, int32(1), busy.Load(), "the move told the worker it is busy")
}

// A mismatch ends the run with RetryElsewhere, as it always did, when the
// run may not move in place (a tablet workflow from before the change) or
// no other replica is eligible: the tablet workflow decides.
func TestGetChangesEndsTheRunOnAMismatchWhenItCannotMoveInPlace(t *testing.T) {
	for _, tt := range []struct {
		name     string
		reroute  *Reroute
		replicas []source.Replica
		left     config.ExcludeList // what an earlier attempt left (its heartbeat)
	}{
		{name: "not asked to", replicas: twoReplicas()},
		{name: "no other replica", reroute: &Reroute{}, replicas: twoReplicas()[:1]},
		// The picker would pick the other one if it did not skip it.
		{name: "the other one left before", replicas: twoReplicas(), reroute: &Reroute{Selection: preferCell("zone2")},
			left: config.ExcludeList{{Alias: otherAlias, Tablet: testTablet, Reason: "POSITION_MISMATCH"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := watchedRig(t, tt.replicas)
			r.src.poll = mismatchPoll(r, testAlias)
			env := r.activityEnv(context.Background())
			if tt.left != nil {
				env.SetHeartbeatDetails(Heartbeat{Left: tt.left})
			}
			in := input()
			in.Reroute = tt.reroute
			_, err := r.run(env, in)
			var app *temporal.ApplicationError
			require.ErrorAs(t, err, &app)
			require.Equal(t, ErrRetryElsewhere, app.Type())
			var d ErrorDetails
			require.NoError(t, app.Details(&d))
			require.Equal(t, testAlias, d.Replica)
			require.Equal(t, cp(3), d.Checkpoint)
			require.NotContains(t, r.src.readersOf(), otherAlias)
		})
	}
}

// Without Reroute (a tablet workflow from before the change) or with no
// other eligible replica, an exclusion ends the run as it always did, and
// the tablet workflow selects.
func TestGetChangesEndsTheRunWhenItCannotMoveInPlace(t *testing.T) {
	for _, tt := range []struct {
		name     string
		reroute  *Reroute
		replicas []source.Replica
	}{
		{name: "not asked to", replicas: twoReplicas()},
		{name: "no other replica", reroute: &Reroute{}, replicas: twoReplicas()[:1]},
		{name: "the other excluded by the tablet", replicas: twoReplicas(),
			reroute: &Reroute{Exclude: config.ExcludeList{{Alias: otherAlias, Tablet: testTablet, Reason: "POSITION_MISMATCH"}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := rerouteRig(t)
			r.src.replicas = tt.replicas
			in := input()
			in.Reroute = tt.reroute
			res, err := r.runWithin(t, in, "the exclusion did not end the run")
			require.NoError(t, err)
			require.Equal(t, "replica excluded: maintenance", res.Stopped)
			require.Nil(t, res.Switched)
			require.Equal(t, cp(3), res.Checkpoint)
			for _, alias := range r.src.readersOf() {
				require.Equal(t, testAlias, alias)
			}
		})
	}
}

// A retry of a run that moved reads the replica it moved to, not the one
// the workflow passed (which the operator excluded).
func TestGetChangesRetryResumesOnTheReplicaItMovedTo(t *testing.T) {
	r := newRig(t)
	r.src.replicas = twoReplicas()
	r.mem.set(testTablet, cp(3))
	r.script(batch(4, 6))
	env := r.activityEnv(context.Background())
	moved := &Selection{Replica: twoReplicas()[1], Candidates: 2}
	env.SetHeartbeatDetails(Heartbeat{Checkpoint: cp(3), Records: 3, Batches: 1, Switched: moved})
	in := input()
	in.Reroute = &Reroute{}
	res, err := r.run(env, in)
	require.NoError(t, err)
	require.Equal(t, []string{otherAlias, otherAlias}, r.src.readersOf())
	require.Equal(t, moved, res.Switched, "the result still says where the run reads")
	require.Equal(t, cp(6), res.Checkpoint)
}

// listingSource is a fakeSource whose topology lists tablets.
type listingSource struct {
	*fakeSource
	tablets []source.Tablet
}

func (s *listingSource) ListTablets(context.Context) ([]source.Tablet, error) { return s.tablets, nil }

// A new stream's first topology read picks each tablet's first replica
// as the tablet picker would (the operator's exclusions skipped), for
// tablets whose log goes on, up to Max; a tablet with no eligible replica
// gets none (it selects and says why itself).
func TestReadTopologyAndPickPicksEachTabletsFirstReplica(t *testing.T) {
	rep := func(tablet, alias, cell string) source.Replica {
		return source.Replica{Tablet: tablet, Alias: alias, Cell: cell, Type: source.TypeReplica, Serving: true, Healthy: true}
	}
	src := &listingSource{fakeSource: &fakeSource{log: &callLog{}}, tablets: []source.Tablet{
		{ID: "t-0001", Replicas: []source.Replica{rep("t-0001", "zone1-101", "zone1"), rep("t-0001", "zone2-201", "zone2")}},
		{ID: "t-0002", Replicas: []source.Replica{rep("t-0002", "zone1-102", "zone1")}},
		{ID: "t-0003", Split: true, Children: []string{"t-0004"}, Replicas: []source.Replica{rep("t-0003", "zone1-103", "zone1")}},
		{ID: "t-0004", Parent: "t-0003", Replicas: []source.Replica{rep("t-0004", "zone1-104", "zone1")}},
		{ID: "t-0005", Replicas: []source.Replica{rep("t-0005", "zone1-105", "zone1")}},
	}}
	a := &Activities{Resources: &Resources{NewSource: func(config.Source) (source.Source, error) { return src, nil }}}
	in := PickInput{Stream: testStream, Selection: config.Selection{Cells: []string{"zone1", "zone2"}, TabletTypes: []string{"REPLICA"}},
		Operator: config.ExcludeList{{Alias: "zone1-101", Reason: "maintenance"}, {Alias: "zone1-102", Reason: "maintenance"}}, Max: 3}
	topo, err := a.ReadTopologyAndPick(context.Background(), in)
	require.NoError(t, err)
	require.Len(t, topo.Tablets, 5, "the whole topology, as ReadTopology reads it")
	require.Equal(t, TopologyOf(src.tablets).Aliases, topo.Aliases)
	// t-0001: its preferred cell's replica is excluded, so the other one,
	// as a fallback; t-0002: nothing eligible; t-0003: split; then t-0004
	// and t-0005 until Max (3 asked; t-0002 got none, so two more).
	require.Equal(t, []string{"t-0001", "t-0004", "t-0005"}, slices.Sorted(maps.Keys(topo.Picks)))
	require.Equal(t, "zone2-201", topo.Picks["t-0001"].Replica.Alias)
	require.True(t, topo.Picks["t-0001"].Fallback)
	require.Equal(t, 1, topo.Picks["t-0001"].Candidates)
	require.Equal(t, "zone1-104", topo.Picks["t-0004"].Replica.Alias)

	in.Max = 1
	topo, err = a.ReadTopologyAndPick(context.Background(), in)
	require.NoError(t, err)
	require.Len(t, topo.Picks, 1)
}
