package pgbed

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// WorkloadOptions shape a Workload. The zero value writes as fast as it can
// until Stop and stops at the first error.
type WorkloadOptions struct {
	// Rate is transactions per second on each shard; 0: as fast as it goes.
	Rate float64
	// Count is transactions per shard, after which the workload ends (Wait);
	// 0: until Stop.
	Count int
	// Seed makes the sequence of operations repeatable (per shard).
	Seed uint64
	// KeepGoing: on an error (a primary killed or restarting) reconnect and
	// carry on, counting it in Stats.Errors, instead of ending that shard's
	// writer.
	KeepGoing bool
}

// WorkloadStats count committed work, all shards together.
type WorkloadStats struct {
	Txs, Inserts, Updates, Deletes, Errors int
}

// Workload writes to every shard's primary: inserts, updates and deletes of
// orders and items, single statements and multi-statement transactions, a
// large (out-of-line) note now and then, and updates that leave it unchanged.
// Ids are unique across shards: shard i (from 0) uses (i+1)·10⁹ + n.
type Workload struct {
	c    *Cluster
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	mu    sync.Mutex
	stats WorkloadStats
	err   error
}

// StartWorkload starts one writer per shard, each on a connection of its own.
func (c *Cluster) StartWorkload(opts WorkloadOptions) *Workload {
	w := &Workload{c: c, stop: make(chan struct{})}
	for i, s := range c.Shards {
		wr := &writer{w: w, node: s.Primary, opts: opts,
			rng: rand.New(rand.NewPCG(opts.Seed, uint64(i))), nextID: int64(i+1) * 1_000_000_000,
			items: map[int64][]int64{}, pos: map[int64]int{}}
		w.wg.Go(wr.run)
	}
	return w
}

// Wait waits for every writer to end (Count reached, or an error without
// KeepGoing) and returns the first error.
func (w *Workload) Wait() error {
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Stop ends the writers after their current transaction (it commits or
// rolls back, never left in doubt) and returns the first error.
func (w *Workload) Stop() error {
	w.once.Do(func() { close(w.stop) })
	return w.Wait()
}

// Stats are the counts so far.
func (w *Workload) Stats() WorkloadStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// Rows reads every table of a shard's primary: what a replay of the CDC
// output should equal once the workload has stopped.
func (w *Workload) Rows(ctx context.Context, shard int) (map[string]Rows, error) {
	return w.c.Rows(ctx, shard)
}

// writer is one shard's: it knows the live orders and their items, so it
// updates and deletes rows that exist.
type writer struct {
	w      *Workload
	node   *Node
	opts   WorkloadOptions
	rng    *rand.Rand
	conn   *pgx.Conn
	nextID int64

	orders []int64           // live order ids
	pos    map[int64]int     // order id → index in orders
	items  map[int64][]int64 // order id → its item ids
}

// change is what a committed transaction did, applied to the writer's
// knowledge and the stats only after the commit.
type change struct {
	inserted []int64           // orders
	newItems map[int64][]int64 // order → items added
	deleted  []int64           // orders, with their items
	updates  int
	inserts  int
	deletes  int
}

func (wr *writer) run() {
	defer func() {
		if wr.conn != nil {
			wr.conn.Close(context.Background())
		}
	}()
	var tick <-chan time.Time
	if wr.opts.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / wr.opts.Rate))
		defer t.Stop()
		tick = t.C
	}
	for n := 0; wr.opts.Count == 0 || n < wr.opts.Count; {
		select {
		case <-wr.w.stop:
			return
		default:
		}
		if tick != nil {
			select {
			case <-wr.w.stop:
				return
			case <-tick:
			}
		}
		ch, err := wr.tx()
		wr.w.mu.Lock()
		if err != nil {
			wr.w.stats.Errors++
			if !wr.opts.KeepGoing && wr.w.err == nil {
				wr.w.err = fmt.Errorf("workload on %s: %w", wr.node.Name, err)
			}
		} else {
			wr.w.stats.Txs++
			wr.w.stats.Inserts += ch.inserts
			wr.w.stats.Updates += ch.updates
			wr.w.stats.Deletes += ch.deletes
		}
		wr.w.mu.Unlock()
		if err != nil {
			if !wr.opts.KeepGoing {
				return
			}
			if wr.conn != nil {
				wr.conn.Close(context.Background())
				wr.conn = nil
			}
			select {
			case <-wr.w.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		wr.apply(ch)
		n++
	}
}

// tx runs one transaction of a randomly chosen kind.
func (wr *writer) tx() (change, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if wr.conn == nil {
		conn, err := wr.node.Connect(ctx)
		if err != nil {
			return change{}, err
		}
		wr.conn = conn
	}
	ch := change{newItems: map[int64][]int64{}}
	err := pgx.BeginFunc(ctx, wr.conn, func(tx pgx.Tx) error {
		k := wr.rng.IntN(100)
		switch {
		case k < 30 || len(wr.orders) < 5:
			return wr.insertOrder(ctx, tx, &ch)
		case k < 55:
			return wr.updateOrder(ctx, tx, &ch, wr.pick())
		case k < 65:
			return wr.updateItem(ctx, tx, &ch)
		case k < 75:
			return wr.deleteOrder(ctx, tx, &ch, wr.pick())
		default:
			return wr.batch(ctx, tx, &ch)
		}
	})
	return ch, err
}

// insertOrder inserts an order with up to two items.
func (wr *writer) insertOrder(ctx context.Context, tx pgx.Tx, ch *change) error {
	id := wr.id()
	if _, err := tx.Exec(ctx, "INSERT INTO public.orders (id, customer, amount, note, updated_at) VALUES ($1, $2, $3::bigint * 0.01, $4, now())",
		id, fmt.Sprintf("customer-%d", wr.rng.IntN(50)), wr.rng.IntN(100_000), wr.note()); err != nil {
		return err
	}
	ch.inserted = append(ch.inserted, id)
	ch.inserts++
	for range wr.rng.IntN(3) {
		item := wr.id()
		if _, err := tx.Exec(ctx, "INSERT INTO public.items (id, order_id, sku, qty, body) VALUES ($1, $2, $3, $4, $5)",
			item, id, fmt.Sprintf("sku-%d", wr.rng.IntN(1000)), 1+wr.rng.IntN(9), wr.note()); err != nil {
			return err
		}
		ch.newItems[id] = append(ch.newItems[id], item)
		ch.inserts++
	}
	return nil
}

// updateOrder changes an order's amount, and half the time its note (else
// the note is left as is: an unchanged TOAST value when it is large).
func (wr *writer) updateOrder(ctx context.Context, tx pgx.Tx, ch *change, id int64) error {
	var err error
	if wr.rng.IntN(2) == 0 {
		_, err = tx.Exec(ctx, "UPDATE public.orders SET amount = $2::bigint * 0.01, updated_at = now() WHERE id = $1", id, wr.rng.IntN(100_000))
	} else {
		_, err = tx.Exec(ctx, "UPDATE public.orders SET amount = amount + 1, note = $2, updated_at = now() WHERE id = $1", id, wr.note())
	}
	ch.updates++
	return err
}

// updateItem changes the quantity of some order's items (several rows in
// one statement), leaving their bodies unchanged.
func (wr *writer) updateItem(ctx context.Context, tx pgx.Tx, ch *change) error {
	id := wr.pick()
	tag, err := tx.Exec(ctx, "UPDATE public.items SET qty = qty + 1 WHERE order_id = $1", id)
	ch.updates += int(tag.RowsAffected())
	return err
}

// deleteOrder deletes an order and its items.
func (wr *writer) deleteOrder(ctx context.Context, tx pgx.Tx, ch *change, id int64) error {
	if _, err := tx.Exec(ctx, "DELETE FROM public.items WHERE order_id = $1", id); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "DELETE FROM public.orders WHERE id = $1", id); err != nil {
		return err
	}
	ch.deleted = append(ch.deleted, id)
	ch.deletes += 1 + len(wr.items[id])
	return nil
}

// batch is a multi-statement transaction: two new orders, a multi-row
// update of two others, a deletion.
func (wr *writer) batch(ctx context.Context, tx pgx.Tx, ch *change) error {
	for range 2 {
		if err := wr.insertOrder(ctx, tx, ch); err != nil {
			return err
		}
	}
	a, b := wr.pick(), wr.pick()
	tag, err := tx.Exec(ctx, "UPDATE public.orders SET amount = amount * 2, updated_at = now() WHERE id = ANY($1)", []int64{a, b})
	if err != nil {
		return err
	}
	ch.updates += int(tag.RowsAffected())
	victim := wr.pick()
	if victim == a || victim == b {
		return nil
	}
	return wr.deleteOrder(ctx, tx, ch, victim)
}

// apply records a committed change.
func (wr *writer) apply(ch change) {
	for _, id := range ch.inserted {
		wr.pos[id] = len(wr.orders)
		wr.orders = append(wr.orders, id)
	}
	for id, items := range ch.newItems {
		wr.items[id] = append(wr.items[id], items...)
	}
	for _, id := range ch.deleted {
		i, ok := wr.pos[id]
		if !ok {
			continue
		}
		last := wr.orders[len(wr.orders)-1]
		wr.orders[i], wr.pos[last] = last, i
		wr.orders = wr.orders[:len(wr.orders)-1]
		delete(wr.pos, id)
		delete(wr.items, id)
	}
}

// pick is a live order (inserting first when there is none is tx's job).
func (wr *writer) pick() int64 {
	if len(wr.orders) == 0 {
		return 0
	}
	return wr.orders[wr.rng.IntN(len(wr.orders))]
}

func (wr *writer) id() int64 {
	wr.nextID++
	return wr.nextID
}

// note is a short text, empty (NULL) now and then, or one time in ten a
// large one (3–6 kB, stored out of line).
func (wr *writer) note() any {
	switch k := wr.rng.IntN(10); {
	case k == 0:
		const hex = "0123456789abcdef"
		var b strings.Builder
		n := 3000 + wr.rng.IntN(3000)
		b.Grow(n)
		for range n {
			b.WriteByte(hex[wr.rng.IntN(16)])
		}
		return b.String()
	case k == 1:
		return nil
	default:
		return fmt.Sprintf("note %d", wr.rng.IntN(1_000_000))
	}
}
