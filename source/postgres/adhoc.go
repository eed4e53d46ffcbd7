package postgres

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/source"
)

// An ad-hoc snapshot (source.Snapshotter) copies named tables of a running
// stream again, shard by shard, as a stream's start copy does (see
// snapshot.go):
//
//  1. Snapshot records the job, its id and tables, in the stream's record
//     on the shard's primary (streamMeta.Adhoc), and deletes what earlier
//     jobs of the shard kept. The same id again does nothing (also once
//     the job is finished or ended); another id replaces the job: readers
//     opened after copy the new one (a reader copying the old one goes on
//     until it is closed).
//  2. The job's progress is kept in the tables of the stream's copies,
//     under the stream's id and, in the shard column, the job's key
//     (jobKey: the shard's id, "#snapshot/", the job's id). Shard ids have
//     no "#": no stream's id, however it is spelled, mixes with a job's,
//     and the stream's start or resync copy (keyed by the shard's id) is
//     untouched.
//  3. A reader copies the job after the stream's start or resync copy:
//     when it opens and that copy is complete, or, in the same reader,
//     from the GetChanges after the batch that ends that copy (so that
//     Copy reports that copy done first: followWithJob). A job recorded
//     while a reader runs is copied by the next one (the tablet's runs
//     are bounded, so one opens soon).
//  4. The copy is a start copy's, of the job's tables alone (a partitioned
//     table's: its partitions), without markers: the rows are Read records
//     at the chunks' positions (L, 1…n), woven into the changes.
//  5. A reader on a standby takes the job from the primary's record, not
//     its own (recordedJob): the standby may not have replayed a job just
//     recorded (the reader would skip it), or one just cancelled or
//     replaced (it would copy it afresh: the primary deleted its
//     progress). The copy needs the primary anyway (watermarks, progress):
//     a primary that does not answer leaves the job to a later reader, and
//     the stream reads on.
//  6. CancelSnapshot ends the job and deletes its progress. A resync ends
//     it too (its copy takes every table, after the job was recorded);
//     DeleteStream deletes its progress with the stream's (clearProgress).
//
// A known limit: a chunk's select waits for the commits the change log
// delivered during the copy to become visible (snapshot.go), not for one
// delivered before the reader that begins the job opened and still
// invisible on the primary (waiting for a synchronous standby that does
// not answer). A start copy has none (making the slot waits for them), nor
// a resync's (its slots are new).

var _ source.Snapshotter = (*Source)(nil)

// adhocJob is a shard's ad-hoc snapshot job as the stream's record keeps it.
type adhocJob struct {
	ID     string   `json:"id"`
	Tables []string `json:"tables"`
	// Ended says why the job copies no more: "cancelled", or "resync
	// <id>". A finished job is not ended: its progress says it is done.
	Ended string `json:"ended,omitempty"`
}

// live: there is a job and it is not ended.
func (j *adhocJob) live() bool { return j != nil && j.Ended == "" }

// jobKey is the shard column of a job's progress rows.
func jobKey(shard, id string) string { return shard + "#snapshot/" + id }

// Snapshot records job for shard tablet of stream. Its tables must be ones
// the stream reads (source.tables).
func (s *Source) Snapshot(ctx context.Context, stream, tablet string, job source.SnapshotJob) error {
	if err := checkJob(job, nil); err != nil {
		return err
	}
	sh, err := s.shardOf(tablet)
	if err != nil {
		return err
	}
	recorded, err := s.changeJob(ctx, stream, sh, func(m *streamMeta) (*adhocJob, bool, error) {
		if cur := m.Adhoc; cur != nil && cur.ID == job.ID {
			return cur, false, nil
		}
		if err := checkJob(job, s.tablesOf(*m)); err != nil {
			return nil, false, err
		}
		return &adhocJob{ID: job.ID, Tables: slices.Clone(job.Tables)}, true, nil
	})
	if err == nil && !recorded {
		err = fmt.Errorf("%w: stream %s has no publication on shard %s's primary %s to snapshot", errPublication, stream, sh.id, s.primary(sh).cfg.Alias)
	}
	return err
}

// checkJob refuses a job without an id or tables, or, with reads, a
// table the stream does not read (errTables).
func checkJob(job source.SnapshotJob, reads []string) error {
	switch {
	case job.ID == "":
		return fmt.Errorf("snapshot job: no id")
	case len(job.Tables) == 0:
		return fmt.Errorf("snapshot job %s: no tables", job.ID)
	}
	for _, t := range job.Tables {
		if reads != nil && !slices.Contains(reads, t) {
			return fmt.Errorf("%w: snapshot job %s: %s is not a table the stream reads (source.tables: %v)", errTables, job.ID, t, reads)
		}
	}
	return nil
}

// CancelSnapshot ends job id on shard tablet of stream. No such job (not
// the shard's job, already ended, the stream not on the shard): nil.
func (s *Source) CancelSnapshot(ctx context.Context, stream, tablet, id string) error {
	sh, err := s.shardOf(tablet)
	if err != nil {
		return err
	}
	_, err = s.changeJob(ctx, stream, sh, func(m *streamMeta) (*adhocJob, bool, error) {
		cur := m.Adhoc
		if !cur.live() || cur.ID != id {
			return cur, false, nil
		}
		ended := *cur
		ended.Ended = "cancelled"
		return &ended, true, nil
	})
	return err
}

// changeJob rewrites the shard's job in the stream's record on its primary
// as change makes it of the recorded one (nil: none), and, when it is
// changed, deletes the progress of the shard's jobs with it. recorded is
// false when the stream has no publication on the shard.
func (s *Source) changeJob(ctx context.Context, stream string, sh *shard, change func(m *streamMeta) (*adhocJob, bool, error)) (recorded bool, err error) {
	prim := s.primary(sh)
	pool, err := prim.poolOf()
	if err != nil {
		return false, err
	}
	f, err := prim.find(ctx, stream)
	if err != nil {
		return false, err
	}
	if f, _, err = s.claim(ctx, sh, f); err != nil {
		return false, err
	}
	if !f.exists || f.meta.Start == 0 {
		return false, nil
	}
	if err := ensureProgressTable(ctx, prim); err != nil {
		return false, err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return rewrite(ctx, tx, f.names.pub, func(m *streamMeta) (bool, error) {
			next, changed, err := change(m)
			if err != nil || !changed {
				return false, err
			}
			m.Adhoc = next
			return true, clearJobs(ctx, tx, stream, sh.id)
		})
	})
	if err != nil {
		return false, fmt.Errorf("record the snapshot job of shard %s on %s: %w", sh.id, prim.cfg.Alias, err)
	}
	return true, nil
}

// recordedJob is the shard's record as its primary has it now, for its
// job (Adhoc nil when there is none, or the primary does not answer within
// connectTimeout: a later reader copies the job) and the tables the stream
// reads.
func (r *Reader) recordedJob(ctx context.Context, stream string) streamMeta {
	jctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	f, err := r.src.primary(r.sh).find(jctx, stream)
	if err != nil || !f.exists || f.names != r.names {
		return streamMeta{}
	}
	return f.meta
}

// openJob resumes (or begins) the copy of m's job, of its tables that the
// stream still reads (by m: a table removed since is not copied); nil when
// the job is not live or its copy is complete.
func (r *Reader) openJob(ctx context.Context, stream string, m streamMeta) (*snapshot, error) {
	job := m.Adhoc
	if !job.live() {
		return nil, nil
	}
	reads := r.src.tablesOf(m)
	tables := slices.DeleteFunc(slices.Clone(job.Tables), func(t string) bool { return !slices.Contains(reads, t) })
	if len(tables) == 0 {
		return nil, nil
	}
	return r.openCopy(ctx, stream, copySpec{kind: source.CopySnapshot, id: job.ID, key: jobKey(r.sh.id, job.ID), tables: tables})
}

// followWithJob opens the shard's job, if one is live and not complete,
// once the stream's start or resync copy has handed its last chunk out
// (its copy then is nil, or the job's): the reader copies it next, without
// waiting to be opened again. The
// commits the change log delivered during that copy that a select may
// still not see are the job's to wait for too; the finished copy's are
// saved first (its last chunk, if not acked, is copied again after a
// crash).
func (r *Reader) followWithJob(ctx context.Context, stream string) error {
	prev := r.snap
	if prev.unsaved {
		if err := r.saveDelivered(ctx, stream); err != nil {
			return err
		}
	}
	r.snap = nil
	snap, err := r.openJob(ctx, stream, r.recordedJob(ctx, stream))
	if err != nil || snap == nil {
		return err
	}
	for x := range prev.recent {
		snap.committed(x)
	}
	r.snap = snap
	return nil
}
