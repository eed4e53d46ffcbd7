package postgres

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/source"
)

// pgoutput message builders for the seeds (protocol version 1, as the
// reader asks for; PostgreSQL's "Logical Replication Message Formats").

func pgMsg(kind byte, parts ...[]byte) []byte {
	return slices.Concat(append([][]byte{{kind}}, parts...)...)
}

func u16(v uint16) []byte  { return binary.BigEndian.AppendUint16(nil, v) }
func u32(v uint32) []byte  { return binary.BigEndian.AppendUint32(nil, v) }
func u64(v uint64) []byte  { return binary.BigEndian.AppendUint64(nil, v) }
func cstr(s string) []byte { return append([]byte(s), 0) }

// pgRelation describes relation 1, public.t, from column (name, type OID)
// pairs; the first column is the replica identity.
func pgRelation(cols ...any) []byte {
	parts := [][]byte{u32(1), cstr("public"), cstr("t"), {'d'}, u16(uint16(len(cols) / 2))}
	for i := 0; i < len(cols); i += 2 {
		flags := byte(0)
		if i == 0 {
			flags = 1 // part of the replica identity
		}
		parts = append(parts, []byte{flags}, cstr(cols[i].(string)), u32(cols[i+1].(uint32)), u32(0xffffffff))
	}
	return pgMsg('R', parts...)
}

// pgTuple encodes values: nil is null, byte('u') an unchanged TOAST
// value, a string a text value.
func pgTuple(vals ...any) []byte {
	out := u16(uint16(len(vals)))
	for _, v := range vals {
		switch v := v.(type) {
		case nil:
			out = append(out, 'n')
		case byte:
			out = append(out, v)
		case string:
			out = slices.Concat(out, []byte{'t'}, u32(uint32(len(v))), []byte(v))
		default:
			panic(fmt.Sprintf("pgTuple: %T", v)) // an untyped 'u' is a rune
		}
	}
	return out
}

func pgBegin(lsn uint64) []byte { return pgMsg('B', u64(lsn), u64(0), u32(7)) }
func pgCommit(lsn uint64) []byte {
	return pgMsg('C', []byte{0}, u64(lsn), u64(lsn+8), u64(1))
}

// pgStream frames messages as the fuzz target reads them: each one after
// its length, two bytes big-endian.
func pgStream(msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = slices.Concat(out, u16(uint16(len(m))), m)
	}
	return out
}

// frames splits a fuzz input into messages: a two-byte big-endian length,
// then that many bytes (or what is left).
func frames(b []byte) [][]byte {
	var out [][]byte
	for len(b) >= 2 {
		n := min(int(binary.BigEndian.Uint16(b)), len(b)-2)
		out = append(out, b[2:2+n])
		b = b[2+n:]
	}
	return out
}

// pgSeeds are message streams for the fuzz target: whole transactions as
// a server sends them, and damaged ones.
func pgSeeds() [][]byte {
	rel := pgRelation("id", uint32(oidInt8), "n", uint32(oidNumeric), "ok", uint32(oidBool),
		"doc", uint32(oidJSONB), "body", uint32(25))
	row := pgTuple("7", "12.50", "t", `{"a": [1, 2]}`, `say "hi"`)
	ins := pgMsg('I', u32(1), []byte{'N'}, row)
	return [][]byte{
		pgStream(rel, pgBegin(100), ins, pgCommit(100)),
		pgStream(rel, pgBegin(200), pgMsg('U', u32(1), []byte{'O'}, row, []byte{'N'}, pgTuple("7", "NaN", "f", nil, byte('u'))), pgCommit(200)),
		pgStream(rel, pgBegin(300), pgMsg('D', u32(1), []byte{'K'}, pgTuple("7", nil, nil, nil, nil)), pgCommit(300)),
		pgStream(pgBegin(400), pgCommit(400), pgMsg('M', []byte{0}, u64(500), cstr("tabletflow.heartbeat"), u32(2), []byte("hi"))),
		pgStream(rel, pgBegin(600), ins[:len(ins)-4], pgCommit(600)),                                                      // a tuple cut short
		pgStream(rel, pgBegin(700), pgMsg('I', u32(1), []byte{'N'}, pgTuple("7x", "1e+30", "t", "{", "")), pgCommit(700)), // values that are not what their types say
		pgStream(rel, pgBegin(800), pgMsg('T', u32(0xffffffff), []byte{0}, u32(1)), pgCommit(800)),                        // a count far past the message
		pgStream([]byte{}, pgMsg('D', u32(1))),
	}
}

// FuzzPgoutputDecode feeds a stream of pgoutput messages, arbitrary bytes
// as a hostile or broken server might send in XLogData, to a reader's
// decode. It must never panic, nor allocate what a length field claims
// beyond the message; a bad message is an error (after which the reader
// is closed, as GetChanges does). Every record of a transaction decode
// completed is well formed: the shard's tablet, a known op, positions
// (commit LSN, 1..n) in order, a key object and before/after images that
// are valid JSON, as the sinks require.
func FuzzPgoutputDecode(f *testing.F) {
	for _, s := range pgSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &Reader{sh: &shard{id: "s1"}, rels: map[uint32]*relation{}}
		for _, msg := range frames(data) {
			err := r.decode(msg)
			// keyOf reads a relation's primary key from the catalog, on
			// its first change; here every new relation is keyed as keyOf
			// keys a table without one, by its replica identity.
			for _, rel := range r.rels {
				if rel.key == nil {
					rel.key = identity(rel, true)
				}
			}
			if err != nil {
				require.NotEmpty(t, err.Error())
				break
			}
		}
		for _, w := range r.ready {
			require.NotEmpty(t, w.records)
			require.Equal(t, w.cp, w.records[len(w.records)-1].Position)
			for i, rec := range w.records {
				require.Equal(t, "s1", rec.Tablet)
				require.Contains(t, []source.Op{source.Insert, source.Update, source.Delete}, rec.Op)
				require.Equal(t, source.Checkpoint{Term: w.cp.Term, Index: uint64(i + 1)}, rec.Position)
				require.True(t, json.Valid(rec.Key) && bytes.HasPrefix(rec.Key, []byte("{")), "key %q is not a JSON object", rec.Key)
				for _, img := range []json.RawMessage{rec.Before, rec.After} {
					require.True(t, img == nil || json.Valid(img), "image %q is not JSON", img)
				}
			}
		}
	})
}

// TestPgoutputSeedsDecode checks the seed builders, so fuzzing starts deep
// in decode rather than at its first length check: the first seed, a whole
// transaction, decodes to its insert; a value that is not its type's text
// form is a JSON string, not a broken literal; the damaged streams are
// errors.
func TestPgoutputSeedsDecode(t *testing.T) {
	decode := func(stream []byte) (*Reader, error) {
		r := &Reader{sh: &shard{id: "s1"}, rels: map[uint32]*relation{}}
		for _, msg := range frames(stream) {
			if err := r.decode(msg); err != nil {
				return r, err
			}
			if rel := r.rels[1]; rel != nil && rel.key == nil {
				rel.key = identity(rel, true)
			}
		}
		return r, nil
	}
	seeds := pgSeeds()
	r, err := decode(seeds[0])
	require.NoError(t, err)
	require.Len(t, r.ready, 1)
	rec := r.ready[0].records[0]
	require.Equal(t, source.Checkpoint{Term: 108, Index: 1}, rec.Position)
	require.Equal(t, `{"id":7}`, string(rec.Key))
	require.Equal(t, `{"id":7,"n":12.50,"ok":true,"doc":{"a": [1, 2]},"body":"say \"hi\""}`, string(rec.After))

	r, err = decode(seeds[5])
	require.NoError(t, err)
	rec = r.ready[0].records[0]
	require.Equal(t, `{"id":"7x"}`, string(rec.Key))
	require.Equal(t, `{"id":"7x","n":1e+30,"ok":true,"doc":"{","body":""}`, string(rec.After))

	for _, i := range []int{4, 6, 7} {
		_, err := decode(seeds[i])
		require.ErrorContains(t, err, "decode pgoutput message", "seed %d", i)
	}
}
