package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
	"github.com/tabletflow/tabletflow/source/postgres"
	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// A standby's slot invalidated under its reader (a recovery conflict: the
// primary removed catalog rows the slot needs, with hot_standby_feedback
// off) ends the reader's session with 40001, whose text is in the
// server's lc_messages. Its action is the same whatever the language:
// the slot cannot serve any more, read elsewhere. (The test bed's
// PostgreSQL has no translations, so the server's text is rewritten as a
// French server would send it.)
func TestASlotInvalidatedUnderItsReaderIsToldByItsStateNotByTheMessagesLanguage(t *testing.T) {
	defer postgres.SetAdvanceEvery(time.Hour)()
	b := newBed(t, pgbed.Options{Shards: 1, Standbys: 1})
	ctx := ctxT(t, 2*time.Minute)
	p, sb := b.c.Shards[0].Primary, b.c.Shards[0].Standbys[0]
	const stream = "conflict"
	st, err := b.src.EnsureStream(ctx, source.StreamSpec{ID: stream, Tables: pgbed.Tables})
	require.NoError(t, err)
	// Nothing on the primary keeps the catalog rows the standby's slot
	// needs: not the stream's slot there, nor the standby's feedback.
	require.NoError(t, p.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, postgres.SlotName(stream, "s1")))
	require.NoError(t, sb.Exec(ctx, `ALTER SYSTEM SET hot_standby_feedback = off`))
	require.NoError(t, sb.Exec(ctx, `SELECT pg_reload_conf()`))
	require.Eventually(t, func() bool {
		var held bool
		require.NoError(t, p.QueryRow(ctx, `SELECT bool_or(xmin IS NOT NULL OR catalog_xmin IS NOT NULL) FROM pg_replication_slots WHERE slot_type = 'physical'`).Scan(&held))
		return !held
	}, 30*time.Second, 50*time.Millisecond, "the standby's feedback no longer holds rows on the primary")

	rd := b.reader(t, b.cfg.Shards[0].Replicas[1].Alias)
	req := source.ChangesRequest{Stream: stream, Tablet: "s1", From: st.Start["s1"], MaxRecords: 10, MaxWait: 200 * time.Millisecond}
	_, err = rd.GetChanges(ctx, req)
	require.NoError(t, err)
	// Catalog rows made and removed after the slot's catalog_xmin, then
	// vacuumed away.
	require.NoError(t, p.Exec(ctx, `CREATE TABLE public.churn (a int)`))
	require.NoError(t, p.Exec(ctx, `DROP TABLE public.churn`))
	require.NoError(t, p.Exec(ctx, `VACUUM pg_class`))
	require.NoError(t, p.Exec(ctx, `VACUUM pg_attribute`))
	for err == nil {
		require.NoError(t, ctx.Err(), "the reader's session was never ended")
		_, err = rd.GetChanges(ctx, req)
	}
	var pg *pgconn.PgError
	require.True(t, errors.As(err, &pg), "the server's error: %v", err)
	require.Equal(t, "40001", pg.Code, "%v", err)
	t.Logf("the server said: %v (%s)", err, pg.Detail)
	pg.Message = "arrêt de la connexion en raison d'un conflit avec la restauration"
	pg.Detail = "L'utilisateur utilisait un slot de réplication logique qui doit être invalidé."
	c := b.src.Classify(err)
	require.Equal(t, source.RetryElsewhere, c.Action, "%v: %+v", err, c)
	require.Equal(t, "SLOT_INVALIDATED", c.Reason)
}
