package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/sink"
	pgsink "github.com/tabletflow/tabletflow/sink/postgres"
	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

func rec(pos uint64, op source.Op, key, after string) source.Record {
	r := source.Record{Tablet: "t-0001", Position: source.Checkpoint{Term: 1, Index: pos}, Table: "public.orders", Op: op,
		Key: json.RawMessage(key), CommitTime: time.Unix(1, 0)}
	if after != "" {
		r.After = json.RawMessage(after)
	}
	return r
}

// Apply mode: the mirror table holds the source's current rows; a batch
// that does not fit the mirror table fails whole, nothing written.
func TestApplyModeKeepsTheCurrentRowsAndFailsWholeOnAMisfit(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "mirror"}
	s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
	require.NoError(t, err)
	defer s.Close()
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	batch := []source.Record{
		rec(1, source.Insert, `{"id":1}`, `{"id":1,"note":"long","amount":12.50,"tags":["a"]}`),
		rec(2, source.Insert, `{"id":2}`, `{"id":2,"note":"x","amount":1}`),
		rec(3, source.Update, `{"id":1}`, `{"id":1,"amount":13}`), // note unchanged (TOAST): kept
		rec(4, source.Delete, `{"id":2}`, ""),
		rec(5, source.Read, `{"id":3}`, `{"id":3,"note":null,"amount":7,"extra":true}`), // a new column
	}
	require.NoError(t, w.Write(ctx, batch))
	require.NoError(t, w.Commit(ctx, batch[4].Position))
	rows := func() []map[string]any {
		r, err := db.Query(ctx, `SELECT id::text AS id, note::text AS note, amount::text AS amount, extra::text AS extra FROM mirror.public__orders ORDER BY id`)
		require.NoError(t, err)
		return r
	}
	want := []map[string]any{
		{"id": "1", "note": `"long"`, "amount": "13", "extra": nil},
		{"id": "3", "note": nil, "amount": "7", "extra": "true"},
	}
	require.Equal(t, want, rows())

	// Records of the table keyed otherwise: the whole batch fails, the
	// checkpoint and the rows stay.
	bad := []source.Record{
		rec(6, source.Insert, `{"id":4}`, `{"id":4,"amount":1}`),
		rec(7, source.Insert, `{"sku":"x"}`, `{"sku":"x","amount":2}`),
	}
	require.NoError(t, w.Write(ctx, bad))
	err = w.Commit(ctx, bad[1].Position)
	require.ErrorIs(t, err, sink.ErrBadRecord)
	require.ErrorContains(t, err, "keyed by (id)")
	require.Equal(t, want, rows(), "nothing written half-way")
	w2, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	require.Equal(t, batch[4].Position, w2.Checkpoint())

	// A column of another type than jsonb, made by hand: a clear error.
	require.NoError(t, db.Exec(ctx, `CREATE TABLE mirror.public__items (id jsonb PRIMARY KEY, qty integer);
		ALTER TABLE mirror.public__items OWNER TO `+pgbed.User)) // the sink adds its columns
	item := source.Record{Tablet: "t-0001", Position: source.Checkpoint{Term: 1, Index: 9}, Table: "public.items", Op: source.Insert,
		Key: json.RawMessage(`{"id":1}`), After: json.RawMessage(`{"id":1,"qty":2}`), CommitTime: time.Unix(1, 0)}
	require.NoError(t, w2.Write(ctx, []source.Record{rec(8, source.Insert, `{"id":5}`, `{"id":5,"amount":3}`), item}))
	err = w2.Commit(ctx, item.Position)
	require.ErrorIs(t, err, sink.ErrBadRecord, "%v", err)
	require.ErrorContains(t, err, "42804")
	require.ErrorContains(t, err, `insert of public.items at 1.9 into "mirror"."public__items"`, "the error names the record")
	require.Equal(t, want, rows(), "nothing written half-way: not the batch's other record either")
	var items int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM mirror.public__items`).Scan(&items))
	require.Zero(t, items)
	w3, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	require.Equal(t, batch[4].Position, w3.Checkpoint(), "the checkpoint stays")
}

// Mirror tables made by another sink instance (a restarted or second
// worker) are used as they are, keyed as made (a key of two columns
// too); tablets whose first batches make the same table at once all
// commit.
func TestApplyModeSharesMirrorTablesAcrossInstancesAndTablets(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "shared"}
	open := func() sink.Sink {
		s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	two := func(tablet string, pos uint64, a, b int) source.Record {
		return source.Record{Tablet: tablet, Position: source.Checkpoint{Term: 1, Index: pos}, Table: "public.pairs", Op: source.Insert,
			Key:   json.RawMessage(fmt.Sprintf(`{"a":%d,"b":%d}`, a, b)),
			After: json.RawMessage(fmt.Sprintf(`{"a":%d,"b":%d,"v":"x"}`, a, b)), CommitTime: time.Unix(1, 0)}
	}
	// Eight tablets' first batches at once, from two instances.
	s1, s2 := open(), open()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		s := s1
		if i%2 == 1 {
			s = s2
		}
		tablet := fmt.Sprintf("t-%04d", i+1)
		wg.Go(func() {
			w, err := s.Open(ctx, tablet)
			if err == nil {
				err = w.Write(ctx, []source.Record{two(tablet, 1, i, 1)})
			}
			if err == nil {
				err = w.Commit(ctx, source.Checkpoint{Term: 1, Index: 1})
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// A third instance, as a restarted worker, writes to the same table.
	s3 := open()
	w, err := s3.Open(ctx, "t-0001")
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, []source.Record{two("t-0001", 2, 100, 2)}))
	require.NoError(t, w.Commit(ctx, source.Checkpoint{Term: 1, Index: 2}), "a table made by another instance keeps its two-column key")
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM shared.public__pairs`).Scan(&n))
	require.Equal(t, 9, n)
}

// Instances that make the same new mirror tables at the same moment all
// commit: PostgreSQL's CREATE TABLE IF NOT EXISTS can still fail on such
// a race, with the table's row type "already exists" (42710) or a unique
// violation in the catalog (23505), and both mean the table is there.
func TestApplyModeInstancesRacingToMakeTablesAllCommit(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "raced"}
	const instances, tables = 6, 20
	var wg sync.WaitGroup
	errs := make(chan error, instances)
	for i := range instances {
		s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		tablet := fmt.Sprintf("t-%04d", i+1)
		var batch []source.Record
		for j := range tables {
			batch = append(batch, source.Record{Tablet: tablet, Position: source.Checkpoint{Term: 1, Index: uint64(j + 1)},
				Table: fmt.Sprintf("public.t%02d", j), Op: source.Insert,
				Key: json.RawMessage(fmt.Sprintf(`{"id":%d}`, i)), After: json.RawMessage(fmt.Sprintf(`{"id":%d}`, i)),
				CommitTime: time.Unix(1, 0)})
		}
		wg.Go(func() {
			w, err := s.Open(ctx, tablet)
			if err == nil {
				err = w.Write(ctx, batch)
			}
			if err == nil {
				err = w.Commit(ctx, source.Checkpoint{Term: 1, Index: tables})
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for j := range tables {
		var n int
		require.NoError(t, db.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM raced.public__t%02d`, j)).Scan(&n))
		require.Equal(t, instances, n)
	}
}

// Apply mode fences like changelog mode (the contract suite, which reads
// records back, runs in changelog mode only): a writer whose tablet's
// checkpoint moved behind its back — another writer committed — gets
// ErrFenced, stays fenced, and changes no mirror row; a re-read batch at
// or below the stored checkpoint is skipped, never applied again.
func TestApplyModeFencesAStaleWriterAndSkipsAReReadBatch(t *testing.T) {
	db := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	ctx := context.Background()
	cfg := pgsink.Config{Kind: "postgres", DSNEnv: "D", Mode: "apply", Schema: "fenced"}
	open := func() sink.Sink {
		s, err := pgsink.New(ctx, cfg, stream, func(string) string { return db.DSN() })
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	rows := func() []map[string]any {
		r, err := db.Query(ctx, `SELECT id::text AS id, amount::text AS amount FROM fenced.public__orders ORDER BY id`)
		require.NoError(t, err)
		return r
	}
	checkpoint := func() source.Checkpoint {
		w, err := open().Open(ctx, "t-0001")
		require.NoError(t, err)
		return w.Checkpoint()
	}
	s := open()
	w, err := s.Open(ctx, "t-0001")
	require.NoError(t, err)
	first := []source.Record{
		rec(1, source.Insert, `{"id":1}`, `{"id":1,"amount":1}`),
		rec(2, source.Insert, `{"id":2}`, `{"id":2,"amount":2}`),
	}
	require.NoError(t, w.Write(ctx, first))
	require.NoError(t, w.Commit(ctx, first[1].Position))
	want := []map[string]any{{"id": "1", "amount": "1"}, {"id": "2", "amount": "2"}}
	require.Equal(t, want, rows())

	// Another writer's commit, as the checkpoints table shows it.
	require.NoError(t, db.Exec(ctx, `UPDATE fenced.checkpoints SET checkpoint = '1.7' WHERE stream = $1 AND tablet = 't-0001'`, stream))
	stale := []source.Record{
		rec(3, source.Update, `{"id":1}`, `{"id":1,"amount":10}`),
		rec(4, source.Delete, `{"id":2}`, ""),
		rec(5, source.Insert, `{"id":3}`, `{"id":3,"amount":3,"extra":"x"}`),
	}
	require.NoError(t, w.Write(ctx, stale))
	require.ErrorIs(t, w.Commit(ctx, stale[2].Position), sink.ErrFenced)
	require.ErrorIs(t, w.Commit(ctx, stale[2].Position), sink.ErrFenced, "a fenced writer stays fenced")
	require.ErrorIs(t, w.Write(ctx, stale), sink.ErrFenced)
	require.Equal(t, want, rows(), "a fenced writer changes no row")
	require.Equal(t, source.Checkpoint{Term: 1, Index: 7}, checkpoint())

	// Two writers from one checkpoint: the second to commit is fenced.
	wa, err := open().Open(ctx, "t-0001")
	require.NoError(t, err)
	wb, err := open().Open(ctx, "t-0001")
	require.NoError(t, err)
	a := rec(8, source.Update, `{"id":1}`, `{"id":1,"amount":8}`)
	b := rec(8, source.Update, `{"id":1}`, `{"id":1,"amount":99}`)
	require.NoError(t, wa.Write(ctx, []source.Record{a}))
	require.NoError(t, wa.Commit(ctx, a.Position))
	require.NoError(t, wb.Write(ctx, []source.Record{b, rec(9, source.Delete, `{"id":2}`, "")}))
	require.ErrorIs(t, wb.Commit(ctx, source.Checkpoint{Term: 1, Index: 9}), sink.ErrFenced)
	want[0]["amount"] = "8"
	require.Equal(t, want, rows(), "only the first writer's batch is applied")

	// A new writer re-reading from before the checkpoint: what is at or
	// below it is skipped (id 2's old insert is not applied again), what
	// follows is applied.
	w, err = open().Open(ctx, "t-0001")
	require.NoError(t, err)
	require.Equal(t, a.Position, w.Checkpoint())
	reread := []source.Record{
		rec(2, source.Insert, `{"id":2}`, `{"id":2,"amount":-2}`),
		rec(8, source.Update, `{"id":1}`, `{"id":1,"amount":-8}`),
		rec(10, source.Insert, `{"id":4}`, `{"id":4,"amount":4}`),
	}
	require.NoError(t, w.Write(ctx, reread))
	require.NoError(t, w.Commit(ctx, reread[2].Position))
	want = append(want, map[string]any{"id": "4", "amount": "4"})
	require.Equal(t, want, rows())
	require.Equal(t, reread[2].Position, checkpoint())
}
