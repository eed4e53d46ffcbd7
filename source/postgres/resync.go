package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/source"
)

// A resync gives one shard of a stream a fresh start (source.Resyncer):
//
//  1. the shard's slots of the stream are dropped and made again on every
//     replica that answers (a standby that does not gets its slot from
//     its reader, as after a stream's start);
//  2. its snapshot progress is deleted (its ad-hoc jobs' too), and its
//     record (the publication's comment) says that the shard copies its
//     tables again (Snapshot), from the new slots' start, under the
//     resync's id; an ad-hoc job not ended is ended by it (its copy takes
//     every table, after the job was recorded);
//  3. the checkpoint returned is the primary's WAL position after that
//     record (E): after every position the shard had before, and after
//     the record, so that a standby that has replayed E has replayed the
//     record and the deleted progress too (a reader on a standby that has
//     not asks the primary: see Reader.find).
//
// The reader then copies the tables as a stream's snapshot does (see
// snapshot.go), between markers: read from E, it first hands out a
// resync-begin record at (E, 1), and a resync-end record after the last
// chunk's rows, in that chunk's positions. What the shard changes
// between E and the first chunk's watermark comes after the begin, as
// changes, and the copy (which sees it) follows.

var _ source.Resyncer = (*Source)(nil)

// Resync starts shard tablet of stream afresh with a copy of its tables.
func (s *Source) Resync(ctx context.Context, stream, tablet, id string, _ source.Checkpoint) (source.Checkpoint, error) {
	sh, err := s.shardOf(tablet)
	if err != nil {
		return source.Checkpoint{}, err
	}
	prim := s.primary(sh)
	pool, err := prim.poolOf()
	if err != nil {
		return source.Checkpoint{}, err
	}
	f, err := prim.find(ctx, stream)
	if err != nil {
		return source.Checkpoint{}, err
	}
	if f, _, err = s.claim(ctx, sh, f); err != nil {
		return source.Checkpoint{}, err
	}
	if !f.exists || f.meta.Start == 0 {
		return source.Checkpoint{}, fmt.Errorf("%w: stream %s has no publication on shard %s's primary %s to resync", errPublication, stream, sh.id, prim.cfg.Alias)
	}
	if id != "" && f.meta.Resync == id && f.meta.ResyncAt != 0 {
		return source.Checkpoint{Term: uint64(f.meta.ResyncAt)}, nil
	}
	name := f.names.slot(sh.id)
	var start pglogrepl.LSN
	for _, r := range sh.replicas {
		if err := r.dropStreamSlot(ctx, name); err != nil {
			if r == prim {
				return source.Checkpoint{}, fmt.Errorf("drop slot %s on %s: %w", name, r.cfg.Alias, err)
			}
			continue // an unreachable standby: its reader makes the slot later
		}
		lsn, err := s.ensureSlot(ctx, name, sh, r)
		if err != nil {
			if r == prim {
				return source.Checkpoint{}, err
			}
			continue
		}
		start = max(start, lsn)
	}
	if err := ensureProgressTable(ctx, prim); err != nil {
		return source.Checkpoint{}, err
	}
	tli, err := prim.timeline(ctx)
	if err != nil {
		return source.Checkpoint{}, fmt.Errorf("read timeline on %s: %w", prim.cfg.Alias, err)
	}
	var at string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := clearProgress(ctx, tx, stream, sh.id); err != nil {
			return err
		}
		return rewrite(ctx, tx, f.names.pub, func(m *streamMeta) (bool, error) {
			// ResyncAt: none until the second write, so that a crash
			// between the two never answers this id with the last
			// resync's position.
			m.Start, m.Timeline, m.Snapshot, m.Resync, m.ResyncAt, m.Stream = start, tli, true, id, 0, stream
			if m.Adhoc.live() {
				m.Adhoc.Ended = "resync " + id
			}
			return true, nil
		})
	})
	if err == nil {
		// After the commit: E is past the transaction's commit record.
		err = pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&at)
	}
	if err != nil {
		return source.Checkpoint{}, fmt.Errorf("record the resync of shard %s on %s: %w", sh.id, prim.cfg.Alias, err)
	}
	e, err := pglogrepl.ParseLSN(at)
	if err != nil {
		return source.Checkpoint{}, err
	}
	// The resync's position, kept so that the same id answers it again.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return rewrite(ctx, tx, f.names.pub, func(m *streamMeta) (bool, error) {
			m.ResyncAt = e
			return true, nil
		})
	})
	if err != nil {
		return source.Checkpoint{}, fmt.Errorf("record the resync of shard %s on %s: %w", sh.id, prim.cfg.Alias, err)
	}
	return source.Checkpoint{Term: uint64(e)}, nil
}
