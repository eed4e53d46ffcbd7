package jsonl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/tabletflow/tabletflow/source"
)

// File name suffixes under the sink's directory. Only data files end in
// dataExt, so a consumer can glob "*.jsonl" and get data alone.
const (
	dataExt     = ".jsonl"
	manifestExt = ".manifest.json"
	lockExt     = ".lock"
	tempExt     = ".tmp"
)

func dataPath(dir, tablet string) string     { return filepath.Join(dir, tablet+dataExt) }
func manifestPath(dir, tablet string) string { return filepath.Join(dir, tablet+manifestExt) }
func lockPath(dir, tablet string) string     { return filepath.Join(dir, tablet+lockExt) }

// manifest is a tablet's commit record. It is the only source of truth for
// what is committed: the first Offset bytes of the data file, and
// Checkpoint. Bytes past Offset are an uncommitted tail that the next Open
// truncates and readers ignore. The first Open of a tablet writes its
// manifest before any data, so a data file with bytes but no manifest is
// corrupt; an empty one (a first Open that crashed) holds nothing. Seq
// counts the commits: the manifest file holds the last two, and the valid
// one with the higher Seq is the committed one.
type manifest struct {
	Seq        uint64            `json:"seq"`
	Stream     string            `json:"stream"`
	Tablet     string            `json:"tablet"`
	Checkpoint source.Checkpoint `json:"checkpoint"`
	Offset     int64             `json:"offset"`
	Updated    time.Time         `json:"updated"`
}

// The manifest file, <tablet>.manifest.json, is two slots of slotSize
// bytes. Each slot is one line,
//
//	{"crc32c":N,"manifest":{"seq":…,"stream":…,"tablet":…,"checkpoint":…,"offset":…,"updated":…}}
//
// padded with spaces to slotSize-1 bytes and ended by a newline; N is the
// CRC-32C (Castagnoli) of the bytes of the "manifest" value as they stand.
// Manifest Seq is stored in slot Seq%2, in place, so a commit overwrites
// the manifest of two commits ago and never the current one: a crash that
// tears the slot being written leaves a slot whose checksum fails, and the
// other slot, the previous commit, stands. A commit is therefore one write
// and one data sync of a file that stays open, where a replace costs a
// file creation, an fsync, a rename and a directory fsync.
//
// A manifest file of one JSON object (the format before the slots) is
// read as Seq 0; the first Open rewrites it in slots.
const slotSize = 4096

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// slot is the JSON shape of one slot.
type slot struct {
	CRC32C   uint32          `json:"crc32c"`
	Manifest json.RawMessage `json:"manifest"`
}

// encodeSlot returns m as one slot's bytes.
func encodeSlot(m manifest) ([]byte, error) {
	inner, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	// The bytes of json.Marshal(slot{…}), put together by hand: inner is
	// json.Marshal's, so already compact and escaped as a RawMessage
	// would be, and this runs at every commit.
	b := make([]byte, 0, slotSize)
	b = append(b, `{"crc32c":`...)
	b = strconv.AppendUint(b, uint64(crc32.Checksum(inner, castagnoli)), 10)
	b = append(b, `,"manifest":`...)
	b = append(b, inner...)
	b = append(b, '}')
	if len(b) > slotSize-1 {
		return nil, fmt.Errorf("encode manifest: %d bytes do not fit a %d-byte slot (stream or tablet id too long)", len(b), slotSize)
	}
	out := b[:slotSize]
	for i := len(b); i < slotSize-1; i++ {
		out[i] = ' '
	}
	out[slotSize-1] = '\n'
	return out, nil
}

// decodeSlot returns the manifest a slot holds, or ok false when the slot
// is torn, never written or otherwise fails its checksum.
func decodeSlot(b []byte) (m manifest, ok bool) {
	var s slot
	if json.Unmarshal(bytes.TrimRight(b, " \n\x00"), &s) != nil || len(s.Manifest) == 0 ||
		crc32.Checksum(s.Manifest, castagnoli) != s.CRC32C || json.Unmarshal(s.Manifest, &m) != nil {
		return manifest{}, false
	}
	return m, true
}

// parseManifest returns the committed manifest of a manifest file's bytes:
// the valid slot with the higher Seq, or the whole file as one object in
// the format before the slots (legacy true).
func parseManifest(tablet string, b []byte) (m manifest, legacy bool, err error) {
	if len(b) == 2*slotSize && b[slotSize-1] == '\n' {
		m0, ok0 := decodeSlot(b[:slotSize])
		m1, ok1 := decodeSlot(b[slotSize:])
		switch {
		case ok0 && ok1 && m1.Seq > m0.Seq, !ok0 && ok1:
			m = m1
		case ok0:
			m = m0
		default:
			return manifest{}, false, fmt.Errorf("%w: manifest of tablet %s: neither slot passes its checksum", ErrCorrupt, tablet)
		}
	} else {
		if err := json.Unmarshal(b, &m); err != nil {
			return manifest{}, false, fmt.Errorf("%w: manifest of tablet %s: %v", ErrCorrupt, tablet, err)
		}
		m.Seq, legacy = 0, true
	}
	if m.Offset < 0 {
		return manifest{}, false, fmt.Errorf("%w: manifest of tablet %s: negative offset %d", ErrCorrupt, tablet, m.Offset)
	}
	return m, legacy, nil
}

// errNoManifest: the tablet has no manifest file. What that means is the
// caller's to say: a new tablet at Open, corruption anywhere else.
var errNoManifest = errors.New("no manifest")

// readManifest reads the tablet's manifest; errNoManifest (naming the
// file) if there is none.
func readManifest(dir, tablet string) (manifest, error) {
	m, _, err := readManifestFile(dir, tablet)
	return m, err
}

func readManifestFile(dir, tablet string) (manifest, bool, error) {
	b, err := os.ReadFile(manifestPath(dir, tablet))
	if errors.Is(err, fs.ErrNotExist) {
		return manifest{}, false, fmt.Errorf("%w: %s", errNoManifest, manifestPath(dir, tablet))
	}
	if err != nil {
		return manifest{}, false, fmt.Errorf("read manifest: %w", err)
	}
	return parseManifest(tablet, b)
}

// readSlots reads an open manifest file's bytes into buf (grown to
// 2*slotSize+1: one more, as a longer file is not slots) and returns them.
func readSlots(f *os.File, buf []byte) ([]byte, error) {
	buf = slices.Grow(buf[:0], 2*slotSize+1)[:2*slotSize+1]
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	return buf[:n], nil
}

// parseSlots is parseManifest for a file that must be in slots.
func parseSlots(tablet string, b []byte) (manifest, error) {
	m, legacy, err := parseManifest(tablet, b)
	if err == nil && legacy {
		err = fmt.Errorf("%w: manifest of tablet %s was rewritten in the old format", ErrCorrupt, tablet)
	}
	return m, err
}

// writeSlot stores m in its slot of the open manifest file, made durable
// by sync, and in slots, the file's bytes as the writer knows them.
func writeSlot(f *os.File, slots []byte, m manifest, sync func(*os.File, int64) error) error {
	b, err := encodeSlot(m)
	if err != nil {
		return err
	}
	at := int64(m.Seq%2) * slotSize
	if _, err := f.WriteAt(b, at); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if err := sync(f, int64(len(b))); err != nil {
		return fmt.Errorf("sync manifest: %w", err)
	}
	if len(slots) == 2*slotSize {
		copy(slots[at:], b)
	}
	return nil
}

// writeManifest replaces the tablet's manifest file atomically with one
// whose slots hold m (slot m.Seq%2) and a copy of it one Seq earlier: after
// a crash at any point the old or the new file is on disk, whole. It
// writes a temp file, fsyncs it, renames it over the manifest and fsyncs
// the directory; Open does this once per tablet, commits write a slot.
// The temp file has a fixed name: the tablet's lock keeps one writer per
// tablet, and a temp file left by a crash is simply overwritten.
func writeManifest(dir, tablet string, m manifest) (err error) {
	if m.Seq == 0 {
		m.Seq = 1
	}
	prev := m
	prev.Seq--
	b := make([]byte, 2*slotSize)
	for _, s := range []manifest{m, prev} {
		e, err := encodeSlot(s)
		if err != nil {
			return err
		}
		copy(b[(s.Seq%2)*slotSize:], e)
	}
	path := manifestPath(dir, tablet)
	tmp := path + tempExt
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("create manifest: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return fmt.Errorf("write manifest: %w", err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync manifest: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close manifest: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename manifest: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("sync manifest: %w", err)
	}
	return nil
}

// syncDir fsyncs a directory so renames and new files in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return err
	}
	return d.Close()
}
