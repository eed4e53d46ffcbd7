package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/tabletflow/tabletflow/bench/internal/pass"
	"github.com/tabletflow/tabletflow/bench/internal/rawlines"
	"github.com/tabletflow/tabletflow/internal/jsontext"
	"github.com/tabletflow/tabletflow/source/postgres"
)

// rawRun is the raw loop's result, and the end LSN of the workload's last
// transaction: where every reader is done.
type rawRun struct {
	pass.Figures
	last pglogrepl.LSN
}

// raw reads the raw slot on the standby with pglogrepl alone until want
// records are durable in dir/<shard>.jsonl, and times it from connecting
// to the last fsync.
func (b *bench) raw(ctx context.Context, dir string, want uint64) (rawRun, error) {
	ctx, cancel := context.WithTimeout(ctx, loopTimeout)
	defer cancel()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return rawRun{}, err
	}
	sb := b.shard().Standbys[0]
	cpu0 := b.cpu(0)
	l := &rawLoop{want: want, batch: b.batch, rels: map[uint32]*rawRelation{}}
	var err error
	if l.w, err = rawlines.Create(filepath.Join(dir, shardID+".jsonl"), "raw", shardID, (*os.File).Sync); err != nil {
		return rawRun{}, err
	}
	defer l.w.Close()
	if l.conn, err = pgconn.Connect(ctx, sb.ReplicationDSN()); err != nil {
		return rawRun{}, err
	}
	defer l.conn.Close(context.Background())
	// Primary keys come from the catalog, once per relation, as the
	// adapter's do.
	if l.catalog, err = pgx.Connect(ctx, sb.DSN()); err != nil {
		return rawRun{}, err
	}
	defer l.catalog.Close(context.Background())
	err = pglogrepl.StartReplication(ctx, l.conn, rawSlot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + postgres.PublicationName(flowID) + "'",
			"messages 'true'"},
	})
	if err != nil {
		return rawRun{}, fmt.Errorf("start replication: %w", err)
	}
	for l.w.Records < want {
		if err := l.receive(ctx); err != nil {
			return rawRun{}, fmt.Errorf("after %d records: %w", l.w.Records, err)
		}
	}
	took := time.Since(l.w.Began)
	if l.w.Records != want {
		return rawRun{}, fmt.Errorf("read %d records, the workload wrote %d", l.w.Records, want)
	}
	cpu := b.cpu(b.walsender(ctx, rawSlot)).Minus(cpu0)
	r := pass.New(want, took, l.w.FirstCommit, l.w.FirstCount, l.w.Batches, cpu)
	r.Split(took, l.w.InWrite, l.inAck)
	return rawRun{Figures: r, last: l.last}, nil
}

// rawLoop is the raw reader's state: the relations seen, the lines of
// the open transaction and of the batch.
type rawLoop struct {
	conn    *pgconn.PgConn
	catalog *pgx.Conn
	w       *rawlines.Writer
	want    uint64
	batch   int

	rels          map[uint32]*rawRelation
	last, flushed pglogrepl.LSN
	inAck         time.Duration // status updates
}

// rawRelation is a table as the raw loop writes it.
type rawRelation struct {
	msg   *pglogrepl.RelationMessage
	table string
	key   []bool // primary key columns
	ident []bool // replica identity columns: a key-only old tuple's
}

// receive handles one message from the server.
func (l *rawLoop) receive(ctx context.Context) error {
	msg, err := l.conn.ReceiveMessage(ctx)
	if err != nil {
		return err
	}
	switch m := msg.(type) {
	case *pgproto3.ErrorResponse:
		return pgconn.ErrorResponseToPgError(m)
	case *pgproto3.CopyData:
		if len(m.Data) == 0 {
			return nil
		}
		switch m.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
			if err != nil {
				return err
			}
			if k.ReplyRequested {
				return l.status()
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(m.Data[1:])
			if err != nil {
				return err
			}
			lm, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return fmt.Errorf("parse pgoutput message: %w", err)
			}
			return l.apply(ctx, lm)
		}
	}
	return nil
}

// apply handles one pgoutput message.
func (l *rawLoop) apply(ctx context.Context, msg pglogrepl.Message) error {
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		return l.relation(ctx, m)
	case *pglogrepl.BeginMessage:
		l.w.Begin()
	case *pglogrepl.InsertMessage:
		return l.add(m.RelationID, "insert", 0, nil, m.Tuple)
	case *pglogrepl.UpdateMessage:
		return l.add(m.RelationID, "update", m.OldTupleType, m.OldTuple, m.NewTuple)
	case *pglogrepl.DeleteMessage:
		return l.add(m.RelationID, "delete", m.OldTupleType, m.OldTuple, nil)
	case *pglogrepl.CommitMessage:
		return l.commit(m)
	}
	return nil
}

// relation keeps a table's description and reads its primary key.
func (l *rawLoop) relation(ctx context.Context, m *pglogrepl.RelationMessage) error {
	rows, err := l.catalog.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = $1
		AND attnum = ANY ((SELECT indkey FROM pg_index WHERE indrelid = $1 AND indisprimary)::int2[])`, m.RelationID)
	if err != nil {
		return err
	}
	pk, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("primary key of %s.%s: %w", m.Namespace, m.RelationName, err)
	}
	r := &rawRelation{msg: m, table: m.Namespace + "." + m.RelationName,
		key: make([]bool, len(m.Columns)), ident: make([]bool, len(m.Columns))}
	for i, c := range m.Columns {
		r.ident[i] = c.Flags&1 == 1
		r.key[i] = slices.Contains(pk, c.Name) || len(pk) == 0 && r.ident[i]
	}
	l.rels[m.RelationID] = r
	return nil
}

// add encodes one row change of the open transaction: table, op, key
// (from the new tuple, else the old), before (the old tuple: the identity's
// columns when only they came), after (the new tuple, unchanged TOAST
// values from the old one when it came).
func (l *rawLoop) add(rel uint32, op string, oldType uint8, old, new *pglogrepl.TupleData) error {
	r, ok := l.rels[rel]
	if !ok {
		return fmt.Errorf("%s on relation %d before its description", op, rel)
	}
	b := l.w.Record(r.table, op)
	keyFrom, keyFill := new, old
	if new == nil {
		keyFrom, keyFill = old, nil
	}
	var err error
	if b, err = appendTuple(b, r, keyFrom, keyFill, r.key); err != nil {
		return err
	}
	b = append(b, `,"before":`...)
	switch {
	case old == nil:
		b = append(b, "null"...)
	case oldType == pglogrepl.UpdateMessageTupleTypeKey:
		b, err = appendTuple(b, r, old, nil, r.ident)
	default:
		b, err = appendTuple(b, r, old, nil, nil)
	}
	if err != nil {
		return err
	}
	b = append(b, `,"after":`...)
	if new == nil {
		b = append(b, "null"...)
	} else if b, err = appendTuple(b, r, new, old, nil); err != nil {
		return err
	}
	l.w.Add(b)
	return nil
}

// commit numbers the transaction's records (commit end LSN, ordinal from
// 1) into the batch, and flushes the batch once it holds enough records
// or the last one due.
func (l *rawLoop) commit(m *pglogrepl.CommitMessage) error {
	if l.w.Open() == 0 {
		return nil
	}
	l.w.Commit(uint64(m.TransactionEndLSN), m.CommitTime)
	l.last = m.TransactionEndLSN
	if l.w.Pending() >= l.batch || l.w.Records >= l.want {
		return l.flush()
	}
	return nil
}

// flush writes the batch, fsyncs it, and acknowledges it to the server.
func (l *rawLoop) flush() error {
	if err := l.w.Flush(); err != nil {
		return err
	}
	written := time.Now()
	defer func() { l.inAck += time.Since(written) }()
	l.flushed = l.last
	return l.status()
}

// status tells the server what is durable.
func (l *rawLoop) status() error {
	return pglogrepl.SendStandbyStatusUpdate(context.Background(), l.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: l.flushed, WALFlushPosition: l.flushed, WALApplyPosition: l.flushed,
	})
}

// appendTuple appends a tuple as a JSON object in column order: the
// columns marked in only (nil: all), an unchanged TOAST value taken from
// fill when it has one and left out otherwise.
func appendTuple(b []byte, r *rawRelation, t, fill *pglogrepl.TupleData, only []bool) ([]byte, error) {
	cols := r.msg.Columns
	if len(t.Columns) != len(cols) {
		return b, fmt.Errorf("%s: %d values for %d columns", r.table, len(t.Columns), len(cols))
	}
	b = append(b, '{')
	n := 0
	for i, c := range cols {
		if only != nil && !only[i] {
			continue
		}
		v := t.Columns[i]
		if v.DataType == pglogrepl.TupleDataTypeToast {
			if fill == nil || fill.Columns[i].DataType == pglogrepl.TupleDataTypeToast {
				continue
			}
			v = fill.Columns[i]
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = jsontext.AppendString(b, c.Name)
		b = append(b, ':')
		switch v.DataType {
		case pglogrepl.TupleDataTypeNull:
			b = append(b, "null"...)
		case pglogrepl.TupleDataTypeText:
			b = appendValue(b, c.DataType, v.Data)
		default:
			return b, fmt.Errorf("%s.%s: value kind %q", r.table, c.Name, v.DataType)
		}
	}
	return append(b, '}'), nil
}

// Type OIDs written as JSON literals.
const (
	oidBool    = 16
	oidInt8    = 20
	oidInt2    = 21
	oidInt4    = 23
	oidOID     = 26
	oidJSON    = 114
	oidFloat4  = 700
	oidFloat8  = 701
	oidNumeric = 1700
	oidJSONB   = 3802
)

// appendValue appends a column's text form as JSON: booleans, integers
// and finite numbers as literals, json as it is, the rest as a string.
func appendValue(b []byte, oid uint32, text []byte) []byte {
	switch oid {
	case oidBool:
		if string(text) == "t" {
			return append(b, "true"...)
		}
		return append(b, "false"...)
	case oidInt2, oidInt4, oidInt8, oidOID:
		return append(b, text...)
	case oidFloat4, oidFloat8, oidNumeric:
		// NaN and ±Infinity end in a letter, every finite number in a digit.
		if n := len(text); n > 0 && text[n-1] >= '0' && text[n-1] <= '9' {
			return append(b, text...)
		}
	case oidJSON, oidJSONB:
		if json.Valid(text) {
			return append(b, text...)
		}
	}
	return jsontext.AppendString(b, text)
}
