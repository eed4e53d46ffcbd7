package vitessbed_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/testbed"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// bedProcs are the processes whose command line names the bed's directory
// (every server's pid file, data directory or my.cnf is there), by pgrep.
func bedProcs(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command("pgrep", "-a", "-f", dir+"/").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 1 { // no process matched
			return nil
		}
		t.Fatalf("pgrep: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// diffRows names the first differing keys of two tables' rows.
func diffRows(want, got vitessbed.Rows) string {
	var out []string
	for k, row := range want {
		if other, ok := got[k]; !ok {
			out = append(out, "missing "+k)
		} else if !reflect.DeepEqual(row, other) {
			out = append(out, fmt.Sprintf("%s: want %v, got %v", k, row, other))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			out = append(out, "extra "+k)
		}
	}
	slices.Sort(out)
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("… %d more", len(out)-5))
	}
	return strings.Join(out, "\n")
}

func requireSameRows(t *testing.T, want, got map[string]vitessbed.Rows, what string) {
	t.Helper()
	for _, table := range vitessbed.Tables {
		if d := diffRows(want[table], got[table]); d != "" {
			t.Fatalf("%s: %s differs (%d rows wanted, %d seen):\n%s", what, table, len(want[table]), len(got[table]), d)
		}
	}
}

// customerOn returns a customer id from first on that the hash vindex puts
// on shard.
func customerOn(shard string, first int64) int64 {
	for id := first; ; id++ {
		if vitessbed.ShardOf(id) == shard {
			return id
		}
	}
}

// TestTheBed starts one bed and checks, in order, what the vitess source's
// tests rely on; the last step stops it and finds no process left.
func TestTheBed(t *testing.T) {
	begin := time.Now()
	c := vitessbed.StartT(t, vitessbed.Options{})
	startTook := time.Since(begin)
	t.Logf("the bed came up in %.1fs", startTook.Seconds())

	t.Run("it comes up within four minutes with every process running", func(t *testing.T) {
		require.Less(t, startTook, 4*time.Minute)
		var rss float64
		for _, pid := range c.Pids() {
			r, _, err := testbed.Memory(pid)
			require.NoError(t, err, "pid %d", pid)
			rss += r
		}
		t.Logf("%d processes, %.0f MiB resident in all", len(c.Pids()), rss)
		// etcd, vtctld, vtgate, and per tablet a vttablet and a mariadbd.
		require.GreaterOrEqual(t, len(c.Pids()), 3+2*len(c.Tablets()))
	})

	t.Run("every tablet serves with the type the bed gave it", func(t *testing.T) {
		ctx := ctxFor(t, 30*time.Second)
		a := c.Addresses()
		require.Len(t, a.Tablets, len(vitessbed.Shards)*len(vitessbed.Cells))
		out, err := c.Vtctldclient(ctx, "GetTablets", "--keyspace", vitessbed.Keyspace)
		require.NoError(t, err)
		for _, ta := range a.Tablets {
			require.Equal(t, ta.Cell, strings.SplitN(ta.Alias, "-", 2)[0])
			wantType := ta.Type
			if ta.Cell == vitessbed.PrimaryCell {
				require.Equal(t, "PRIMARY", wantType, ta.Alias)
			} else {
				require.Equal(t, "REPLICA", wantType, ta.Alias)
			}
			v, err := c.Tablet(ta.Alias).Vars(ctx)
			require.NoError(t, err)
			require.Equal(t, "SERVING", v.TabletStateName, ta.Alias)
			require.True(t, strings.EqualFold(wantType, v.TabletType), "%s reports %s, want %s", ta.Alias, v.TabletType, wantType)
			// The topology says the same, with the gRPC address the bed gave.
			line := lineWith(out, ta.Alias)
			require.NotEmpty(t, line, "GetTablets lists no %s:\n%s", ta.Alias, out)
			require.Contains(t, line, " "+vitessbed.Keyspace+" "+ta.Shard+" "+strings.ToLower(wantType)+" ", line)
		}
	})

	t.Run("a row written through vtgate reaches every replica of its shard only", func(t *testing.T) {
		ctx := ctxFor(t, 60*time.Second)
		for i, shard := range vitessbed.Shards {
			id := customerOn(shard, 1_000_000+int64(i)*1000)
			_, err := c.Exec(ctx, "INSERT INTO customer (customer_id, email) VALUES (?, ?)", id, fmt.Sprintf("row-%d@example.com", id))
			require.NoError(t, err)
			want := map[string]any{"customer_id": id, "email": fmt.Sprintf("row-%d@example.com", id)}
			key := fmt.Sprint(id)
			for _, tab := range c.Tablets() {
				if tab.Type == "REPLICA" && tab.Shard == shard {
					require.NoError(t, tab.WaitCaughtUp(ctx))
				}
			}
			for _, tab := range c.Tablets() {
				rows, err := tab.Rows(ctx)
				require.NoError(t, err)
				if tab.Shard == shard {
					require.Equal(t, want, rows["customer"][key], "%s (shard %s)", tab.Alias, tab.Shard)
				} else {
					require.NotContains(t, rows["customer"], key, "%s holds a row of shard %s", tab.Alias, shard)
				}
			}
			rows, err := c.ShardRows(ctx, shard)
			require.NoError(t, err)
			require.Equal(t, want, rows["customer"][key])
		}
	})

	t.Run("a replica whose replication is stopped falls behind and catches up when started", func(t *testing.T) {
		ctx := ctxFor(t, 60*time.Second)
		shard := vitessbed.Shards[1]
		lagging, other := c.Replicas(shard)[0], c.Replicas(shard)[1]
		require.NoError(t, lagging.StopReplication(ctx))
		st, err := lagging.Replication(ctx)
		require.NoError(t, err)
		require.False(t, st.IORunning || st.SQLRunning, "replication still running after STOP SLAVE: %+v", st)
		before, err := lagging.Position(ctx)
		require.NoError(t, err)

		id := customerOn(shard, 2_000_000)
		_, err = c.Exec(ctx, "INSERT INTO customer (customer_id, email) VALUES (?, 'behind@example.com')", id)
		require.NoError(t, err)
		// The shard's other replica has it, so it was replicated; the
		// stopped one has not.
		require.NoError(t, other.WaitCaughtUp(ctx))
		primaryPos, err := c.Primary(shard).Position(ctx)
		require.NoError(t, err)
		otherPos, err := other.Position(ctx)
		require.NoError(t, err)
		require.Equal(t, primaryPos, otherPos)
		laggingPos, err := lagging.Position(ctx)
		require.NoError(t, err)
		require.Equal(t, before, laggingPos, "the stopped replica moved")
		require.NotEqual(t, primaryPos, laggingPos)
		rows, err := lagging.Rows(ctx)
		require.NoError(t, err)
		require.NotContains(t, rows["customer"], fmt.Sprint(id))

		require.NoError(t, lagging.StartReplication(ctx))
		require.NoError(t, lagging.WaitCaughtUp(ctx))
		laggingPos, err = lagging.Position(ctx)
		require.NoError(t, err)
		require.Equal(t, primaryPos, laggingPos)
		rows, err = lagging.Rows(ctx)
		require.NoError(t, err)
		require.Contains(t, rows["customer"], fmt.Sprint(id))
	})

	t.Run("a killed vttablet is gone and serves again after a restart", func(t *testing.T) {
		ctx := ctxFor(t, 90*time.Second)
		tab := c.Replicas(vitessbed.Shards[0])[1]
		pid := tab.Pid()
		require.NotZero(t, pid)
		tab.Kill()
		require.False(t, tab.Running())
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "vttablet pid %d still exists", pid)
		_, err := tab.Vars(ctx)
		require.Error(t, err, "the killed vttablet still answers")
		require.NoError(t, tab.Restart(ctx))
		v, err := tab.Vars(ctx)
		require.NoError(t, err)
		require.Equal(t, "SERVING", v.TabletStateName)
		require.True(t, strings.EqualFold("replica", v.TabletType), v.TabletType)
		require.NotEqual(t, pid, tab.Pid())
	})

	t.Run("purged binary logs begin past the position given", func(t *testing.T) {
		ctx := ctxFor(t, 60*time.Second)
		shard := vitessbed.Shards[0]
		r := c.Replicas(shard)[0]
		require.NoError(t, r.WaitCaughtUp(ctx))
		pos, err := r.Position(ctx)
		require.NoError(t, err)
		// Nothing after pos yet: the logs cannot begin past it.
		_, err = r.PurgeBinlogs(ctx, pos)
		require.ErrorContains(t, err, "not past")

		_, err = c.Exec(ctx, "INSERT INTO customer (customer_id, email) VALUES (?, 'purge@example.com')", customerOn(shard, 3_000_000))
		require.NoError(t, err)
		require.NoError(t, r.WaitCaughtUp(ctx))
		begins, err := r.PurgeBinlogs(ctx, pos)
		require.NoError(t, err)
		now, err := r.Position(ctx)
		require.NoError(t, err)
		t.Logf("%s: position %s, binary logs now begin at %s (head %s)", r.Alias, pos, begins, now)
		require.NotEqual(t, pos, begins)
	})

	t.Run("the workload writes every kind of change and the replicas converge", func(t *testing.T) {
		ctx := ctxFor(t, 3*time.Minute)
		w := c.StartWorkload(vitessbed.WorkloadOptions{Count: 300, Seed: 7, FirstID: 10_000_000})
		require.NoError(t, w.Wait())
		s := w.Stats()
		t.Logf("workload: %+v", s)
		require.Equal(t, 300, s.Txs)
		require.Positive(t, s.Inserts)
		require.Positive(t, s.Updates)
		require.Positive(t, s.KeyUpdates)
		require.Positive(t, s.Deletes)
		require.Positive(t, s.MultiRowTxs)
		require.Zero(t, s.Errors)

		total := map[string]int{}
		for _, shard := range vitessbed.Shards {
			want, err := c.ShardRows(ctx, shard)
			require.NoError(t, err)
			for _, table := range vitessbed.Tables {
				total[table] += len(want[table])
			}
			for _, r := range c.Replicas(shard) {
				require.NoError(t, r.WaitCaughtUp(ctx))
				got, err := r.Rows(ctx)
				require.NoError(t, err)
				requireSameRows(t, want, got, r.Alias)
			}
		}
		// The shards together are the keyspace as vtgate reads it whole.
		for _, table := range vitessbed.Tables {
			var n int
			require.NoError(t, queryRow(ctx, c, "SELECT COUNT(*) FROM "+table, &n))
			require.Equal(t, n, total[table], table)
		}
	})

	t.Run("stop leaves no process behind", func(t *testing.T) {
		procs := bedProcs(t, c.Dir)
		// pgrep sees the bed while it runs: etcd, vtctld, vtgate, per tablet
		// a vttablet, mysqld_safe and mariadbd.
		require.GreaterOrEqual(t, len(procs), 3+3*len(c.Tablets()), "pgrep sees too few of the bed's processes:\n%s", strings.Join(procs, "\n"))
		pids := c.Pids()
		require.NoError(t, c.Stop())
		require.Empty(t, bedProcs(t, c.Dir))
		for _, pid := range pids {
			require.False(t, alive(pid), "pid %d still runs", pid)
		}
	})
}

// alive reports whether pid is a process that has not ended: MariaDB's
// processes are not ours to reap (mysqlctl, their parent, has exited), so
// one that ended may stay a zombie until init reaps it.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z"
}

func queryRow(ctx context.Context, c *vitessbed.Cluster, query string, dest ...any) error {
	db, err := c.DB()
	if err != nil {
		return err
	}
	return db.QueryRowContext(ctx, query).Scan(dest...)
}

// lineWith is the line of out that names alias, or "".
func lineWith(out, alias string) string {
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, alias+" ") {
			return line + " "
		}
	}
	return ""
}
