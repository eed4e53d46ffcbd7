package vitessbed

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// WorkloadOptions shape a Workload. The zero value writes as fast as it can
// until Stop and stops at the first error.
type WorkloadOptions struct {
	// Rate is transactions per second; 0: as fast as it goes.
	Rate float64
	// Count is transactions, after which the workload ends (Wait); 0: until
	// Stop.
	Count int
	// Seed makes the sequence of operations repeatable.
	Seed uint64
	// FirstID is the first customer_id and order_id the workload inserts
	// (default 1); two workloads on one bed need ranges of their own.
	FirstID int64
	// KeepGoing: on an error (a tablet killed, vtgate unable to route)
	// count it in Stats.Errors, reread what exists and carry on, instead of
	// ending.
	KeepGoing bool
}

// WorkloadStats count committed work. Rows are counted once per statement's
// row: a key update is an update too.
type WorkloadStats struct {
	// Txs are committed transactions; MultiRowTxs those that wrote more
	// than one row (several statements, or one statement on several rows).
	Txs, MultiRowTxs int
	// Inserts, Updates, Deletes are rows written; KeyUpdates the updates
	// that changed a primary key (corder.order_id).
	Inserts, Updates, KeyUpdates, Deletes int
	// Errors are failed transactions (KeepGoing).
	Errors int
}

// Workload writes through vtgate, as an application would: inserts of
// customers with their orders in one transaction, updates of emails, prices
// and SKUs, updates of an order's primary key, deletes of orders and of
// customers with their orders, and transactions over several customers
// (often on both shards). It updates and deletes only rows that exist.
type Workload struct {
	c    *Cluster
	opts WorkloadOptions
	rng  *rand.Rand
	stop chan struct{}
	once sync.Once
	done chan struct{}

	mu    sync.Mutex
	stats WorkloadStats
	err   error

	nextID    int64
	serial    int64
	customers []int64           // live customer ids
	orders    map[int64][]int64 // customer id → its live order ids
}

// StartWorkload starts a workload's writer.
func (c *Cluster) StartWorkload(opts WorkloadOptions) *Workload {
	if opts.FirstID == 0 {
		opts.FirstID = 1
	}
	w := &Workload{c: c, opts: opts, rng: rand.New(rand.NewPCG(opts.Seed, 0x76)), stop: make(chan struct{}),
		done: make(chan struct{}), nextID: opts.FirstID, orders: map[int64][]int64{}}
	go w.run()
	return w
}

// Wait waits for the writer to end (Count reached, or an error without
// KeepGoing) and returns the first error.
func (w *Workload) Wait() error {
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Stop ends the writer after its current transaction (committed or rolled
// back, never left open) and returns the first error.
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

func (w *Workload) run() {
	defer close(w.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// A statement still running 10 s after Stop (a tablet that does not
		// answer) is cut; its transaction rolls back.
		select {
		case <-w.stop:
		case <-w.done:
			return
		}
		select {
		case <-time.After(10 * time.Second):
			cancel()
		case <-w.done:
		}
	}()
	db, err := w.c.DB()
	if err != nil {
		w.fail(err)
		return
	}
	begin := time.Now()
	for n := 0; w.opts.Count == 0 || n < w.opts.Count; n++ {
		if w.opts.Rate > 0 {
			next := begin.Add(time.Duration(float64(n) / w.opts.Rate * float64(time.Second)))
			select {
			case <-w.stop:
				return
			case <-time.After(time.Until(next)):
			}
		}
		select {
		case <-w.stop:
			return
		default:
		}
		d, err := w.transaction(ctx, db)
		if err != nil {
			if !w.opts.KeepGoing {
				w.fail(err)
				return
			}
			w.mu.Lock()
			w.stats.Errors++
			w.mu.Unlock()
			// A commit that failed may have happened: read what exists.
			if err := w.reload(ctx, db); err != nil {
				select {
				case <-w.stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
			}
			continue
		}
		w.apply(d)
	}
}

func (w *Workload) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// delta is what a committed transaction did: applied to the writer's
// knowledge and the stats only after the commit.
type delta struct {
	newCustomers []int64
	newOrders    map[int64][]int64  // customer → orders added
	gone         []int64            // customers deleted, with their orders
	goneOrders   map[int64][]int64  // customer → orders deleted
	renamed      map[int64][2]int64 // customer → its order's old and new id
	stats        WorkloadStats
}

func newDelta() *delta {
	return &delta{newOrders: map[int64][]int64{}, goneOrders: map[int64][]int64{}, renamed: map[int64][2]int64{}}
}

// transaction picks and runs one transaction.
func (w *Workload) transaction(ctx context.Context, db *sql.DB) (*delta, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	d := newDelta()
	if err := w.write(ctx, tx, d); err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	d.stats.Txs = 1
	if d.stats.Inserts+d.stats.Updates+d.stats.Deletes > 1 {
		d.stats.MultiRowTxs = 1
	}
	return d, nil
}

// write runs one transaction's statements, chosen at random from what
// exists.
func (w *Workload) write(ctx context.Context, tx *sql.Tx, d *delta) error {
	r := w.rng.IntN(100)
	if len(w.customers) < 4 {
		r = 0
	}
	switch {
	case r < 25: // a customer with 1–3 orders
		id := w.id()
		if err := exec1(ctx, tx, &d.stats.Inserts, "INSERT INTO customer (customer_id, email) VALUES (?, ?)", id, w.email(id)); err != nil {
			return err
		}
		d.newCustomers = append(d.newCustomers, id)
		for range 1 + w.rng.IntN(3) {
			if err := w.insertOrder(ctx, tx, d, id); err != nil {
				return err
			}
		}
	case r < 40: // an email
		id := w.customer()
		return exec1(ctx, tx, &d.stats.Updates, "UPDATE customer SET email = ? WHERE customer_id = ?", w.email(id), id)
	case r < 55: // an order's price and SKU
		cust, order, ok := w.order()
		if !ok {
			return w.insertOrder(ctx, tx, d, w.customer())
		}
		return exec1(ctx, tx, &d.stats.Updates, "UPDATE corder SET price = ?, sku = ? WHERE customer_id = ? AND order_id = ?",
			w.rng.Int64N(100000), w.sku(), cust, order)
	case r < 65: // an order's primary key
		cust, order, ok := w.order()
		if !ok {
			return w.insertOrder(ctx, tx, d, w.customer())
		}
		newID := w.id()
		if err := exec1(ctx, tx, &d.stats.Updates, "UPDATE corder SET order_id = ? WHERE customer_id = ? AND order_id = ?", newID, cust, order); err != nil {
			return err
		}
		d.stats.KeyUpdates++
		d.renamed[cust] = [2]int64{order, newID}
	case r < 75: // an order deleted
		cust, order, ok := w.order()
		if !ok {
			return w.insertOrder(ctx, tx, d, w.customer())
		}
		if err := exec1(ctx, tx, &d.stats.Deletes, "DELETE FROM corder WHERE customer_id = ? AND order_id = ?", cust, order); err != nil {
			return err
		}
		d.goneOrders[cust] = append(d.goneOrders[cust], order)
	case r < 80: // a customer deleted with its orders
		id := w.customer()
		res, err := tx.ExecContext(ctx, "DELETE FROM corder WHERE customer_id = ?", id)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		if int(n) != len(w.orders[id]) {
			return fmt.Errorf("workload: customer %d had %d orders, deleted %d", id, len(w.orders[id]), n)
		}
		d.stats.Deletes += int(n)
		if err := exec1(ctx, tx, &d.stats.Deletes, "DELETE FROM customer WHERE customer_id = ?", id); err != nil {
			return err
		}
		d.gone = append(d.gone, id)
	case r < 90: // several customers at once, often on both shards
		seen := map[int64]bool{}
		for range 2 + w.rng.IntN(2) {
			id := w.customer()
			if seen[id] {
				continue
			}
			seen[id] = true
			if err := exec1(ctx, tx, &d.stats.Updates, "UPDATE customer SET email = ? WHERE customer_id = ?", w.email(id), id); err != nil {
				return err
			}
		}
		return w.insertOrder(ctx, tx, d, w.customer())
	default: // one multi-row statement: every order of a customer repriced
		id := w.customer()
		res, err := tx.ExecContext(ctx, "UPDATE corder SET price = price + 1 WHERE customer_id = ?", id)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		d.stats.Updates += int(n)
	}
	return nil
}

func (w *Workload) insertOrder(ctx context.Context, tx *sql.Tx, d *delta, cust int64) error {
	id := w.id()
	if err := exec1(ctx, tx, &d.stats.Inserts, "INSERT INTO corder (order_id, customer_id, sku, price) VALUES (?, ?, ?, ?)",
		id, cust, w.sku(), w.rng.Int64N(100000)); err != nil {
		return err
	}
	d.newOrders[cust] = append(d.newOrders[cust], id)
	return nil
}

// exec1 runs a statement that must change exactly one row, counted in n.
func exec1(ctx context.Context, tx *sql.Tx, n *int, query string, args ...any) error {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	if got, err := res.RowsAffected(); err != nil || got != 1 {
		return fmt.Errorf("workload: %s %v changed %d rows, want 1 (%v)", query, args, got, err)
	}
	*n++
	return nil
}

func (w *Workload) id() int64 { id := w.nextID; w.nextID++; return id }

// email and sku are new values each time, so an update always changes its
// row (MySQL counts only changed rows as affected).
func (w *Workload) email(id int64) string {
	w.serial++
	return fmt.Sprintf("c%d-%d@example.com", id, w.serial)
}

func (w *Workload) sku() string {
	w.serial++
	return fmt.Sprintf("sku-%d-%d", w.rng.IntN(10000), w.serial)
}

// customer is a live customer at random (the caller made sure there is one).
func (w *Workload) customer() int64 { return w.customers[w.rng.IntN(len(w.customers))] }

// order is a live order at random: its customer and id.
func (w *Workload) order() (cust, order int64, ok bool) {
	for range 8 {
		c := w.customer()
		if os := w.orders[c]; len(os) > 0 {
			return c, os[w.rng.IntN(len(os))], true
		}
	}
	return 0, 0, false
}

// apply adds a committed transaction to what the writer knows and counts.
func (w *Workload) apply(d *delta) {
	w.customers = append(w.customers, d.newCustomers...)
	for c, os := range d.newOrders {
		w.orders[c] = append(w.orders[c], os...)
	}
	for c, ch := range d.renamed {
		w.orders[c] = replace(w.orders[c], ch[0], ch[1])
	}
	for c, os := range d.goneOrders {
		for _, o := range os {
			w.orders[c] = remove(w.orders[c], o)
		}
	}
	for _, c := range d.gone {
		w.customers = remove(w.customers, c)
		delete(w.orders, c)
	}
	w.mu.Lock()
	s := &w.stats
	s.Txs += d.stats.Txs
	s.MultiRowTxs += d.stats.MultiRowTxs
	s.Inserts += d.stats.Inserts
	s.Updates += d.stats.Updates
	s.KeyUpdates += d.stats.KeyUpdates
	s.Deletes += d.stats.Deletes
	w.mu.Unlock()
}

// reload reads the workload's live rows back from vtgate, after a failed
// transaction whose outcome is unknown.
func (w *Workload) reload(ctx context.Context, db *sql.DB) error {
	customers, err := queryInts(ctx, db, "SELECT customer_id FROM customer WHERE customer_id >= ?", w.opts.FirstID)
	if err != nil {
		return err
	}
	rows, err := db.QueryContext(ctx, "SELECT customer_id, order_id FROM corder WHERE order_id >= ?", w.opts.FirstID)
	if err != nil {
		return err
	}
	defer rows.Close()
	orders := map[int64][]int64{}
	for rows.Next() {
		var c, o int64
		if err := rows.Scan(&c, &o); err != nil {
			return err
		}
		orders[c] = append(orders[c], o)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	w.customers, w.orders = customers, orders
	for _, id := range customers {
		w.nextID = max(w.nextID, id+1)
	}
	for _, os := range orders {
		for _, id := range os {
			w.nextID = max(w.nextID, id+1)
		}
	}
	return nil
}

func queryInts(ctx context.Context, db *sql.DB, query string, args ...any) ([]int64, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, errors.Join(rows.Err())
}

func remove(s []int64, v int64) []int64 {
	for i, x := range s {
		if x == v {
			s[i] = s[len(s)-1]
			return s[:len(s)-1]
		}
	}
	return s
}

func replace(s []int64, old, new int64) []int64 {
	for i, x := range s {
		if x == old {
			s[i] = new
		}
	}
	return s
}
