package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// objects lists a node's logical slots and (on a primary) publications.
func objects(t *testing.T, ctx context.Context, n *pgbed.Node) (slots, pubs []string) {
	t.Helper()
	rows, err := n.Query(ctx, `SELECT slot_name::text AS name FROM pg_replication_slots WHERE slot_type = 'logical' ORDER BY 1`)
	require.NoError(t, err)
	for _, r := range rows {
		slots = append(slots, r["name"].(string))
	}
	rows, err = n.Query(ctx, `SELECT pubname::text AS name FROM pg_publication ORDER BY 1`)
	require.NoError(t, err)
	for _, r := range rows {
		pubs = append(pubs, r["name"].(string))
	}
	return slots, pubs
}

// Stream IDs that differ only in case or in characters other than a-z,
// 0-9 and _ are distinct streams: each has its own slots and publication,
// reads every change itself, and deleting one leaves the others whole.
func TestDistinctStreamsNeverShareASlotOrAPublication(t *testing.T) {
	ids := []string{"orders-eu", "orders_eu", "Orders_EU"}
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 3*time.Minute)
	p := b.c.Shards[0].Primary
	starts := map[string]source.Checkpoint{}
	for _, id := range ids {
		st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: id, Tables: pgbed.Tables})
		require.NoError(t, err)
		starts[id] = st.Start["s1"]
	}
	for _, n := range b.c.Shards[0].Nodes() {
		slots, _ := objects(t, ctx, n)
		require.Len(t, slots, len(ids), "%s: a slot per stream: %v", n.Name, slots)
	}
	_, pubs := objects(t, ctx, p)
	require.Len(t, pubs, len(ids), "a publication per stream: %v", pubs)

	// Each stream reads the change from its own slot, one after the
	// other, each acknowledging what it read.
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (1, 1, 'a', 1, 'one')`))
	require.NoError(t, b.c.WaitReplayed(ctx))
	cps := map[string]source.Checkpoint{}
	for _, id := range ids {
		recs, cp := read(t, b.reader(t, b.cfg.Shards[0].Replicas[1].Alias), id, starts[id], 1)
		require.Len(t, recs, 1, id)
		cps[id] = cp
	}

	// Deleting one stream drops its objects only: the others read on.
	require.NoError(t, b.src.DeleteStream(ctx, ids[0]))
	for _, n := range b.c.Shards[0].Nodes() {
		slots, _ := objects(t, ctx, n)
		require.Equal(t, []string{postgres.SlotName(ids[1], "s1"), postgres.SlotName(ids[2], "s1")}, sorted(slots), n.Name)
	}
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (2, 1, 'b', 1, 'two')`))
	require.NoError(t, b.c.WaitReplayed(ctx))
	for _, id := range ids[1:] {
		recs, _ := read(t, b.primaryReader(t), id, cps[id], 1)
		require.Len(t, recs, 1, id)
	}
	for i, a := range ids {
		for _, b := range ids[i+1:] {
			require.NotEqual(t, postgres.PublicationName(a), postgres.PublicationName(b))
			require.NotEqual(t, postgres.SlotName(a, "s1"), postgres.SlotName(b, "s1"))
		}
	}
	// The shard's part of a slot's name does not mix with the stream's.
	require.NotEqual(t, postgres.SlotName("a_b", "c"), postgres.SlotName("a", "b_c"))
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// legacyStream makes, on shard s1, a stream as the version before names
// were hashed made it: the publication tabletflow_<id> (the ID lower-cased,
// other characters than a-z, 0-9 and _ as _), owned by the adapter's role,
// a slot tf_<id>_s1 on every replica, and the stream's record (its start,
// the latest slot's, and timeline) as the publication's comment.
func legacyStream(t *testing.T, ctx context.Context, b *bed, folded string) (pub, slot string, start source.Checkpoint) {
	t.Helper()
	p := b.c.Shards[0].Primary
	pub, slot = "tabletflow_"+folded, "tf_"+folded+"_s1"
	require.NoError(t, p.Exec(ctx, `CREATE PUBLICATION `+pub+` FOR TABLE public.orders, public.items WITH (publish = 'insert, update, delete, truncate');
		ALTER PUBLICATION `+pub+` OWNER TO `+pgbed.User))
	var at pglogrepl.LSN
	for _, n := range b.c.Shards[0].Nodes() {
		text, err := n.CreateLogicalSlot(ctx, slot, "pgoutput")
		require.NoError(t, err)
		lsn, err := pglogrepl.ParseLSN(text)
		require.NoError(t, err)
		at = max(at, lsn)
	}
	meta, err := json.Marshal(map[string]any{"start": uint64(at), "timeline": 1, "created": time.Now().UTC().Truncate(time.Second)})
	require.NoError(t, err)
	require.NoError(t, p.Exec(ctx, fmt.Sprintf(`COMMENT ON PUBLICATION %s IS '%s'`, pub, meta)))
	require.NoError(t, b.c.WaitReplayed(ctx))
	return pub, slot, source.Checkpoint{Term: uint64(at)}
}

// oldWorker reads a slot as a worker of the version before tags did: a
// replication session named tabletflow/<stream>/<shard>, streaming from
// the slot. It holds the slot until the test ends or close is called.
func oldWorker(t *testing.T, ctx context.Context, n *pgbed.Node, stream, slot, pub string) (close func()) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(n.ReplicationDSN())
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = "tabletflow/" + stream + "/s1"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"}}))
	var once sync.Once
	close = func() { once.Do(func() { _ = conn.Close(context.Background()) }) }
	t.Cleanup(close)
	return close
}

// A stream made before names were hashed keeps its names after the
// upgrade: ensuring it again returns its start and makes nothing, its
// readers read its slots (from a standby and from the primary), and its
// record then names it exactly. A new stream whose ID folds to the same
// old name (pg_orders beside pg-orders) gets names of its own and never
// touches it: made while a worker of the version before still reads the
// old stream, or after. Deleting each drops its own objects only; the
// old stream's publication stays until its slots are all dropped (a
// standby down), so that the next delete still knows them.
func TestAStreamMadeBeforeNamesWereHashedKeepsThemAndNoOtherStreamTakesThem(t *testing.T) {
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 3*time.Minute)
	p, sb := b.c.Shards[0].Primary, b.c.Shards[0].Standbys[0]
	const old, other, later = "pg-orders", "pg_orders", "PG-Orders"
	pub, slot, start := legacyStream(t, ctx, b, "pg_orders")

	// A worker of the version before reads the old stream on the standby
	// while this version makes pg_orders; it dies without closing its
	// session, which this version's reader of the old stream ends.
	oldWorker(t, ctx, sb, old, slot, pub)
	ost, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: other, Tables: pgbed.Tables})
	require.NoError(t, err)
	for _, n := range b.c.Shards[0].Nodes() {
		slots, _ := objects(t, ctx, n)
		require.Equal(t, sorted([]string{slot, postgres.SlotName(other, "s1")}), sorted(slots), "%s: the new stream has a slot of its own", n.Name)
	}

	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: old, Tables: pgbed.Tables})
	require.NoError(t, err)
	require.Equal(t, start, st.Start["s1"], "the old stream's recorded start")
	for _, n := range b.c.Shards[0].Nodes() {
		slots, _ := objects(t, ctx, n)
		require.Len(t, slots, 2, "%s: nothing made for the old stream", n.Name)
	}
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (1, 1, 'a', 1, 'one')`))
	require.NoError(t, b.c.WaitReplayed(ctx))
	onStandby := b.reader(t, b.cfg.Shards[0].Replicas[1].Alias)
	first, cp := read(t, onStandby, old, start, 1)
	require.Len(t, first, 1, "read from the standby's old slot, the old worker's session ended")
	require.NoError(t, onStandby.Close())
	var comment string
	require.NoError(t, p.QueryRow(ctx, `SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1`, pub).Scan(&comment))
	var rec struct {
		Stream string `json:"stream"`
	}
	require.NoError(t, json.Unmarshal([]byte(comment), &rec), comment)
	require.Equal(t, old, rec.Stream, "the record names the stream exactly: %s", comment)

	// A stream made after the old one was claimed: names of its own too.
	lst, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: later, Tables: pgbed.Tables})
	require.NoError(t, err)
	require.NoError(t, p.Exec(ctx, `INSERT INTO public.items VALUES (2, 1, 'b', 1, 'two')`))
	require.NoError(t, b.c.WaitReplayed(ctx))
	mine, _ := read(t, b.primaryReader(t), other, ost.Start["s1"], 2)
	require.Len(t, mine, 2, "pg_orders reads both changes from its own slot")
	theirs, _ := read(t, b.primaryReader(t), later, lst.Start["s1"], 1)
	require.Len(t, theirs, 1)
	require.Equal(t, `{"id":2}`, string(theirs[0].Key))
	next, _ := read(t, b.primaryReader(t), old, cp, 1)
	require.Len(t, next, 1, "the old stream reads on from its own slot, which the new ones did not move")
	require.Equal(t, `{"id":2}`, string(next[0].Key))

	for _, id := range []string{other, later} {
		require.NoError(t, b.src.DeleteStream(ctx, id))
	}
	for _, n := range b.c.Shards[0].Nodes() {
		slots, pubs := objects(t, ctx, n)
		require.Equal(t, []string{slot}, slots, "%s: the old stream's slot stays", n.Name)
		require.Equal(t, []string{pub}, pubs, n.Name)
	}
	require.NoError(t, sb.Stop())
	err = b.src.DeleteStream(ctx, old)
	require.Error(t, err, "the standby's slot is left")
	require.Contains(t, err.Error(), "slot "+slot+" on "+b.cfg.Shards[0].Replicas[1].Alias)
	require.Contains(t, err.Error(), "publication "+pub+" on "+b.cfg.Shards[0].Replicas[0].Alias+": kept until")
	slots, pubs := objects(t, ctx, p)
	require.Empty(t, slots)
	require.Equal(t, []string{pub}, pubs, "the old stream's publication is kept")
	require.NoError(t, sb.Start(ctx))
	require.NoError(t, b.src.DeleteStream(ctx, old), "the rest goes once the standby is back")
	for _, n := range b.c.Shards[0].Nodes() {
		slots, pubs := objects(t, ctx, n)
		require.Empty(t, slots, n.Name)
		require.Empty(t, pubs, n.Name)
	}
}
