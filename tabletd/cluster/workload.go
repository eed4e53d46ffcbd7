package cluster

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tabletflow/tabletflow/internal/jsontext"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
)

// tableNames are the tables the workload writes.
var tableNames = []string{"customers", "orders", "payments"}

// liveRowsTarget is how many rows per table the workload keeps alive; it
// inserts more below it and deletes more above it, so memory stays flat.
const liveRowsTarget = 2000

// Workload states.
const (
	stateRunning = "running"
	statePaused  = "paused"
	stateStopped = "stopped"
)

// workload writes inserts, updates and deletes with before and after images
// over a few tables, at a rate.
type workload struct {
	c *Cluster

	mu      sync.Mutex
	rng     *rand.Rand
	state   string
	rate    float64
	written uint64
	nextID  int64
	rows    map[string]*rowSet
	// routing counts the changes made (rows already changed) but not yet
	// in their tablet's log: a resync waits for none, holding mu, to copy
	// rows that are exactly what the logs hold.
	routing sync.WaitGroup
	done    chan struct{}
	stopped sync.WaitGroup
}

// rowSet is a table's live rows, with O(1) random pick and removal.
type rowSet struct {
	ids  []int64
	pos  map[int64]int
	rows map[int64]map[string]any
}

func newWorkload(c *Cluster, rate float64, seed int64) *workload {
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	w := &workload{
		c:     c,
		rng:   rand.New(rand.NewPCG(uint64(seed), 0x7ab1e7f10)),
		state: stateRunning,
		rate:  rate,
		rows:  map[string]*rowSet{},
		done:  make(chan struct{}),
	}
	if rate == 0 {
		w.state = statePaused
	}
	for _, t := range tableNames {
		w.rows[t] = &rowSet{pos: map[int64]int{}, rows: map[int64]map[string]any{}}
	}
	return w
}

func (w *workload) start() {
	w.stopped.Add(1)
	go w.loop()
}

func (w *workload) close() {
	close(w.done)
	w.stopped.Wait()
}

// loop writes rate records per second in 10 ms steps.
func (w *workload) loop() {
	defer w.stopped.Done()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	due := 0.0
	for {
		select {
		case <-w.done:
			return
		case now := <-tick.C:
			w.mu.Lock()
			running, rate := w.state == stateRunning, w.rate
			w.mu.Unlock()
			if running {
				due += rate * now.Sub(last).Seconds()
			} else {
				due = 0
			}
			last = now
			if n := int(due); n > 0 {
				due -= float64(n)
				w.generate(n, true)
			}
		}
	}
}

// control applies a workload command and returns the state after it.
func (w *workload) control(req *sourcepb.WorkloadRequest) (*sourcepb.WorkloadResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch req.Action {
	case sourcepb.WorkloadRequest_STATUS:
	case sourcepb.WorkloadRequest_PAUSE:
		if w.state == stateRunning {
			w.state = statePaused
		}
	case sourcepb.WorkloadRequest_RESUME:
		if w.state == stateStopped {
			return nil, errf(codeFailedPrecondition, sourcepb.Reason_BAD_REQUEST, "action", "the workload was stopped for good; restart tabletd")
		}
		w.state = stateRunning
	case sourcepb.WorkloadRequest_STOP:
		w.state = stateStopped
	case sourcepb.WorkloadRequest_RATE:
		if req.Rate < 0 || req.Rate > 10_000_000 || req.Rate != req.Rate {
			return nil, errBadRequest("rate", "%v not in [0, 10000000]", req.Rate)
		}
		w.rate = req.Rate
	default:
		return nil, errBadRequest("action", "unknown action %d", req.Action)
	}
	return &sourcepb.WorkloadResponse{State: w.state, Rate: w.rate, Records: w.written}, nil
}

// write generates and appends n records, whatever the workload's state.
func (w *workload) write(n int) { w.generate(n, false) }

// generate makes and appends up to n records; with whileRunning it stops
// as soon as the workload is paused or stopped. A rate above what tabletd
// can write makes the loop fall behind and catch up in ever larger steps;
// a pause cuts the step it lands in, so nothing is written after PAUSE
// answers, and a preload can ask for "as fast as you can" (a rate far
// above that) without overshooting.
func (w *workload) generate(n int, whileRunning bool) {
	for range n {
		w.mu.Lock()
		if whileRunning && w.state != stateRunning {
			w.mu.Unlock()
			return
		}
		r, h := w.next()
		w.written++
		w.routing.Add(1)
		w.mu.Unlock()
		w.c.route(r, h)
		w.routing.Done()
	}
}

// writeTo appends n inserts into one tablet, drawing fresh keys until they
// hash into it. The rows are not kept live (they are never updated).
func (w *workload) writeTo(tabletID string, n int) error {
	w.c.mu.RLock()
	t := w.c.tablets[tabletID]
	w.c.mu.RUnlock()
	if t == nil {
		return errUnknownTablet(tabletID)
	}
	for written := 0; written < n; {
		w.mu.Lock()
		w.nextID++
		id := w.nextID
		key := keyJSON(id)
		h := keyHash("orders", key)
		if !t.contains(h) {
			w.mu.Unlock()
			continue
		}
		r := &sourcepb.Record{Table: "orders", Op: sourcepb.Op_INSERT, Key: key, After: mustJSON(w.newRow("orders", id))}
		w.written++
		w.routing.Add(1)
		w.mu.Unlock()
		w.c.route(r, h)
		w.routing.Done()
		written++
	}
	return nil
}

// next makes one change. Callers hold mu.
func (w *workload) next() (*sourcepb.Record, uint64) {
	table := tableNames[w.rng.IntN(len(tableNames))]
	rs := w.rows[table]
	p := w.rng.IntN(100)
	insertP, updateP := 60, 90 // below the target: mostly inserts
	if len(rs.ids) >= liveRowsTarget {
		insertP, updateP = 30, 70
	}
	r := &sourcepb.Record{Table: table}
	switch {
	case p < insertP || len(rs.ids) == 0:
		w.nextID++
		id := w.nextID
		row := w.newRow(table, id)
		rs.add(id, row)
		r.Op, r.Key, r.After = sourcepb.Op_INSERT, keyJSON(id), mustJSON(row)
	case p < updateP:
		id := rs.ids[w.rng.IntN(len(rs.ids))]
		before := rs.rows[id]
		after := w.updated(table, before)
		rs.rows[id] = after
		r.Op, r.Key, r.Before, r.After = sourcepb.Op_UPDATE, keyJSON(id), mustJSON(before), mustJSON(after)
	default:
		id := rs.ids[w.rng.IntN(len(rs.ids))]
		r.Op, r.Key, r.Before = sourcepb.Op_DELETE, keyJSON(id), mustJSON(rs.rows[id])
		rs.remove(id)
	}
	return r, keyHash(table, r.Key)
}

var (
	tiers    = []string{"bronze", "silver", "gold"}
	statuses = []string{"new", "paid", "shipped", "delivered"}
	methods  = []string{"card", "bank", "wallet"}
)

// newRow makes a row; amounts are decimal strings, as a database driver
// returns NUMERIC, so every consumer reads them back exactly.
func (w *workload) newRow(table string, id int64) map[string]any {
	switch table {
	case "customers":
		return map[string]any{"id": id, "name": fmt.Sprintf("customer-%d", id),
			"email": fmt.Sprintf("c%d@example.com", id), "tier": tiers[w.rng.IntN(len(tiers))], "version": 1}
	case "orders":
		return map[string]any{"id": id, "customer_id": w.rng.Int64N(100000), "status": statuses[0],
			"amount": w.amount(), "items": 1 + w.rng.IntN(9), "version": 1}
	default:
		return map[string]any{"id": id, "order_id": w.rng.Int64N(100000), "amount": w.amount(),
			"method": methods[w.rng.IntN(len(methods))], "version": 1}
	}
}

// updated returns a copy of row with one field changed and version bumped.
func (w *workload) updated(table string, row map[string]any) map[string]any {
	out := make(map[string]any, len(row))
	for k, v := range row {
		out[k] = v
	}
	out["version"] = row["version"].(int) + 1
	switch table {
	case "customers":
		out["tier"] = tiers[w.rng.IntN(len(tiers))]
	case "orders":
		out["status"] = statuses[w.rng.IntN(len(statuses))]
	default:
		out["amount"] = w.amount()
	}
	return out
}

func (w *workload) amount() string {
	return fmt.Sprintf("%d.%02d", w.rng.IntN(1000), w.rng.IntN(100))
}

// Rows returns the workload's live rows, of one table or (table "") of
// every table, and of one tablet's key range or (tablet "") of all,
// ordered by table, then id. Rows appended with WriteTo are not among them
// (they are not kept).
func (c *Cluster) Rows(table, tablet string) ([]*sourcepb.Row, error) {
	tables := tableNames
	if table != "" {
		if !slices.Contains(tableNames, table) {
			return nil, errBadRequest("table", "%q is not a workload table (%s)", table, strings.Join(tableNames, ", "))
		}
		tables = []string{table}
	}
	in := func(string, []byte) bool { return true }
	if tablet != "" {
		c.mu.RLock()
		t := c.tablets[tablet]
		c.mu.RUnlock()
		if t == nil {
			return nil, errUnknownTablet(tablet)
		}
		in = func(table string, key []byte) bool { return t.contains(keyHash(table, key)) }
	}
	w := c.workload
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rowsOf(tables, in), nil
}

// rowsOf returns the live rows of tables whose key in accepts, ordered by
// table, then id. Callers hold mu.
func (w *workload) rowsOf(tables []string, in func(table string, key []byte) bool) []*sourcepb.Row {
	var out []*sourcepb.Row
	for _, t := range tables {
		rs := w.rows[t]
		ids := slices.Clone(rs.ids)
		slices.Sort(ids)
		for _, id := range ids {
			if key := keyJSON(id); in(t, key) {
				out = append(out, &sourcepb.Row{Table: t, Key: key, Row: mustJSON(rs.rows[id])})
			}
		}
	}
	return out
}

func (rs *rowSet) add(id int64, row map[string]any) {
	rs.pos[id] = len(rs.ids)
	rs.ids = append(rs.ids, id)
	rs.rows[id] = row
}

func (rs *rowSet) remove(id int64) {
	i := rs.pos[id]
	last := rs.ids[len(rs.ids)-1]
	rs.ids[i] = last
	rs.pos[last] = i
	rs.ids = rs.ids[:len(rs.ids)-1]
	delete(rs.pos, id)
	delete(rs.rows, id)
}

// keyJSON is a row's key, {"id":N}: what mustJSON makes of it.
func keyJSON(id int64) []byte {
	return append(strconv.AppendInt(append(make([]byte, 0, 24), `{"id":`...), id, 10), '}')
}

// mustJSON encodes workload rows, which are maps of strings and integers and
// always encode; the keys come out sorted (canonical form). It writes the
// bytes encoding/json would, without its reflection over a map (most of
// what generating a record cost): integers and strings directly, a row
// holding anything else through encoding/json.
func mustJSON(v map[string]any) []byte {
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b := append(make([]byte, 0, 128), '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(jsontext.AppendString(b, k), ':')
		switch x := v[k].(type) {
		case int:
			b = strconv.AppendInt(b, int64(x), 10)
		case int64:
			b = strconv.AppendInt(b, x, 10)
		case string:
			b = jsontext.AppendString(b, x)
		default:
			return marshalRow(v)
		}
	}
	return append(b, '}')
}

func marshalRow(v map[string]any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("workload row does not encode: %v", err)) // a programming error
	}
	return b
}

// keyHash places a row's key in the 64-bit key space: FNV-1a, then a
// splitmix64 finaliser so that short keys spread over the high bits too.
func keyHash(table string, key []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(table))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write(key)
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// route appends a record to the active tablet that owns its key hash,
// routing again if that tablet split meanwhile.
func (c *Cluster) route(r *sourcepb.Record, h uint64) {
	for {
		c.mu.RLock()
		i := sort.Search(len(c.active), func(i int) bool { return c.active[i].keyEnd == 0 || c.active[i].keyEnd > h })
		t := c.active[i]
		c.mu.RUnlock()
		r.Tablet = t.id
		if t.log.append(r, c.now()) {
			return
		}
	}
}
