package e2e

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// kindsSQL makes, on a primary, a table of 26 column types (an enum among
// them, which the sink's database lacks) owned by the adapter's role.
var kindsSQL = `CREATE TYPE public.mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE public.kinds (
	id bigint PRIMARY KEY, i2 smallint, i4 integer, i8 bigint, num numeric, num2 numeric(12,3),
	f4 real, f8 double precision, b boolean, t text, vc varchar(20), ch char(5),
	d date, ts timestamp, tstz timestamptz, tm time, iv interval, ba bytea, js json, jsb jsonb,
	ia integer[], ta text[], u uuid, m public.mood, ip inet, bits bit varying(8));
ALTER TABLE public.kinds OWNER TO ` + pgbed.User

// kindsRows inserts rows $1..$2 of kinds, every fifth one NULL but for
// its key; text with characters beyond ASCII and quotes. Without vc: the
// table once that column is dropped.
func kindsRows(vc bool) string {
	cols, vals, nulls := ", vc", ", 'vc' || g", ", vc = NULL"
	if !vc {
		cols, vals, nulls = "", "", ""
	}
	return `INSERT INTO public.kinds (id, i2, i4, i8, num, num2, f4, f8, b, t` + cols + `, ch, d, ts, tstz, tm, iv, ba, js, jsb, ia, ta, u, m, ip, bits)
	SELECT g, g % 30000, g * 1000, g * 1000000000, g * 1.5 + 0.000001, round(g / 7.0, 3), g / 3.0, g / 7.0, g % 2 = 0,
		'tëxt ✓ "' || g || ''''` + vals + `, 'c' || g % 10, date '2026-01-01' + (g % 1000)::int,
		timestamp '2026-01-01 00:00:00.123456' + g * interval '1 minute', timestamptz '2026-01-01 00:00:00.5+05' + g * interval '1 second',
		time '12:00' + g * interval '1 s', g * interval '1 day 3 hours 0.25 s', decode(md5(g::text), 'hex'),
		json_build_object('g', g, 'arr', json_build_array(g, g + 1)), jsonb_build_object('k', g, 'nested', jsonb_build_object('x', 'ü')),
		ARRAY[g::int, NULL, g::int + 1], ARRAY['a b', 'c"d', NULL, '{}'], md5(g::text)::uuid, (ARRAY['sad', 'ok', 'happy'])[1 + g % 3]::public.mood,
		('10.0.' || g % 255 || '.' || g % 7 || '/32')::inet, (g % 256)::bit(8)::varbit
	FROM generate_series($1::bigint, $2::bigint) g;
	UPDATE public.kinds SET i2 = NULL, i4 = NULL, i8 = NULL, num = NULL, num2 = NULL, f4 = NULL, f8 = NULL, b = NULL, t = NULL` + nulls + `,
		ch = NULL, d = NULL, ts = NULL, tstz = NULL, tm = NULL, iv = NULL, ba = NULL, js = NULL, jsb = NULL, ia = NULL, ta = NULL, u = NULL,
		m = NULL, ip = NULL, bits = NULL WHERE id BETWEEN $1 AND $2 AND id % 5 = 0`
}

// A PostgreSQL source into apply mode with sink.mirrorTypes "source": the
// mirror table of a table of 26 column types has the source's types (text
// for the enum the sink's database lacks), and holds the shards' rows as
// the database's own equality compares them, after a snapshot, changes
// of every kind, and a column added and another dropped on each shard
// while the other shard writes; the dropped column stays in the mirror.
func TestPostgresSourceIntoTypedMirrorTablesEqualsTheSourceRowForRow(t *testing.T) {
	p := newPGEnv(t, pgbed.Options{Shards: 2, Standbys: 1})
	target := pgbed.StartT(t, pgbed.Options{Shards: 1}).Shards[0].Primary
	t.Setenv("TF_E2E_TARGET_DSN", target.DSN())
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	for i, sh := range p.bed.Shards {
		require.NoError(t, sh.Primary.Exec(ctx, kindsSQL))
		require.NoError(t, execArgs(ctx, sh.Primary, kindsRows(true), i*100000+1, i*100000+40)) // for the snapshot
	}
	p.src["tables"] = append(slices.Clone(pgbed.Tables), "public.kinds")
	p.startWorker()
	const stream = "pgtyped"
	p.startStream(stream, p.config("", map[string]any{
		"startFrom": "snapshot",
		"sink": map[string]any{"kind": "postgres", "dsnEnv": "TF_E2E_TARGET_DSN", "mode": "apply", "schema": "mirror",
			"mirrorTypes": "source"},
	}))
	p.waitStatus(stream, "both shards streaming", 2*time.Minute, allStreaming(2))

	// Each shard: inserts, updates of every type, deletes; then a column
	// added and one dropped, and more changes using the new column, while
	// the other shard goes on writing.
	errs := make(chan error, len(p.bed.Shards))
	for i, sh := range p.bed.Shards {
		go func() {
			base := i*100000 + 100
			steps := []struct {
				sql    string
				lo, hi int
			}{
				{sql: kindsRows(true), lo: base, hi: base + 60},
				{sql: `UPDATE public.kinds SET num = num + 1, f8 = f8 * 2, tstz = tstz + interval '1 hour', jsb = jsb || '{"u": [1, "two"]}',
					ta = array_append(ta, 'x'), ia = array_append(ia, 7), ba = ba || '\x00ff'::bytea, m = 'happy', t = t || ' ✓✓', iv = iv + interval '1 month' WHERE id % 3 = 0`},
				{sql: `DELETE FROM public.kinds WHERE id % 11 = 0`},
				{sql: `ALTER TABLE public.kinds ADD COLUMN extra numeric(8,2); ALTER TABLE public.kinds DROP COLUMN vc`},
				{sql: `UPDATE public.kinds SET extra = id % 1000 / 3.0, b = NOT b WHERE id % 4 = 1`},
				{sql: kindsRows(false), lo: base + 100, hi: base + 130},
				{sql: `UPDATE public.kinds SET extra = NULL, i8 = -i8 WHERE id % 8 = 1`},
			}
			for _, step := range steps {
				var err error
				if step.hi > 0 {
					err = execArgs(ctx, sh.Primary, step.sql, step.lo, step.hi)
				} else {
					err = sh.Primary.Exec(ctx, step.sql)
				}
				if err != nil {
					errs <- fmt.Errorf("shard %d: %.80s: %w", i+1, step.sql, err)
					return
				}
				time.Sleep(200 * time.Millisecond) // a pace, not an assertion: the other shard writes meanwhile
			}
			errs <- nil
		}()
	}
	for range p.bed.Shards {
		require.NoError(t, <-errs)
	}

	// The mirror's columns: the source's, in its types (the enum as
	// text), and the dropped one kept.
	srcTypes := columnTypes(ctx, t, p.bed.Shards[0].Primary, "public.kinds")
	require.NotContains(t, srcTypes, "vc")
	require.Contains(t, srcTypes, "extra")
	p.eventually("the mirror table has the source's columns", 2*time.Minute, func() (bool, string) {
		got := columnTypes(ctx, t, target, "mirror.public__kinds")
		for c, typ := range srcTypes {
			if c == "m" {
				typ = "text"
			}
			if got[c] != typ {
				return false, fmt.Sprintf("column %s: %q in the mirror, %q at the source", c, got[c], typ)
			}
		}
		return got["vc"] == "character varying(20)", fmt.Sprintf("the dropped column vc: %q", got["vc"])
	})

	// Row for row by the database's equality: the shards' rows copied
	// (COPY, exact) into a table of the mirror's types beside it.
	cols := slices.Sorted(func(yield func(string) bool) {
		for c := range srcTypes {
			if !yield(c) {
				return
			}
		}
	})
	list := strings.Join(cols, ", ")
	cmp := strings.ReplaceAll(list, "js,", "js::jsonb,") // json has no equality: compared as jsonb (docs/sinks.md)
	require.NoError(t, target.Exec(ctx, `CREATE TABLE public.want AS SELECT `+list+` FROM mirror.public__kinds WITH NO DATA`))
	p.eventually("the typed mirror equals the shards' rows", 2*time.Minute, func() (bool, string) {
		if err := target.Exec(ctx, `TRUNCATE public.want`); err != nil {
			return false, err.Error()
		}
		var n int
		for _, sh := range p.bed.Shards {
			if err := copyTable(ctx, sh.Primary, target, `SELECT `+list+` FROM public.kinds`, `public.want (`+list+`)`); err != nil {
				return false, err.Error()
			}
			var k int
			if err := sh.Primary.QueryRow(ctx, `SELECT count(*) FROM public.kinds`).Scan(&k); err != nil {
				return false, err.Error()
			}
			n += k
		}
		var missing, extra int
		err := target.QueryRow(ctx, `SELECT (SELECT count(*) FROM (SELECT `+cmp+` FROM public.want EXCEPT ALL SELECT `+cmp+` FROM mirror.public__kinds) a),
			(SELECT count(*) FROM (SELECT `+cmp+` FROM mirror.public__kinds EXCEPT ALL SELECT `+cmp+` FROM public.want) b)`).Scan(&missing, &extra)
		if err != nil {
			return false, err.Error()
		}
		if missing == 0 && extra == 0 {
			return true, ""
		}
		return false, fmt.Sprintf("%d of %d source rows not in the mirror, %d mirror rows not at the source; %s", missing, n, extra,
			columnDifference(ctx, target, cols, "public.want", "mirror.public__kinds"))
	})
	var nulls int
	require.NoError(t, target.QueryRow(ctx, `SELECT count(*) FROM mirror.public__kinds WHERE id % 5 = 0 AND num IS NULL AND m IS NULL AND jsb IS NULL`).Scan(&nulls))
	require.Positive(t, nulls, "NULLs stay NULL")
}

// columnDifference names the first column in which rows of two tables
// with the same id differ, with the values (as text) of one such row.
func columnDifference(ctx context.Context, n *pgbed.Node, cols []string, a, b string) string {
	for _, c := range cols {
		eq := "x." + c + " IS DISTINCT FROM y." + c
		if c == "js" {
			eq = "x.js::jsonb IS DISTINCT FROM y.js::jsonb"
		}
		var id int64
		var xv, yv *string
		err := n.QueryRow(ctx, `SELECT x.id, x.`+c+`::text, y.`+c+`::text FROM `+a+` x JOIN `+b+` y USING (id) WHERE `+eq+` LIMIT 1`).Scan(&id, &xv, &yv)
		if err == nil {
			return fmt.Sprintf("column %s of id %d: %v at the source, %v in the mirror", c, id, deref(xv), deref(yv))
		}
	}
	return "no column differs for a common id"
}

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// execArgs runs one statement list with two arguments, statement by
// statement (an extended-protocol call takes one statement).
func execArgs(ctx context.Context, n *pgbed.Node, sql string, a, b int) error {
	for _, stmt := range strings.Split(sql, ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if err := n.Exec(ctx, stmt, a, b); err != nil {
			return err
		}
	}
	return nil
}

// columnTypes names a table's columns' types (format_type).
func columnTypes(ctx context.Context, t *testing.T, n *pgbed.Node, table string) map[string]string {
	rows, err := n.Query(ctx, `SELECT attname::text AS c, format_type(atttypid, atttypmod) AS t FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, table)
	require.NoError(t, err)
	out := map[string]string{}
	for _, r := range rows {
		out[r["c"].(string)] = r["t"].(string)
	}
	return out
}

// copyTable copies a query's rows from one server into a table of
// another, in COPY's text form (exact for every type).
func copyTable(ctx context.Context, from, to *pgbed.Node, query, into string) error {
	src, err := from.Connect(ctx)
	if err != nil {
		return err
	}
	defer src.Close(ctx)
	dst, err := to.Connect(ctx)
	if err != nil {
		return err
	}
	defer dst.Close(ctx)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := src.PgConn().CopyTo(ctx, pw, `COPY (`+query+`) TO STDOUT`)
		pw.CloseWithError(err)
		done <- err
	}()
	_, err = dst.PgConn().CopyFrom(ctx, pr, `COPY `+into+` FROM STDIN`)
	pr.Close()
	if err2 := <-done; err == nil {
		err = err2
	}
	return err
}
