package main

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/bench/internal/procstat"
	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/sink/jsonl"
	"github.com/tabletflow/tabletflow/sink/postgres"
)

// sameDigest checks that d, what a path stored, is the workload's digest.
func (b *bench) sameDigest(what string, d digest.Digest) error {
	if d != b.w.digest {
		return fmt.Errorf("%s: %d records, hash %s; the workload is %d records, hash %s",
			what, d.Records, digest.HashHex(d.Hash), b.w.digest.Records, digest.HashHex(b.w.digest.Hash))
	}
	return nil
}

// verifyChanges checks that schema's change table holds exactly the
// workload's records (postgres.Digest, the formula tabletd and the JSONL
// sink use), no (tablet, position) twice.
func (b *bench) verifyChanges(ctx context.Context, schema string) error {
	st, err := postgres.Digest(ctx, b.admin, schema, stream)
	if err != nil {
		return fmt.Errorf("digest of %s.changes: %w", schema, err)
	}
	if st.Duplicates > 0 {
		return fmt.Errorf("%s.changes: %d rows repeat a (tablet, position)", schema, st.Duplicates)
	}
	return b.sameDigest(schema+".changes", st.Digest)
}

// verifyCheckpoints checks that every tablet's checkpoint row in schema
// holds its last record's position.
func (b *bench) verifyCheckpoints(ctx context.Context, schema string) error {
	rows, err := b.admin.Query(ctx, `SELECT tablet, checkpoint FROM `+pgx.Identifier{schema, "checkpoints"}.Sanitize()+
		` WHERE stream = $1`, stream)
	if err != nil {
		return err
	}
	got := map[string]string{}
	for rows.Next() {
		var tablet, cp string
		if err := rows.Scan(&tablet, &cp); err != nil {
			return err
		}
		got[tablet] = cp
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, tablet := range b.w.tablets {
		log := b.w.logs[tablet]
		if want := log[len(log)-1].Position.String(); got[tablet] != want {
			return fmt.Errorf("%s.checkpoints: tablet %s at %q, want %s", schema, tablet, got[tablet], want)
		}
	}
	if len(got) != len(b.w.tablets) {
		return fmt.Errorf("%s.checkpoints: %d tablets, want %d", schema, len(got), len(b.w.tablets))
	}
	return nil
}

// verifyJSONL checks that the JSONL sink's directory holds exactly the
// workload's records, none twice.
func (b *bench) verifyJSONL(dir string) error {
	r, err := jsonl.DigestDir(dir)
	if err != nil {
		return err
	}
	if len(r.Duplicates) > 0 {
		return fmt.Errorf("jsonl: %d positions stored more than once", len(r.Duplicates))
	}
	return b.sameDigest("jsonl", r.Total)
}

// verifyMirror checks that apply mode's mirror table holds the orders live
// after the last record, each at its last revision.
func (b *bench) verifyMirror(ctx context.Context, schema string) error {
	name := pgx.Identifier{schema, table}.Sanitize()
	rows, err := b.admin.Query(ctx, `SELECT id::text, rev::text FROM `+name)
	if err != nil {
		return err
	}
	n := 0
	for rows.Next() {
		var id, rev string
		if err := rows.Scan(&id, &rev); err != nil {
			return err
		}
		n++
		if want, ok := b.w.live[id]; !ok || strconv.Itoa(want) != rev {
			rows.Close()
			return fmt.Errorf("%s: order %s at revision %s; the workload leaves it %s", name, id, rev, liveString(want, ok))
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n != len(b.w.live) {
		return fmt.Errorf("%s: %d rows, the workload leaves %d orders", name, n, len(b.w.live))
	}
	return nil
}

func liveString(rev int, ok bool) string {
	if !ok {
		return "deleted or never inserted"
	}
	return "at revision " + strconv.Itoa(rev)
}

// cpuSnapshot is CPU seconds used so far: by this program and the host
// (procstat.Snapshot), and by each of the PostgreSQL server's processes.
type cpuSnapshot struct {
	procstat.Snapshot
	postgres map[int]float64
}

// cpu reads what cpuSnapshot holds. The server's processes are the
// postmaster and its children (backends, writers); a backend that ends
// between two snapshots is not counted, so the paths close their
// connections only after their second snapshot.
func (b *bench) cpu() cpuSnapshot {
	s := cpuSnapshot{Snapshot: procstat.Snapshot{}, postgres: map[int]float64{}}
	if v, err := procstat.SelfCPU(); err == nil {
		s.Snapshot["bench"] = v
	}
	if h, err := procstat.ReadHostCPU(); err == nil {
		s.Snapshot["host_busy"] = procstat.Seconds(h.Busy() + h.Steal)
		s.Snapshot["host_steal"] = procstat.Seconds(h.Steal)
	}
	if b.bed == nil {
		return s
	}
	for _, pid := range b.primary().ServerPids() {
		if v, err := procstat.ProcessCPU(pid); err == nil {
			s.postgres[pid] = v
		}
	}
	return s
}

// Minus is the CPU seconds used since prev, by name; "postgres" sums the
// server's processes that are there now.
func (s cpuSnapshot) Minus(prev cpuSnapshot) map[string]float64 {
	var pg float64
	for pid, v := range s.postgres {
		pg += v - prev.postgres[pid]
	}
	out := s.Snapshot.Minus(prev.Snapshot)
	out["postgres"] = math.Round(pg*100) / 100
	return out
}
