package vitess

import (
	"fmt"
	"slices"
	"strings"
	"time"

	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"

	"github.com/tabletflow/tabletflow/source"
)

// backlogAge: a transaction the vttablet sends this long after its commit
// (commit times are whole seconds) is part of a backlog.
const backlogAge = 2 * time.Second

// decoder turns one shard's VStream events, in the order a vttablet sends
// them, into whole transactions of records. It is pure: no I/O, no clock.
//
// A vttablet sends a transaction as BEGIN, FIELD (a table's columns, the
// first time the stream meets it and after its schema changed), ROW
// events, GTID (the shard's position after the transaction) and COMMIT,
// possibly over several responses; a transaction whose rows are all of
// other tables still comes as BEGIN, GTID, COMMIT. A DDL or another
// statement comes as GTID then DDL or OTHER, a stream started at the
// current position first says where that is (GTID, OTHER), and an idle
// stream sends a HEARTBEAT about every second.
type decoder struct {
	shard string
	// last is the latest position handed out or to be (the checkpoint a
	// read started from, then each transaction's): every later one must
	// be after it.
	last   source.Checkpoint
	tables map[string]*table
	open   *txn
	// gtid is the position the last GTID event gave.
	gtid string
	// ready are transactions received whole, in order; idle is a position
	// after all of them with no transaction open (one that delivered no
	// records, a DDL, the start position), to which an empty read
	// advances.
	ready []whole
	idle  source.Checkpoint
	// beat: the last event was a HEARTBEAT (the vttablet had nothing to
	// send for about a second).
	beat bool
	// behind: the last transaction received was committed more than
	// backlogAge before the vttablet sent it (its COMMIT's CurrentTime):
	// a backlog is streaming, and more is on its way.
	behind bool
	// copy is where the copy of a stream that starts from a snapshot
	// stands (see copy.go); nil once COPY_COMPLETED came, or never copying.
	copy *copyState
	// keyspace and streamed (the stream's tables; none: all) say which
	// journals concern the stream.
	keyspace string
	streamed []string
	// end: a JOURNAL ended the shard's stream after the transactions
	// ready, with a Split into the new shards (or Failed: tables the
	// stream reads moved away); ended: later events are not read.
	end   *Error
	ended bool
	// at is the commit time of the last transaction received, which a
	// resync's end marker carries.
	at time.Time
}

// txn is a transaction being received.
type txn struct {
	records []source.Record
	// lastpk: a transaction of the copy, its rows copied, ending with the
	// last primary key of its table copied (or the table's end).
	lastpk *binlogdatapb.LastPKEvent
	// journal: the transaction wrote a resharding journal.
	journal *binlogdatapb.Journal
}

// whole is a transaction received to its commit: its records, numbered,
// and the checkpoint at its end.
type whole struct {
	cp      source.Checkpoint
	records []source.Record
}

func newDecoder(shard string, from source.Checkpoint) *decoder {
	return &decoder{shard: shard, last: from, tables: map[string]*table{}}
}

// add takes the events of one VStream response.
func (d *decoder) add(events []*binlogdatapb.VEvent) error {
	for _, ev := range events {
		if err := d.event(ev); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) event(ev *binlogdatapb.VEvent) error {
	if d.ended {
		return nil
	}
	d.beat = false
	switch ev.Type {
	case binlogdatapb.VEventType_BEGIN:
		if d.open != nil && len(d.open.records) > 0 {
			return fmt.Errorf("BEGIN inside an open transaction of shard %s", d.shard)
		}
		d.open = &txn{}
	case binlogdatapb.VEventType_FIELD:
		t, err := tableOf(ev.FieldEvent)
		if err != nil {
			return err
		}
		if !ev.FieldEvent.IsInternalTable {
			d.tables[t.name] = t
		}
	case binlogdatapb.VEventType_ROW:
		return d.row(ev)
	case binlogdatapb.VEventType_GTID:
		if ev.Gtid == "" {
			return fmt.Errorf("GTID event without a position on shard %s", d.shard)
		}
		d.gtid = ev.Gtid
	case binlogdatapb.VEventType_COMMIT:
		return d.commit(ev)
	case binlogdatapb.VEventType_ROLLBACK:
		d.open = nil
	case binlogdatapb.VEventType_DDL, binlogdatapb.VEventType_OTHER:
		// A statement outside any transaction (the position before it came
		// in a GTID event): the shard is at a new position. A TRUNCATE of
		// a streamed table (a vttablet sends a DDL only for those) is a
		// record of its own.
		if d.open == nil || len(d.open.records) == 0 {
			d.open = nil
			if table, ok := truncated(ev.Statement); ok && ev.Type == binlogdatapb.VEventType_DDL {
				return d.truncate(table, ev.Timestamp)
			}
			return d.advance()
		}
	case binlogdatapb.VEventType_HEARTBEAT:
		d.beat, d.behind = true, false
	case binlogdatapb.VEventType_JOURNAL:
		if d.open == nil {
			d.open = &txn{}
		}
		d.open.journal = ev.Journal
	case binlogdatapb.VEventType_LASTPK:
		if d.copy == nil || ev.LastPKEvent.GetTableLastPK() == nil {
			return fmt.Errorf("shard %s sent a LASTPK event outside a copy", d.shard)
		}
		if d.open == nil {
			return fmt.Errorf("LASTPK event of %s outside a transaction on shard %s", ev.LastPKEvent.TableLastPK.TableName, d.shard)
		}
		d.open.lastpk = ev.LastPKEvent
	case binlogdatapb.VEventType_COPY_COMPLETED:
		done := d.copy
		d.copy = nil
		if done != nil && done.resync != "" {
			return d.marker(d.at, source.ResyncEnd)
		}
	case binlogdatapb.VEventType_INSERT, binlogdatapb.VEventType_UPDATE, binlogdatapb.VEventType_DELETE,
		binlogdatapb.VEventType_REPLACE:
		return newError(source.Fatal, "STATEMENT_BINLOG",
			"shard %s sent a statement-based change (%s): the stream needs row-based binary logs (binlog_format=ROW)", d.shard, ev.Type)
	}
	// VGTID, VERSION, SAVEPOINT, ROWS_QUERY, PREVIOUS_GTIDS, SET:
	// nothing to deliver.
	return nil
}

// row adds a ROW event's changes to the open transaction as records.
func (d *decoder) row(ev *binlogdatapb.VEvent) error {
	re := ev.RowEvent
	if re == nil {
		return fmt.Errorf("ROW event without rows on shard %s", d.shard)
	}
	if re.IsInternalTable {
		return nil
	}
	if d.open == nil {
		return fmt.Errorf("ROW event of %s outside a transaction on shard %s", re.TableName, d.shard)
	}
	t := d.tables[re.TableName]
	if t == nil {
		return fmt.Errorf("ROW event of %s before its FIELD event on shard %s", re.TableName, d.shard)
	}
	for _, rc := range re.RowChanges {
		if rc.JsonPartialValues != nil && slices.ContainsFunc(rc.JsonPartialValues.Cols, func(b byte) bool { return b != 0 }) {
			return newError(source.Fatal, "PARTIAL_JSON",
				"a change of %s holds a partial JSON update (binlog_row_value_options=PARTIAL_JSON): the stream needs whole values", t.name)
		}
		rec := source.Record{Tablet: d.shard, Table: t.name, Types: t.types}
		var err error
		switch {
		case rc.Before == nil && rc.After != nil:
			rec.Op = source.Insert
		case rc.Before != nil && rc.After != nil:
			rec.Op = source.Update
		case rc.Before != nil:
			rec.Op = source.Delete
		default:
			return fmt.Errorf("change of %s with neither a before nor an after image on shard %s", t.name, d.shard)
		}
		if rc.Before != nil {
			if rec.Before, err = t.rowJSON(rc.Before, nil, nil); err != nil {
				return err
			}
		}
		keyFrom, present := rc.Before, (*binlogdatapb.RowChange_Bitmap)(nil)
		if rc.After != nil {
			if rec.After, err = t.rowJSON(rc.After, rc.DataColumns, nil); err != nil {
				return err
			}
			keyFrom, present = rc.After, rc.DataColumns
		}
		// The key of the row as it is after the change (before a delete):
		// an update that changes the key has the old one in before.
		if rec.Key, err = t.rowJSON(keyFrom, present, t.pk); err != nil {
			return err
		}
		d.open.records = append(d.open.records, rec)
	}
	return nil
}

// commit ends the open transaction at the last GTID event's position.
// The rows of a transaction of the copy are Read records, numbered after
// the records delivered at the same position before (see copy.go).
func (d *decoder) commit(ev *binlogdatapb.VEvent) error {
	open := d.open
	d.open = nil
	if ev.Timestamp > 0 {
		d.at = time.Unix(ev.Timestamp, 0).UTC()
	}
	d.behind = ev.CurrentTime > 0 && ev.Timestamp > 0 && time.Duration(ev.CurrentTime-ev.Timestamp*int64(time.Second)) > backlogAge
	if open != nil && open.journal != nil {
		end, err := d.journal(open.journal)
		if err != nil || end == nil {
			return err
		}
		d.end, d.ended = end, true
	}
	if open != nil && open.lastpk != nil {
		d.copy.advance(open.lastpk)
	}
	if open == nil || len(open.records) == 0 {
		return d.advance()
	}
	if d.gtid == "" {
		return fmt.Errorf("COMMIT without a GTID position on shard %s", d.shard)
	}
	var base uint64 // records delivered at the position before
	if open.lastpk != nil {
		c, err := count(d.gtid)
		if err != nil {
			return newError(source.Fatal, "BAD_POSITION", "shard %s: %v", d.shard, err)
		}
		if c == d.last.Term {
			base = d.last.Index
		}
		for i := range open.records {
			open.records[i].Op = source.Read
		}
	}
	cp, err := d.next(base, uint64(len(open.records)), open.lastpk != nil)
	if err != nil {
		return err
	}
	at := time.Unix(ev.Timestamp, 0).UTC()
	for i := range open.records {
		r := &open.records[i]
		r.Position = source.Checkpoint{Term: cp.Term, Index: base + uint64(i+1)}
		r.CommitTime = at
	}
	d.ready = append(d.ready, whole{cp: cp, records: open.records})
	d.idle = source.Checkpoint{}
	return nil
}

// truncate makes a TRUNCATE of table a transaction of one record at the
// last GTID event's position.
func (d *decoder) truncate(table string, ts int64) error {
	if d.gtid == "" {
		return fmt.Errorf("TRUNCATE of %s without a GTID position on shard %s", table, d.shard)
	}
	cp, err := d.next(0, 1, false)
	if err != nil {
		return err
	}
	rec := source.Record{Tablet: d.shard, Position: source.Checkpoint{Term: cp.Term, Index: 1}, CommitTime: time.Unix(ts, 0).UTC(),
		Table: table, Op: source.Truncate}
	d.ready = append(d.ready, whole{cp: cp, records: []source.Record{rec}})
	d.idle = source.Checkpoint{}
	return nil
}

// resumed delivers the markers of a resync whose copy a stream opened
// at state goes on with (copying: the copy has tables left; at: now):
// ResyncBegin when it has copied nothing yet, ResyncEnd when nothing is
// left (the copy ended before its end marker was delivered).
func (d *decoder) resumed(state *copyState, copying bool, at time.Time) error {
	var ops []source.Op
	if state.resync == "" {
		return nil
	}
	if !state.begun() {
		ops = append(ops, source.ResyncBegin)
	}
	if !copying {
		ops = append(ops, source.ResyncEnd)
	}
	return d.marker(at, ops...)
}

// marker makes a resync's markers (none: nothing) one transaction at the
// last GTID event's position, after the records delivered there before.
// A zero at (a copy's COMMIT has no time) is filled in by the reader.
func (d *decoder) marker(at time.Time, ops ...source.Op) error {
	if len(ops) == 0 {
		return nil
	}
	c, err := count(d.gtid)
	if err != nil {
		return newError(source.Fatal, "BAD_POSITION", "shard %s: %v", d.shard, err)
	}
	var base uint64
	if c == d.last.Term {
		base = d.last.Index
	}
	cp, err := d.next(base, uint64(len(ops)), true)
	if err != nil {
		return err
	}
	recs := make([]source.Record, len(ops))
	for i, op := range ops {
		recs[i] = source.Record{Tablet: d.shard, Position: source.Checkpoint{Term: cp.Term, Index: base + uint64(i+1)}, CommitTime: at, Op: op}
	}
	d.ready = append(d.ready, whole{cp: cp, records: recs})
	d.idle = source.Checkpoint{}
	return nil
}

// truncated returns the table a TRUNCATE statement empties ("truncate
// table `customer`", "TRUNCATE commerce.customer"), without its
// database.
func truncated(stmt string) (string, bool) {
	f := strings.Fields(stmt)
	if len(f) < 2 || !strings.EqualFold(f[0], "truncate") {
		return "", false
	}
	name := f[1]
	if strings.EqualFold(name, "table") {
		if len(f) < 3 {
			return "", false
		}
		name = f[2]
	}
	name = strings.TrimRight(name, ";")
	if i := strings.LastIndex(name, "."); i >= 0 {
		name = name[i+1:]
	}
	name = strings.Trim(name, "`")
	return name, name != ""
}

// advance makes the last GTID event's position the idle position, when it
// is past everything handed out or ready.
func (d *decoder) advance() error {
	if d.gtid == "" {
		return nil
	}
	c, err := count(d.gtid)
	if err != nil {
		return err
	}
	if c <= d.last.Term {
		return nil // where the read started, or a statement with no transaction of its own
	}
	cp, err := d.next(0, 0, false)
	if err != nil {
		return err
	}
	d.idle = cp
	return nil
}

// next is the checkpoint at the last GTID event's position after n
// records delivered there after base others, which must be after every
// one before it: at a new position, or, for the copy's rows (copied), at
// the position of the records before them after their base.
func (d *decoder) next(base, n uint64, copied bool) (source.Checkpoint, error) {
	opaque := d.gtid
	if d.copy != nil {
		suffix, err := d.copy.suffix()
		if err != nil {
			return source.Checkpoint{}, err
		}
		opaque += suffix
	}
	cp, err := checkpointAt(opaque, base+n)
	if err != nil {
		return source.Checkpoint{}, newError(source.Fatal, "BAD_POSITION", "shard %s: %v", d.shard, err)
	}
	if !(cp.Term > d.last.Term || copied && cp.Term == d.last.Term && cp.Index > d.last.Index) {
		return source.Checkpoint{}, newError(source.Fatal, "POSITION_ORDER",
			"shard %s: a transaction at %s comes after %s, whose position holds as many transactions or more: the vttablets' GTID histories differ",
			d.shard, cp.Opaque, d.last)
	}
	d.last = cp
	return cp, nil
}

// take returns up to max records of whole transactions (one larger than
// max comes whole, alone) and the checkpoint after them; none ready: the
// idle position if there is one, else from.
func (d *decoder) take(max int, from source.Checkpoint) ([]source.Record, source.Checkpoint) {
	var out []source.Record
	cp := from
	for len(d.ready) > 0 && (len(out) == 0 || len(out)+len(d.ready[0].records) <= max) {
		t := d.ready[0]
		d.ready = d.ready[1:]
		out = append(out, t.records...)
		cp = t.cp
	}
	// The idle position is after every transaction received whole and
	// before any still open.
	if len(d.ready) == 0 && d.idle.Compare(cp) > 0 {
		cp, d.idle = d.idle, source.Checkpoint{}
	}
	return out, cp
}

// records counts the records ready.
func (d *decoder) records() int {
	n := 0
	for _, t := range d.ready {
		n += len(t.records)
	}
	return n
}
