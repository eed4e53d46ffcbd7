package cluster

import (
	"sort"
	"sync"
	"time"

	"github.com/tabletflow/tabletflow/digest"
	"github.com/tabletflow/tabletflow/proto/sourcepb"
	"github.com/tabletflow/tabletflow/source"
)

// tabletLog is one tablet's ordered change log as its leader holds it.
// Followers serve a prefix of it: the records committed at least their lag
// ago. Records at or below start have been freed.
type tabletLog struct {
	mu sync.Mutex
	// term is the term of every record in this log; a split child's term is
	// its parent's plus one, so positions never collide across a split.
	term uint64
	// origin is the index before this log's first-ever record: 0 for a
	// first-generation tablet, the split point for a child.
	origin uint64
	// start is the truncation point: records with index <= start are freed.
	start  uint64
	recs   []*sourcepb.Record
	nanos  []int64  // commit times of recs, for followers' applied views
	hashes []uint64 // digest hashes of recs
	// splitAt is set when the log closed at a split (the last index).
	closed  bool
	splitAt uint64
	// notify is closed and replaced on every append and on close.
	notify chan struct{}
	// freed is the digest of the freed changes, by table.
	freed map[string]digest.Digest
	// copies are the resync copies in the log, in index order (resync.go);
	// freedCopies the digest of their freed records, by owner.
	copies      []copySpan
	freedCopies map[*stream]digest.Digest
}

// copySpan is one resync's copy in a log: the records first..last (its
// markers and READ records), which only owner reads.
type copySpan struct {
	first, last uint64
	owner       *stream
}

func newTabletLog(term, origin uint64) *tabletLog {
	return &tabletLog{term: term, origin: origin, start: origin, notify: make(chan struct{}),
		freed: map[string]digest.Digest{}, freedCopies: map[*stream]digest.Digest{}}
}

// last returns the last index in the log (start when it is empty).
// Callers hold mu.
func (l *tabletLog) last() uint64 { return l.start + uint64(len(l.recs)) }

func (l *tabletLog) position(index uint64) source.Checkpoint {
	return source.Checkpoint{Term: l.term, Index: index}
}

// append adds one record; it fills in position and commit time and returns
// false if the log is closed. Callers do not hold mu.
func (l *tabletLog) append(r *sourcepb.Record, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.add(r, now)
	l.wake()
	return true
}

// wake tells the log's readers it changed. Callers hold mu.
func (l *tabletLog) wake() {
	close(l.notify)
	l.notify = make(chan struct{})
}

// add appends one record to an open log, filling in its position and
// commit time, without waking readers. Callers hold mu.
func (l *tabletLog) add(r *sourcepb.Record, now time.Time) {
	n := now.UnixNano()
	if k := len(l.nanos); k > 0 && l.nanos[k-1] > n {
		n = l.nanos[k-1] // commit times never go backwards within a tablet
	}
	r.Position = l.position(l.last() + 1).String()
	r.CommitTime = timestamp(n)
	l.recs = append(l.recs, r)
	l.nanos = append(l.nanos, n)
	l.hashes = append(l.hashes, recordHash(r))
}

// close ends the log at its last index for a split and returns that index.
func (l *tabletLog) close() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.splitAt = l.last()
	l.wake()
	return l.splitAt
}

// applied returns the last index a replica with the given lag has applied.
// Callers hold mu.
func (l *tabletLog) applied(lag time.Duration, now time.Time) uint64 {
	if lag <= 0 || len(l.nanos) == 0 {
		return l.last()
	}
	cut := now.Add(-lag).UnixNano()
	n := sort.Search(len(l.nanos), func(i int) bool { return l.nanos[i] > cut })
	return l.start + uint64(n)
}

// visibleAt returns when the record after index becomes visible to a
// replica with the given lag; ok is false when no such record exists yet.
// Callers hold mu.
func (l *tabletLog) visibleAt(index uint64, lag time.Duration) (time.Time, bool) {
	if index < l.start || index >= l.last() {
		return time.Time{}, false
	}
	return time.Unix(0, l.nanos[index-l.start]).Add(lag), true
}

// read returns up to max records after index, up to and including upto.
// Callers hold mu and have checked index >= start.
func (l *tabletLog) read(index, upto uint64, max int) []*sourcepb.Record {
	if upto <= index {
		return nil
	}
	n := upto - index
	if n > uint64(max) {
		n = uint64(max)
	}
	from := index - l.start
	out := make([]*sourcepb.Record, n)
	copy(out, l.recs[from:from+n])
	return out
}

// lagOf returns how far a replica that applied up to index is behind: the
// age of the oldest record it has not applied, or 0.
func (l *tabletLog) lagOf(applied uint64, now time.Time) time.Duration {
	if applied >= l.last() || applied < l.start {
		return 0
	}
	return now.Sub(time.Unix(0, l.nanos[applied-l.start]))
}

// indexBefore returns the last index committed before t (start if none).
// Callers hold mu.
func (l *tabletLog) indexBefore(t time.Time) uint64 {
	cut := t.UnixNano()
	n := sort.Search(len(l.nanos), func(i int) bool { return l.nanos[i] >= cut })
	return l.start + uint64(n)
}

// truncate frees every record with index <= cut. Callers hold mu.
func (l *tabletLog) truncate(cut uint64) {
	if cut <= l.start {
		return
	}
	if cut > l.last() {
		cut = l.last()
	}
	n := int(cut - l.start)
	for i, h := range l.hashes[:n] {
		if r := l.recs[i]; isCopyOp(r.Op) {
			if owner := l.ownerOf(l.start + uint64(i) + 1); owner != nil { // nil: its stream was deleted
				d := l.freedCopies[owner]
				d.Add(h)
				l.freedCopies[owner] = d
			}
			continue
		}
		d := l.freed[l.recs[i].Table]
		d.Add(h)
		l.freed[l.recs[i].Table] = d
	}
	for len(l.copies) > 0 && l.copies[0].last <= cut {
		l.copies = l.copies[1:]
	}
	clear(l.recs[:n])
	l.recs = l.recs[n:]
	l.nanos = l.nanos[n:]
	l.hashes = l.hashes[n:]
	l.start = cut
	// Re-slicing alone keeps the old backing arrays; copy once the live part
	// is small against them so freed history really is freed.
	if cap(l.recs) > 1024 && len(l.recs) < cap(l.recs)/4 {
		l.recs = append(make([]*sourcepb.Record, 0, 2*len(l.recs)), l.recs...)
		l.nanos = append(make([]int64, 0, 2*len(l.nanos)), l.nanos...)
		l.hashes = append(make([]uint64, 0, 2*len(l.hashes)), l.hashes...)
	}
}

// digestUpTo returns the digest of the records with index <= upto that
// stream s reads (visible), or with s nil, of every change (no resync
// copy). upto must be >= start. Callers hold mu.
func (l *tabletLog) digestUpTo(upto uint64, s *stream) digest.Digest {
	var d digest.Digest
	for table, f := range l.freed {
		if s == nil || s.wants(table) {
			d = d.Plus(f)
		}
	}
	if s != nil {
		d = d.Plus(l.freedCopies[s])
	}
	upto = min(upto, l.last())
	for i := l.start; i < upto; i++ {
		if l.visible(i+1, s) {
			d.Add(l.hashes[i-l.start])
		}
	}
	return d
}

// visible reports whether stream s reads the record at index i (start <
// i <= last): a change of a table it wants, or a record of its own resync
// copy. With s nil, every change and no copy. Callers hold mu.
func (l *tabletLog) visible(i uint64, s *stream) bool {
	r := l.recs[i-l.start-1]
	if isCopyOp(r.Op) {
		return s != nil && l.ownerOf(i) == s
	}
	return s == nil || s.wants(r.Table)
}

// ownerOf returns the stream whose resync copy holds index i, or nil.
// Callers hold mu.
func (l *tabletLog) ownerOf(i uint64) *stream {
	k := sort.Search(len(l.copies), func(k int) bool { return l.copies[k].last >= i })
	if k < len(l.copies) && l.copies[k].first <= i {
		return l.copies[k].owner
	}
	return nil
}

// isCopyOp reports whether op is a resync copy's (a marker or a READ),
// never a change.
func isCopyOp(op sourcepb.Op) bool {
	return op == sourcepb.Op_READ || op == sourcepb.Op_RESYNC_BEGIN || op == sourcepb.Op_RESYNC_END
}
