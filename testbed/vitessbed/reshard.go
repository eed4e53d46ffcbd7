package vitessbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	vtctldatapb "vitess.io/vitess/go/vt/proto/vtctldata"
)

// NewShardCells are the cells of a shard AddShards makes: its primary in
// PrimaryCell and one replica (not one per cell, as the bed's own shards
// have: two new shards are already four more MariaDBs and vttablets).
var NewShardCells = []string{"zone1", "zone2"}

// Reshard is a Reshard workflow of the bed's keyspace, from one shard into
// new ones, made by Cluster.Reshard.
type Reshard struct {
	// Workflow is the workflow's name: "reshard" and the source shard,
	// '-' written '_' ("reshard_80").
	Workflow string
	// From is the source shard; To the target shards, in key order.
	From string
	To   []string

	c *Cluster
}

// Reshard splits the shard from into the new shards to (which must cover
// exactly its key range, as "-80" into "-40", "40-80"): it adds the target
// shards' tablets (AddShards), creates the Reshard workflow with
// vtctldclient (the target primaries copy the source's rows, then follow its
// binary log; each target primary streams from the source shard's tablets
// of its own cell, PrimaryCell: the source's primary) and returns once the
// copy is done and every stream replicates. Reads and writes still go to
// from until SwitchTraffic. Not safe to run concurrently with other calls
// on the cluster that list its tablets.
func (c *Cluster) Reshard(ctx context.Context, from string, to []string) (*Reshard, error) {
	if err := c.AddShards(ctx, to...); err != nil {
		return nil, err
	}
	r := &Reshard{Workflow: "reshard" + strings.ReplaceAll(from, "-", "_"), From: from, To: slices.Clone(to), c: c}
	t0 := time.Now()
	// A new primary opens its VReplication engine a moment after it took
	// office; until then create fails validating the targets, having made
	// nothing.
	err := poll(ctx, 500*time.Millisecond, func() (bool, error) {
		_, err := r.vtctld(ctx, "create", "--source-shards", from, "--target-shards", strings.Join(to, ","))
		if err != nil && !strings.Contains(err.Error(), "vreplication engine is closed") {
			return false, permanent(err)
		}
		return err == nil, err
	})
	if err != nil {
		return nil, err
	}
	if err := r.WaitCopied(ctx); err != nil {
		return nil, err
	}
	c.opts.Log("vitessbed: Reshard %s %s into %s: copied and replicating in %.1fs", r.Workflow, from, strings.Join(to, ","), time.Since(t0).Seconds())
	return r, nil
}

// vtctld runs `vtctldclient Reshard --workflow W --target-keyspace K args…`.
func (r *Reshard) vtctld(ctx context.Context, args ...string) (string, error) {
	out, err := r.c.Vtctldclient(ctx, append([]string{"Reshard", "--workflow", r.Workflow, "--target-keyspace", Keyspace}, args...)...)
	if err != nil {
		return out, fmt.Errorf("vitessbed: Reshard %s %s: %w", r.Workflow, args[0], err)
	}
	return out, nil
}

// Streams are the workflow's VReplication streams as vtctld shows them,
// one per target shard (`Reshard show`).
func (r *Reshard) Streams(ctx context.Context) ([]*vtctldatapb.Workflow_Stream, error) {
	out, err := r.vtctld(ctx, "show", "--include-logs=false")
	if err != nil {
		return nil, err
	}
	var resp vtctldatapb.GetWorkflowsResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(out), &resp); err != nil {
		return nil, fmt.Errorf("vitessbed: Reshard %s show: %w\n%s", r.Workflow, err, out)
	}
	var streams []*vtctldatapb.Workflow_Stream
	for _, w := range resp.GetWorkflows() {
		for _, ss := range w.GetShardStreams() {
			streams = append(streams, ss.GetStreams()...)
		}
	}
	return streams, nil
}

// WaitCopied waits until every target shard's stream has copied the
// source's rows and replicates its changes (state Running, no table left to
// copy). A stream in state Error fails at once, with its message.
func (r *Reshard) WaitCopied(ctx context.Context) error {
	var last []*vtctldatapb.Workflow_Stream
	err := poll(ctx, time.Second, func() (bool, error) {
		streams, err := r.Streams(ctx)
		if err != nil {
			return false, err
		}
		last = streams
		if len(streams) < len(r.To) {
			return false, fmt.Errorf("%d streams, want %d", len(streams), len(r.To))
		}
		for _, s := range streams {
			if s.GetState() == "Error" {
				return false, permanent(fmt.Errorf("stream %d on %s: %s", s.GetId(), s.GetShard(), s.GetMessage()))
			}
			if s.GetState() != "Running" || len(s.GetCopyStates()) > 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		var b strings.Builder
		for _, s := range last {
			fmt.Fprintf(&b, "\n  %s stream %d: %s %q, %d tables to copy, at %s", s.GetShard(), s.GetId(), s.GetState(), s.GetMessage(), len(s.GetCopyStates()), s.GetPosition())
		}
		return fmt.Errorf("vitessbed: Reshard %s: copy: %w%s", r.Workflow, err, b.String())
	}
	return nil
}

// SwitchTraffic switches reads and writes from the source shard to the
// target shards (`Reshard SwitchTraffic`, every tablet type, with the
// reverse workflow Vitess makes so that ReverseTraffic could go back). On
// the way the source shard's primary writes the journal (a row of
// _vt.resharding_journal), which every VStream of the source shard's
// tablets emits as a JOURNAL event. It returns once the target primaries
// serve and a query through vtgate over every shard succeeds: vtgate
// routes the source's key range to the target shards. The source shard's
// tablets stay up, and its primary no longer serves: WaitServing and
// Tablet.Restart, which wait for SERVING, do not apply to it any more.
func (r *Reshard) SwitchTraffic(ctx context.Context) error {
	t0 := time.Now()
	if _, err := r.vtctld(ctx, "SwitchTraffic"); err != nil {
		return err
	}
	for _, shard := range r.To {
		if err := r.c.Primary(shard).waitState(ctx, "primary", "SERVING"); err != nil {
			return fmt.Errorf("vitessbed: Reshard %s: after SwitchTraffic: %w", r.Workflow, err)
		}
	}
	// A query over every shard fails while vtgate still sends the source's
	// range to the source's primary, which no longer serves.
	err := poll(ctx, 200*time.Millisecond, func() (bool, error) {
		db, err := r.c.DB()
		if err != nil {
			return false, permanent(err)
		}
		for _, table := range Tables {
			var n int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n); err != nil {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("vitessbed: Reshard %s: vtgate does not route to %s: %w", r.Workflow, strings.Join(r.To, ","), err)
	}
	r.c.opts.Log("vitessbed: Reshard %s: traffic switched in %.1fs", r.Workflow, time.Since(t0).Seconds())
	return nil
}

// AddShards adds new shards to the keyspace, not serving (each overlaps a
// serving shard, whose key range a Reshard into them then moves): for
// each, vtctldclient CreateShard, then a tablet per cell of NewShardCells
// set up as Start sets up the bed's own (mysqlctl init, vttablet,
// PlannedReparentShard making the PrimaryCell one the primary, the replica
// attached by hand), returning once vtgate's health check serves the new
// primaries. The tables are not made: Reshard copies the schema.
// The new tablets are among Tablets, Addresses and Pids, and Stop ends them.
func (c *Cluster) AddShards(ctx context.Context, shards ...string) error {
	if len(shards) == 0 {
		return errors.New("vitessbed: AddShards: no shard")
	}
	begin := time.Now()
	var tablets []*Tablet
	for _, shard := range shards {
		if _, _, err := keyRange(shard); err != nil {
			return fmt.Errorf("vitessbed: AddShards: %w", err)
		}
		for _, t := range c.tablets {
			if t.Shard == shard {
				return fmt.Errorf("vitessbed: AddShards: shard %s already has tablets", shard)
			}
		}
	}
	ports, err := freePorts(3 * len(shards) * len(NewShardCells))
	if err != nil {
		return err
	}
	base := uint32(0)
	for _, t := range c.tablets {
		base = max(base, t.UID/100*100+100)
	}
	for i, shard := range shards {
		for j, cell := range NewShardCells {
			uid := base + uint32(100*i+j)
			typ := "REPLICA"
			if cell == PrimaryCell {
				typ = "PRIMARY"
			}
			t := &Tablet{c: c, TabletAddress: TabletAddress{
				Alias: fmt.Sprintf("%s-%010d", cell, uid), UID: uid, Cell: cell, Shard: shard, Type: typ,
				GRPC: fmt.Sprintf("127.0.0.1:%d", ports[0]), HTTP: fmt.Sprintf("127.0.0.1:%d", ports[1]), MySQLPort: ports[2],
			}}
			ports = ports[3:]
			t.MySQLSocket = filepath.Join(t.dir(), "mysql.sock")
			tablets = append(tablets, t)
		}
	}
	// Listed before anything starts, so that Stop ends what did on an error.
	c.tablets = append(c.tablets, tablets...)
	steps := []struct {
		name string
		f    func(context.Context) error
	}{
		{"CreateShard", func(ctx context.Context) error {
			for _, shard := range shards {
				if _, err := c.Vtctldclient(ctx, "CreateShard", Keyspace+"/"+shard); err != nil {
					return err
				}
			}
			return nil
		}},
		{"MariaDB of every tablet (mysqlctl init)", func(ctx context.Context) error {
			return each(tablets, 3, func(t *Tablet) error { return t.initMysqld(ctx) })
		}},
		{"vttablets", func(ctx context.Context) error {
			for _, t := range tablets {
				if err := t.startVttablet(); err != nil {
					return err
				}
			}
			return each(tablets, 0, func(t *Tablet) error { return c.waitHTTP(ctx, t.vttablet, "http://"+t.HTTP+"/debug/vars") })
		}},
		{"primaries (PlannedReparentShard)", func(ctx context.Context) error {
			return eachOf(shards, func(shard string) error { return c.promote(ctx, shard) })
		}},
		{"replicas attached by hand", func(ctx context.Context) error {
			return eachOf(shards, func(shard string) error { return c.attach(ctx, shard) })
		}},
		{"vtgate sees the new primaries", func(ctx context.Context) error { return c.waitVtgateSees(ctx, shards) }},
	}
	for _, s := range steps {
		t0 := time.Now()
		if err := s.f(ctx); err != nil {
			return fmt.Errorf("vitessbed: AddShards %s: %s: %w", strings.Join(shards, ","), s.name, err)
		}
		c.opts.Log("vitessbed: AddShards %s: %s: %.1fs", strings.Join(shards, ","), s.name, time.Since(t0).Seconds())
	}
	c.opts.Log("vitessbed: AddShards %s: up in %.1fs", strings.Join(shards, ","), time.Since(begin).Seconds())
	return nil
}

// waitVtgateSees waits until vtgate's health check has each shard's primary
// serving (its /debug/vars HealthcheckConnections counts it). vtgate
// finds new tablets by reading the topology every --tablet-refresh-interval
// (Vitess's default: a minute); until then a shard switched to would have
// no tablet to route to.
func (c *Cluster) waitVtgateSees(ctx context.Context, shards []string) error {
	var seen map[string]int64
	err := poll(ctx, 500*time.Millisecond, func() (bool, error) {
		if !c.vtgate.running() {
			return false, permanent(errors.New("vtgate exited"))
		}
		b, err := httpGet(ctx, "http://"+c.addr.VtgateHTTP+"/debug/vars")
		if err != nil {
			return false, err
		}
		var v struct{ HealthcheckConnections map[string]int64 }
		if err := json.Unmarshal(b, &v); err != nil {
			return false, fmt.Errorf("vtgate /debug/vars: %w", err)
		}
		seen = v.HealthcheckConnections
		for _, shard := range shards {
			n := int64(0)
			for k, v := range seen {
				if strings.EqualFold(k, Keyspace+"."+shard+".primary") {
					n += v
				}
			}
			if n == 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("vtgate: %w (its health check serves %v)", err, seen)
	}
	return nil
}
