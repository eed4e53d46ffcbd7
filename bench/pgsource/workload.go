package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tabletflow/tabletflow/testbed/pgbed"
)

// written is what the workload wrote.
type written struct {
	records  uint64 // rows the transactions affected: the change records due
	txs      int
	walBytes uint64
	took     time.Duration
}

// write runs the fixed workload on the primary: writers connections, each
// records/(4·writers) transactions sent as one pipelined batch (one round
// trip, one implicit transaction), as fast as they go; then it waits for
// the standby to replay all of it. Ids are the writer's (w+1)·10⁹ + n, so
// no key is reused and every update and delete finds its row.
func (b *bench) write(ctx context.Context, records, writers int) (written, error) {
	p := b.shard().Primary
	from, err := currentLSN(ctx, p)
	if err != nil {
		return written{}, err
	}
	txs := max(1, (records+4*writers-1)/(4*writers))
	counts := make([]uint64, writers)
	errs := make([]error, writers)
	began := time.Now()
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() { counts[i], errs[i] = writeTxs(ctx, p.AdminDSN(), int64(i+1)*1_000_000_000, txs) })
	}
	wg.Wait()
	took := time.Since(began)
	if err := errors.Join(errs...); err != nil {
		return written{}, err
	}
	to, err := currentLSN(ctx, p)
	if err != nil {
		return written{}, err
	}
	if err := b.shard().WaitReplayed(ctx); err != nil {
		return written{}, err
	}
	w := written{txs: txs * writers, walBytes: uint64(to - from), took: took}
	for _, n := range counts {
		w.records += n
	}
	return w, nil
}

// currentLSN is the primary's current WAL position.
func currentLSN(ctx context.Context, p *pgbed.Node) (pglogrepl.LSN, error) {
	var s string
	if err := p.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		return 0, fmt.Errorf("%s: current LSN: %w", p.Name, err)
	}
	return pglogrepl.ParseLSN(s)
}

// writeTxs runs n transactions on a connection of its own, ids from base,
// and returns the rows they affected. Transaction k inserts order and item
// base+k, updates order base+k-1, deletes item base+k-2, and every eighth
// also deletes order base+k-5 (updated for the last time three
// transactions before).
func writeTxs(ctx context.Context, dsn string, base int64, n int) (uint64, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var rows uint64
	for k := range int64(n) {
		id := base + k
		var batch pgx.Batch
		batch.Queue(`INSERT INTO public.orders (id, customer, amount, note, updated_at) VALUES ($1, $2, $3::numeric / 100, $4, now())`,
			id, fmt.Sprintf("customer-%d", k%50), 100+k%100_000, fmt.Sprintf("note %d", k))
		batch.Queue(`INSERT INTO public.items (id, order_id, sku, qty, body) VALUES ($1, $1, $2, $3, $4)`,
			id, fmt.Sprintf("sku-%d", k%1000), 1+k%9, fmt.Sprintf("item %d of order %d", k, id))
		if k >= 1 {
			batch.Queue(`UPDATE public.orders SET amount = amount + 1, updated_at = now() WHERE id = $1`, id-1)
		}
		if k >= 2 {
			batch.Queue(`DELETE FROM public.items WHERE id = $1`, id-2)
		}
		if k%8 == 7 {
			batch.Queue(`DELETE FROM public.orders WHERE id = $1`, id-5)
		}
		br := conn.SendBatch(ctx, &batch)
		for range batch.Len() {
			tag, err := br.Exec()
			if err != nil {
				_ = br.Close()
				return rows, fmt.Errorf("transaction %d of writer %d: %w", k, base, err)
			}
			rows += uint64(tag.RowsAffected())
		}
		if err := br.Close(); err != nil {
			return rows, err
		}
	}
	return rows, nil
}
