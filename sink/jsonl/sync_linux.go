package jsonl

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// datasync flushes f's data and the metadata needed to read it back
// (fdatasync(2)): a manifest slot rewritten in place changes no size, so
// it needs no journal commit for a modification time.
func datasync(f *os.File) error { return onFD(f, unix.Fdatasync) }

// syncFilesystem is syncfs(2) of dir's filesystem.
func syncFilesystem(dir *os.File) error { return onFD(dir, unix.Syncfs) }

// onFD runs call on f's descriptor.
func onFD(f *os.File, call func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = call(int(fd)) }); err != nil {
		return err
	}
	return serr
}

// groupSyncSupported: syncfs reports a failed write back since Linux 5.8;
// before, it returned success anyway, and only fdatasync can be trusted.
func groupSyncSupported() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	return kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 5, 8)
}

// kernelAtLeast tells whether a kernel release ("6.1.0-18-amd64") is at
// least major.minor.
func kernelAtLeast(release string, major, minor int) bool {
	var v [2]int
	for i, f := range strings.SplitN(release, ".", 3) {
		if i == 2 {
			break
		}
		if end := strings.IndexFunc(f, func(r rune) bool { return r < '0' || r > '9' }); end >= 0 {
			f = f[:end]
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return false
		}
		v[i] = n
	}
	return v[0] > major || (v[0] == major && v[1] >= minor)
}

// deviceOf returns the device of dir's filesystem.
func deviceOf(dir string) (uint64, bool) {
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return 0, false
	}
	return st.Dev, true
}

// meminfo is /proc/meminfo, opened at its first reading and read again
// from offset 0 each time: a pread(2) of the whole (and one more that
// finds its end) instead of the open, fstat, reads and close of
// os.ReadFile (6 against 18 µs a reading here, and a live worker reads it
// a few times a second; see unwrittenFor).
var meminfo struct {
	mu  sync.Mutex
	f   *os.File
	buf []byte
}

// unwritten returns how many bytes the system holds unwritten
// (/proc/meminfo's Dirty and Writeback), or false if it cannot tell.
func unwritten() (int64, bool) {
	meminfo.mu.Lock()
	defer meminfo.mu.Unlock()
	if meminfo.f == nil {
		f, err := os.Open("/proc/meminfo")
		if err != nil {
			return 0, false
		}
		meminfo.f, meminfo.buf = f, make([]byte, 16<<10)
	}
	n, err := meminfo.f.ReadAt(meminfo.buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, false
	}
	if n == len(meminfo.buf) { // cut short: Dirty or Writeback may be past the end
		return 0, false
	}
	return unwrittenIn(meminfo.buf[:n])
}

// unwrittenIn is unwritten over /proc/meminfo's bytes.
func unwrittenIn(meminfo []byte) (int64, bool) {
	var total int64
	found := 0
	for _, line := range bytes.Split(meminfo, []byte("\n")) {
		name, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok || (string(name) != "Dirty" && string(name) != "Writeback") {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil || kb < 0 {
			return 0, false
		}
		total += kb << 10
		found++
	}
	if found != 2 {
		return 0, false
	}
	return total, true
}
