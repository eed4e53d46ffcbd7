package jsonl

import (
	"os"

	"golang.org/x/sys/unix"
)

// datasync flushes f's data and the metadata needed to read it back
// (fdatasync(2)): a manifest slot rewritten in place changes no size, so
// it needs no journal commit for a modification time.
func datasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Fdatasync(int(fd)) }); err != nil {
		return err
	}
	return serr
}
