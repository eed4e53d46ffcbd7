package vitess

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"

	"github.com/tabletflow/tabletflow/source"
)

// linger: once a read has records, how long it waits in all for more
// already on their way before it returns.
const linger = 20 * time.Millisecond

// silence: a stream that brought nothing, not even a heartbeat, for this
// long is taken for lost (a vttablet sends a heartbeat about every second
// while it has nothing else to send), so that a vttablet that hangs is
// retried and left like one that is down (a variable for tests).
var silence = 10 * time.Second

// copySilence is silence during a snapshot's copy: between two tables the
// vttablet reads the changes since the last table's snapshot up to about
// a second ago (its catchup) and sends only those of the tables copied,
// without heartbeats, which under a heavy write load on the others takes
// a while.
var copySilence = time.Minute

// copyStart names a copy's start (a VStream from no position) in errors.
const copyStart = "the start of a copy"

// events is how many VStream responses (each up to a packet of about
// 250 KB) wait between the stream and the reader.
const events = 16

// Reader reads one shard from one vttablet with that tablet's own
// VStream. It keeps the stream between GetChanges calls that go on where
// the last one ended, and opens a new one at the requested checkpoint
// otherwise. It is not safe for concurrent use; Close ends the stream.
type Reader struct {
	src *Source
	rep source.Replica

	vs  *vstream
	dec *decoder
	// pos: everything up to it was returned by GetChanges (the checkpoint
	// the next call goes on from).
	pos source.Checkpoint
	// copy is the copy the reader has open, or the last it finished
	// (copyreport.go); copyTables the tables it takes, in its order.
	copy       *source.CopyProgress
	copyTables []string
}

var _ source.ReplicaReader = (*Reader)(nil)

// vstream is an open VStream and the goroutine receiving it.
type vstream struct {
	cancel context.CancelFunc
	events chan []*binlogdatapb.VEvent
	done   chan struct{}
	err    error // why it ended; read once done is closed
	tablet source.Replica
	from   string
	// heard is when the reader last received a response (or opened it).
	heard time.Time
}

// GetChanges returns whole transactions after req.From, up to MaxRecords
// records (one transaction larger than that comes whole), waiting up to
// MaxWait for the first. With nothing to return it may still advance the
// checkpoint, to the position of a transaction that delivered no records
// or of a DDL. A zero From starts the shard at the vttablet's current
// position, which the first read returns at once.
func (r *Reader) GetChanges(ctx context.Context, req source.ChangesRequest) (source.Batch, error) {
	if req.Tablet != r.rep.Tablet {
		return source.Batch{}, fmt.Errorf("%w: reader of shard %s asked for %q", source.ErrUnknownTablet, r.rep.Tablet, req.Tablet)
	}
	if r.vs == nil || (!req.From.IsZero() && req.From != r.pos) {
		r.Close()
		if err := r.open(ctx, req.From, req.StartFrom); err != nil {
			return source.Batch{}, err
		}
	}
	pollCtx, cancelPoll := context.WithTimeout(ctx, req.MaxWait)
	defer cancelPoll()
	wait := pollCtx.Done()
	var lingerEnds <-chan time.Time
	for {
		n := r.dec.records()
		if n >= req.MaxRecords || r.pos.IsZero() && r.dec.idle.Compare(r.pos) > 0 || r.dec.ended {
			break // enough, a new stream's start (returned at once), or the shard's end
		}
		if n > 0 && lingerEnds == nil {
			t := time.NewTimer(linger)
			defer t.Stop()
			lingerEnds = t.C
		}
		var timedOut bool
		select {
		case evs, ok := <-r.vs.events:
			if !ok {
				<-r.vs.done
				err := r.failed(ctx, r.vs)
				r.Close()
				return source.Batch{}, err
			}
			r.vs.heard = time.Now()
			if err := r.dec.add(evs); err != nil {
				r.Close()
				return source.Batch{}, fmt.Errorf("shard %s from %s: %w", r.rep.Tablet, r.rep.Alias, err)
			}
		case <-lingerEnds:
			timedOut = true
		case <-wait:
			timedOut = true
		}
		if ctx.Err() != nil {
			return source.Batch{}, ctx.Err() // nothing taken: a later read returns it
		}
		if timedOut {
			break
		}
	}
	if end := r.dec.end; end != nil && len(r.dec.ready) == 0 {
		// Every transaction before the journal was returned: the shard
		// ends here.
		r.Close()
		return source.Batch{}, end
	}
	limit := silence
	if r.dec.copy != nil {
		limit = copySilence
	}
	if quiet := time.Since(r.vs.heard); quiet > limit && !r.dec.ended {
		vs := r.vs
		r.Close()
		return source.Batch{}, status.Errorf(codes.Unavailable, "vstream of shard %s from %s at %s: nothing received for %s, not even a heartbeat",
			vs.tablet.Tablet, vs.tablet.Alias, vs.from, quiet.Round(time.Second))
	}
	recs, cp := r.dec.take(req.MaxRecords, r.pos)
	r.pos = cp
	for i := range recs {
		if recs[i].CommitTime.IsZero() { // a marker after a copy's rows, which have no time
			recs[i].CommitTime = time.Now().UTC()
		}
	}
	r.report(recs, cp)
	// Caught up: nothing more received, and the last transaction was not
	// part of a backlog (the vttablet sends each transaction as its own
	// response, so a backlog often has nothing more received yet).
	caughtUp := len(r.dec.ready) == 0 && len(recs) < req.MaxRecords && !r.dec.behind
	return source.Batch{Records: recs, Checkpoint: cp, CaughtUp: caughtUp}, nil
}

// open starts a VStream on the vttablet at from, of the stream's tables:
// a zero from is the shard's start (startFrom "snapshot": a copy of the
// tables, then their changes; otherwise "current", its position now); a
// checkpoint taken during a copy goes on with it (see copy.go); a
// hand-off starts a new shard of a Reshard at its own position. The
// tablet's type is taken from the latest listing: a tablet answers only a
// target of its type now.
func (r *Reader) open(ctx context.Context, from source.Checkpoint, startFrom source.StartFrom) error {
	rep := r.src.current(ctx, r.rep)
	if rep.Address == "" {
		return status.Errorf(codes.Unavailable, "vttablet %s of shard %s: %v", rep.Alias, rep.Tablet, errNoAddress)
	}
	req := &binlogdatapb.VStreamRequest{Position: "current"}
	var state *copyState
	var tables []string // those a copy takes
	pos, handoff, err := handoffPosition(from, rep.Tablet)
	switch {
	case err != nil:
		return err
	case handoff:
		req.Position = pos
	case from.IsZero() && startFrom == source.StartSnapshot:
		req.Position, state = "", &copyState{}
	case !from.IsZero():
		if pos, state, err = positionOf(from); err != nil {
			return err
		}
		req.Position = pos
		if state != nil {
			if tables, err = r.src.resumeCopy(ctx, rep, state, req); err != nil {
				return err
			}
		}
	}
	vs, err := r.src.vstream(rep, req)
	if err != nil {
		return err
	}
	if state != nil && req.Position == "" {
		// A fresh copy takes every table: named for its report only.
		tables, _ = r.src.copyTables(ctx, rep)
	}
	r.vs, r.pos = vs, from
	r.dec = newDecoder(rep.Tablet, from)
	r.dec.keyspace, r.dec.streamed, r.dec.gtid = r.src.cfg.Keyspace, r.src.cfg.Tables, pos
	copying := req.Position == "" || len(req.TableLastPKs) > 0
	if state != nil && copying {
		r.dec.copy = state
		r.opened(state, tables)
	}
	if state != nil {
		if err := r.dec.resumed(state, copying, time.Now().UTC()); err != nil {
			r.Close()
			return err
		}
	}
	return nil
}

// resumeCopy makes req go on with a copy from where state says it
// stands: the table in progress after its last primary key, then every
// later one (VStreamOptions.TablesToCopy), after the changes since the
// position. With nothing left to copy, req streams from the position.
// It returns the tables the copy takes.
func (s *Source) resumeCopy(ctx context.Context, rep source.Replica, state *copyState, req *binlogdatapb.VStreamRequest) ([]string, error) {
	tables, err := s.copyTables(ctx, rep)
	if err != nil {
		return nil, err
	}
	left := state.toCopy(tables)
	if len(left) == 0 {
		return tables, nil
	}
	first := &binlogdatapb.TableLastPK{TableName: left[0]}
	if state.table == left[0] {
		first.Lastpk = state.after
	}
	req.TableLastPKs = []*binlogdatapb.TableLastPK{first}
	req.Options = &binlogdatapb.VStreamOptions{TablesToCopy: left}
	return tables, nil
}

// copyTables are the tables a copy takes: the stream's, or, when it names
// none, the keyspace's on rep's vttablet.
func (s *Source) copyTables(ctx context.Context, rep source.Replica) ([]string, error) {
	if len(s.cfg.Tables) > 0 {
		return s.cfg.Tables, nil
	}
	return s.tablesOf(ctx, rep)
}

// vstream opens a VStream on a vttablet, its target set here and its
// filter the stream's tables, and starts receiving it.
func (s *Source) vstream(rep source.Replica, req *binlogdatapb.VStreamRequest) (*vstream, error) {
	q, err := s.query(rep.Address)
	if err != nil {
		return nil, err
	}
	req.Target = &querypb.Target{Keyspace: s.cfg.Keyspace, Shard: rep.Tablet, TabletType: vitessType(rep.Type)}
	req.Filter = filter(s.cfg.Tables)
	pos := req.Position
	if pos == "" {
		pos = copyStart
	}
	sctx, cancel := context.WithCancel(context.Background())
	stream, err := q.VStream(sctx, req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("vstream of shard %s from %s at %s: %w", rep.Tablet, rep.Alias, pos, err)
	}
	vs := &vstream{cancel: cancel, events: make(chan []*binlogdatapb.VEvent, events), done: make(chan struct{}), tablet: rep, from: pos, heard: time.Now()}
	go func() {
		defer close(vs.done)
		defer close(vs.events)
		for {
			resp, err := stream.Recv()
			if err != nil {
				vs.err = err
				return
			}
			select {
			case vs.events <- resp.GetEvents():
			case <-sctx.Done():
				vs.err = sctx.Err()
				return
			}
		}
	}()
	return vs, nil
}

// close ends the stream and waits for its goroutine.
func (vs *vstream) close() {
	vs.cancel()
	// Drained, so that the goroutine, blocked on a full channel, ends.
	for range vs.events {
	}
	<-vs.done
}

// failed is the error a stream ended with, as the reader returns it: a
// vttablet that purged the binary logs holding the position (which reads
// elsewhere) is Expired when no other vttablet of the shard has them
// either.
func (r *Reader) failed(ctx context.Context, vs *vstream) error {
	err := fmt.Errorf("vstream of shard %s from %s at %s: %w", vs.tablet.Tablet, vs.tablet.Alias, vs.from, vs.err)
	if Classify(vs.err).Reason != "BINLOG_PURGED" || vs.from == "current" || vs.from == copyStart {
		return err
	}
	if gone, why := r.src.historyGone(ctx, vs.tablet, vs.from); gone {
		return newError(source.Expired, "HISTORY_GONE", "no vttablet of shard %s holds position %s any more: %s (%v)",
			vs.tablet.Tablet, vs.from, why, vs.err)
	}
	return err
}

// Ack has nothing to tell: Vitess keeps no position for a stream.
func (r *Reader) Ack(context.Context, string, string, source.Checkpoint) error { return nil }

// Close ends the stream.
func (r *Reader) Close() error {
	if r.vs != nil {
		r.vs.close()
		r.vs = nil
	}
	r.dec = nil
	return nil
}

// filter selects the stream's tables, every column (no tables: every
// table of the keyspace). A rule whose match is a regular expression
// (between slashes) with no filter of its own passes whole rows.
func filter(tables []string) *binlogdatapb.Filter {
	match := "/.*/"
	if len(tables) > 0 {
		quoted := make([]string, len(tables))
		for i, t := range tables {
			quoted[i] = regexp.QuoteMeta(t)
		}
		match = "/^(" + strings.Join(quoted, "|") + ")$/"
	}
	return &binlogdatapb.Filter{Rules: []*binlogdatapb.Rule{{Match: match}}}
}
