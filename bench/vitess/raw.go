package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"
	queryservicepb "vitess.io/vitess/go/vt/proto/queryservice"
	topodatapb "vitess.io/vitess/go/vt/proto/topodata"

	"github.com/tabletflow/tabletflow/bench/internal/rawlines"
	"github.com/tabletflow/tabletflow/internal/jsontext"
	"github.com/tabletflow/tabletflow/testbed/vitessbed"
)

// rawRun is one raw pass's figures, and the term of the last transaction
// that held records: where every reader is done.
type rawRun struct {
	side
	lastTerm uint64
}

// raw reads the backlog with the replica's own VStream and nothing else,
// from w.from until the transaction at w.to, each row change encoded as
// the JSONL line tabletflow writes into dir/<shard>.jsonl, one write and
// fdatasync per batch of whole transactions of at least b.batch records.
// It is timed from opening the stream to the last fdatasync.
func (b *bench) raw(ctx context.Context, dir string, w written) (rawRun, error) {
	ctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	end, err := gtidCount(w.to)
	if err != nil {
		return rawRun{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return rawRun{}, err
	}
	l := &rawLoop{batch: b.batch, end: end, tables: map[string]*rawTable{}}
	if l.w, err = rawlines.Create(filepath.Join(dir, shardID+".jsonl"), "raw", shardID, fdatasync); err != nil {
		return rawRun{}, err
	}
	defer l.w.Close()
	conn, err := grpc.NewClient(b.replica().GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		return rawRun{}, err
	}
	defer conn.Close()

	b.flushDirty()
	cpu0 := b.cpu()
	l.w.Began = time.Now()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	stream, err := queryservicepb.NewQueryClient(conn).VStream(sctx, &binlogdatapb.VStreamRequest{
		Target:   &querypb.Target{Keyspace: vitessbed.Keyspace, Shard: shardID, TabletType: topodatapb.TabletType_REPLICA},
		Position: w.from,
		Filter:   &binlogdatapb.Filter{Rules: []*binlogdatapb.Rule{{Match: "/^(" + strings.Join(vitessbed.Tables, "|") + ")$/"}}},
	})
	if err != nil {
		return rawRun{}, fmt.Errorf("vstream from %s at %s: %w", b.replica().Alias, w.from, err)
	}
	for !l.done {
		resp, err := stream.Recv()
		if err != nil {
			return rawRun{}, fmt.Errorf("vstream after %d records: %w", l.w.Records, err)
		}
		for _, ev := range resp.Events {
			if err := l.event(ev); err != nil {
				return rawRun{}, fmt.Errorf("after %d records: %w", l.w.Records, err)
			}
			if l.done {
				break
			}
		}
	}
	took := time.Since(l.w.Began)
	cpu := b.cpu().Minus(cpu0)
	stop()
	if l.w.Records != w.records {
		return rawRun{}, fmt.Errorf("read %d records up to %s, the workload wrote %d", l.w.Records, w.to, w.records)
	}
	if l.lastTerm != end {
		return rawRun{}, fmt.Errorf("the last transaction with records is at %d, the workload ended at %s: something else wrote to the shard", l.lastTerm, w.to)
	}
	s := newSide("raw", w.records, took, l.w.FirstCommit, l.w.FirstCount, l.w.Batches, cpu)
	s.Split(took, l.w.InWrite, 0)
	return rawRun{side: s, lastTerm: l.lastTerm}, nil
}

// fdatasync makes a written batch durable, its data without the file's
// times.
func fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }

// rawLoop is the raw reader's state: the tables seen, the lines of the
// open transaction and of the batch.
type rawLoop struct {
	w     *rawlines.Writer
	batch int
	end   uint64 // stop after the transaction at this term

	tables   map[string]*rawTable
	gtid     string // the open transaction's
	lastTerm uint64
	done     bool
}

// rawTable is a table as its last FIELD event described it.
type rawTable struct {
	name   string
	fields []*querypb.Field
	keys   [][]byte // `"name":` per column
	pk     []bool
}

// event handles one VStream event: FIELD, ROW, GTID and COMMIT carry
// what the lines need; a transaction or statement past the end ends the
// loop.
func (l *rawLoop) event(ev *binlogdatapb.VEvent) error {
	switch ev.Type {
	case binlogdatapb.VEventType_BEGIN:
		l.w.Begin()
	case binlogdatapb.VEventType_FIELD:
		fe := ev.FieldEvent
		t := &rawTable{name: fe.TableName, fields: fe.Fields, keys: make([][]byte, len(fe.Fields)), pk: make([]bool, len(fe.Fields))}
		for i, f := range fe.Fields {
			t.keys[i] = append(jsontext.AppendString(nil, f.Name), ':')
			t.pk[i] = f.Flags&uint32(querypb.MySqlFlag_PRI_KEY_FLAG) != 0
		}
		l.tables[t.name] = t
	case binlogdatapb.VEventType_ROW:
		return l.row(ev.RowEvent)
	case binlogdatapb.VEventType_GTID:
		l.gtid = ev.Gtid
	case binlogdatapb.VEventType_COMMIT:
		return l.commit(ev.Timestamp)
	case binlogdatapb.VEventType_DDL, binlogdatapb.VEventType_OTHER:
		return l.past()
	}
	return nil
}

// row encodes a ROW event's changes: table, op, key (of the row after the
// change, before a delete), before and after.
func (l *rawLoop) row(re *binlogdatapb.RowEvent) error {
	t := l.tables[re.TableName]
	if t == nil {
		return fmt.Errorf("ROW event of %s before its FIELD event", re.TableName)
	}
	var err error
	for _, rc := range re.RowChanges {
		op := "update"
		switch {
		case rc.Before == nil:
			op = "insert"
		case rc.After == nil:
			op = "delete"
		}
		b := l.w.Record(t.name, op)
		keyFrom, present := rc.Before, (*binlogdatapb.RowChange_Bitmap)(nil)
		if rc.After != nil {
			keyFrom, present = rc.After, rc.DataColumns
		}
		if b, err = t.appendRow(b, keyFrom, present, t.pk); err != nil {
			return err
		}
		b = append(b, `,"before":`...)
		if rc.Before == nil {
			b = append(b, "null"...)
		} else if b, err = t.appendRow(b, rc.Before, nil, nil); err != nil {
			return err
		}
		b = append(b, `,"after":`...)
		if rc.After == nil {
			b = append(b, "null"...)
		} else if b, err = t.appendRow(b, rc.After, rc.DataColumns, nil); err != nil {
			return err
		}
		l.w.Add(b)
	}
	return nil
}

// appendRow appends a row image as a JSON object in column order: the
// columns marked in keep (nil: all) that present holds (nil: all).
// Integers are written as they come, NULL as null, text as a string; the
// workload's tables have no other kind of column.
func (t *rawTable) appendRow(b []byte, row *querypb.Row, present *binlogdatapb.RowChange_Bitmap, keep []bool) ([]byte, error) {
	b = append(b, '{')
	first := true
	off := int64(0)
	for i, n := range row.Lengths {
		var v []byte
		if n >= 0 {
			v = row.Values[off : off+n]
			off += n
		}
		if keep != nil && !keep[i] || present != nil && (int64(i) >= present.Count || present.Cols[i/8]&(1<<(uint(i)%8)) == 0) {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, t.keys[i]...)
		switch f := t.fields[i]; {
		case n < 0:
			b = append(b, "null"...)
		case f.Type == querypb.Type_INT64 || f.Type == querypb.Type_INT32:
			b = append(b, v...)
		case f.Type == querypb.Type_VARCHAR:
			b = jsontext.AppendString(b, v)
		default:
			return b, fmt.Errorf("%s.%s: type %s is not one of the workload's", t.name, f.Name, f.Type)
		}
	}
	return append(b, '}'), nil
}

// commit numbers the transaction's records (its GTID count, ordinal from
// 1) into the batch, and flushes the batch once it holds enough records
// or the end is reached.
func (l *rawLoop) commit(ts int64) error {
	if l.w.Open() == 0 {
		return l.past()
	}
	term, err := gtidCount(l.gtid)
	if err != nil {
		return err
	}
	l.w.Commit(term, time.Unix(ts, 0))
	l.lastTerm = term
	l.done = term >= l.end
	if l.w.Pending() >= l.batch || l.done {
		return l.w.Flush()
	}
	return nil
}

// past ends the loop at a transaction without records or a statement at
// or past the end (the workload's last transaction has records, so this
// is only a guard).
func (l *rawLoop) past() error {
	if l.gtid == "" {
		return nil
	}
	term, err := gtidCount(l.gtid)
	if err != nil {
		return err
	}
	if term >= l.end {
		l.done = true
		return l.w.Flush()
	}
	return nil
}

// gtidCount is how many transactions a MariaDB GTID position holds (the
// sum of its domains' sequence numbers), as the vitess source counts them
// for a position's term.
func gtidCount(pos string) (uint64, error) {
	set, ok := strings.CutPrefix(pos, "MariaDB/")
	if !ok {
		return 0, fmt.Errorf("GTID position %q: want MariaDB/<domain>-<server>-<sequence>,…", pos)
	}
	var n uint64
	for gtid := range strings.SplitSeq(set, ",") {
		parts := strings.Split(gtid, "-")
		if len(parts) != 3 {
			return 0, fmt.Errorf("GTID position %q: %q is not domain-server-sequence", pos, gtid)
		}
		seq, err := strconv.ParseUint(parts[2], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("GTID position %q: %w", pos, err)
		}
		n += seq
	}
	return n, nil
}
