package pgbed

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tabletflow/tabletflow/source"
)

// TextTables are tables as the CDC proofs compare them: table → row key
// (the record key's JSON, {"id":N} for the bed's tables) → column → the
// value's text form as PostgreSQL prints it (nil for null).
type TextTables map[string]map[string]map[string]any

// Replay applies change records in order to empty tables: an insert or
// update sets the row at its key (a column an update leaves out, an
// unchanged TOAST value, keeps its value), a delete removes it. It fails on
// an insert of a row it has, a delete or update of one it does not have,
// or a malformed record.
func Replay(recs []source.Record) (TextTables, error) { return replay(recs, false, false) }

// ReplaySnapshot is Replay for a stream that began with a snapshot: a Read
// record sets its row; changes may come before a row's Read (the row was
// there before the stream and is copied later) or again after it (the copy
// already held them), so an insert sets its row, an update of a row the
// replay does not have sets it from after, and a delete of one it does not
// have does nothing.
func ReplaySnapshot(recs []source.Record) (TextTables, error) { return replay(recs, true, false) }

// ReplayAdhoc is Replay for a stream that started without a copy and was
// given an ad-hoc snapshot (rows that were there before the stream
// arrive as Read records, woven into its changes): as Replay until the
// first Read record, as ReplaySnapshot from there on.
func ReplayAdhoc(recs []source.Record) (TextTables, error) { return replay(recs, false, true) }

// Both replays follow a resync's markers (one shard's records): at a
// resync-begin the tables start empty again and the rest is replayed as
// ReplaySnapshot does; a resync-end changes nothing.

func replay(recs []source.Record, lenient, fromRead bool) (TextTables, error) {
	out := TextTables{}
	for _, r := range recs {
		if fromRead && r.Op == source.Read {
			lenient = true
		}
		switch r.Op {
		case source.ResyncBegin:
			out, lenient = TextTables{}, true
			continue
		case source.ResyncEnd:
			continue
		}
		tbl := out[r.Table]
		if tbl == nil {
			tbl = map[string]map[string]any{}
			out[r.Table] = tbl
		}
		key := string(r.Key)
		_, has := tbl[key]
		switch {
		case lenient && r.Op == source.Delete && !has:
			continue
		case !lenient && r.Op == source.Read:
			return nil, fmt.Errorf("%s %s at %s: a read record in a stream without a snapshot", r.Table, key, r.Position)
		case !lenient && has == (r.Op == source.Insert):
			// The bed's workload never reuses a key: a second insert is a
			// record delivered twice, an update or delete of a missing row
			// one lost.
			return nil, fmt.Errorf("%s %s at %s: %s of a row the replay has=%v", r.Table, key, r.Position, r.Op, has)
		}
		if r.Op == source.Delete {
			delete(tbl, key)
			continue
		}
		row := map[string]any{}
		if r.Op == source.Update { // the bed's workload never changes a key
			for k, v := range tbl[key] {
				row[k] = v
			}
		}
		after, err := TextRow(r.After)
		if err != nil {
			return nil, fmt.Errorf("%s %s at %s: after: %w", r.Table, key, r.Position, err)
		}
		for k, v := range after {
			row[k] = v
		}
		tbl[key] = row
	}
	return out, nil
}

// TextRow turns a JSON object of a row (a record's after image, a mirror
// table's row) into column → text form: a string as it is, null as nil,
// numbers and booleans as their JSON text (which is PostgreSQL's).
func TextRow(obj json.RawMessage) (map[string]any, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(obj, &raw); err != nil {
		return nil, err
	}
	row := make(map[string]any, len(raw))
	for k, v := range raw {
		var x any
		if err := json.Unmarshal(v, &x); err != nil {
			return nil, err
		}
		switch x.(type) {
		case nil, string:
			row[k] = x
		default:
			row[k] = string(v)
		}
	}
	return row, nil
}

// TextTables reads the bed's tables on a node as Replay builds them.
func (n *Node) TextTables(ctx context.Context) (TextTables, error) {
	conn, err := n.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	out := TextTables{}
	for _, table := range Tables {
		schema, name, _ := strings.Cut(table, ".")
		rows, err := conn.Query(ctx, `SELECT column_name FROM information_schema.columns
			WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position`, schema, name)
		if err != nil {
			return nil, err
		}
		var parts []string
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				return nil, err
			}
			parts = append(parts, fmt.Sprintf("'%s', t.%s::text", c, c))
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		rows, err = conn.Query(ctx, fmt.Sprintf(`SELECT t.id::text, jsonb_build_object(%s)::text FROM %s t`, strings.Join(parts, ", "), table))
		if err != nil {
			return nil, err
		}
		tbl := map[string]map[string]any{}
		for rows.Next() {
			var id, s string
			if err := rows.Scan(&id, &s); err != nil {
				return nil, err
			}
			var row map[string]any
			if err := json.Unmarshal([]byte(s), &row); err != nil {
				return nil, err
			}
			tbl[`{"id":`+id+`}`] = row // the primary key, a bigint
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		out[table] = tbl
	}
	return out, nil
}
