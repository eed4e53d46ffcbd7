package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/source"
)

// table is the source table every record is a change of.
const table = "orders"

// workload is the records every path stores, made once: per tablet, a log
// of changes to orders, each order's key unique across tablets (so apply
// mode may keep them in one mirror table).
type workload struct {
	tablets []string
	logs    map[string][]source.Record // per tablet, in log order
	records int
	// jsonBytes: key, before and after together, over every record.
	jsonBytes int64
	ops       map[source.Op]int
	// digest is what every path must store, as digest.Hash counts it.
	digest digest.Digest
	// live is each order that is there after the last record, by its key's
	// id, with its revision: what apply mode's mirror table must hold.
	live map[string]int
}

// order is one row of the source table as the workload knows it.
type order struct {
	id, qty, rev, cents int
	customer, status    string
	updated             time.Time
}

var statuses = []string{"new", "paid", "packed", "shipped", "delivered"}

// image is the row's JSON in canonical form (compact, keys sorted), as
// tabletd sends rows: about 190 bytes.
func (o *order) image() json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"customer":%q,"id":%d,"note":"ring twice, \"back door\"","qty":%d,"rev":%d,`+
		`"sku":"sku-%08d","status":%q,"total":"%d.%02d","updated_at":%q}`,
		o.customer, o.id, o.qty, o.rev, o.id%100_000_000, o.status, o.cents/100, o.cents%100,
		o.updated.Format(time.RFC3339Nano)))
}

func (o *order) key() json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"id":%d}`, o.id)) }

// newWorkload makes records changes spread evenly over tablets tablets
// (t-0001, …). Each tablet's log, at positions 1.1, 1.2, …, repeats a
// cycle of 20: 10 inserts of new orders, 7 updates of a live order picked
// at random (before and after: the whole row, REPLICA IDENTITY FULL style)
// and 3 deletes of the oldest live order. Commit times are about 1 ms
// apart and carry nanoseconds. The same arguments give the same records.
func newWorkload(records, tablets int) *workload {
	w := &workload{logs: map[string][]source.Record{}, ops: map[source.Op]int{}, live: map[string]int{}}
	base := time.Date(2026, 11, 30, 10, 0, 0, 123456789, time.UTC)
	for t := range tablets {
		tablet := fmt.Sprintf("t-%04d", t+1)
		w.tablets = append(w.tablets, tablet)
		n := records / tablets
		if t < records%tablets {
			n++
		}
		rng := rand.New(rand.NewPCG(uint64(t+1), 2026))
		rows := map[int]*order{}
		var ids []int // live orders, oldest first from head
		head, next := 0, (t+1)*1_000_000_000
		log := make([]source.Record, 0, n)
		for i := range n {
			at := base.Add(time.Duration(i) * 1001 * time.Microsecond)
			r := source.Record{Tablet: tablet, Position: source.Checkpoint{Term: 1, Index: uint64(i + 1)}, CommitTime: at, Table: table}
			switch c := i % 20; {
			case c >= 10 && c < 17 && head < len(ids):
				o := rows[ids[head+rng.IntN(len(ids)-head)]]
				r.Op, r.Key, r.Before = source.Update, o.key(), o.image()
				o.rev, o.updated = o.rev+1, at
				o.status = statuses[o.rev%len(statuses)]
				o.qty += rng.IntN(3)
				r.After = o.image()
			case c >= 17 && head < len(ids):
				o := rows[ids[head]]
				head++
				delete(rows, o.id)
				r.Op, r.Key, r.Before = source.Delete, o.key(), o.image()
			default:
				next++
				o := &order{id: next, qty: 1 + rng.IntN(9), rev: 1, cents: 500 + rng.IntN(100_000),
					customer: fmt.Sprintf("c-%06d", rng.IntN(1_000_000)), status: statuses[0], updated: at}
				rows[o.id] = o
				ids = append(ids, o.id)
				r.Op, r.Key, r.After = source.Insert, o.key(), o.image()
			}
			w.ops[r.Op]++
			w.jsonBytes += int64(len(r.Key) + len(r.Before) + len(r.After))
			w.digest.Add(digest.Hash(digest.Fields{Tablet: r.Tablet, Position: r.Position.String(), Table: r.Table,
				Op: string(r.Op), Key: r.Key, Before: r.Before, After: r.After, CommitTime: r.CommitTime}))
			log = append(log, r)
		}
		for id, o := range rows {
			w.live[fmt.Sprint(id)] = o.rev
		}
		w.logs[tablet] = log
		w.records += n
	}
	return w
}

// batches splits a tablet's log into batches of size records.
func batches(log []source.Record, size int) [][]source.Record {
	var out [][]source.Record
	for len(log) > 0 {
		n := min(size, len(log))
		out = append(out, log[:n])
		log = log[n:]
	}
	return out
}
