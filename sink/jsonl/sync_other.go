//go:build !linux

package jsonl

import "os"

// datasync is fsync where fdatasync(2) is not at hand.
func datasync(f *os.File) error { return f.Sync() }

// The group sync is Linux's syncfs(2); elsewhere every writer syncs its
// own files.
func groupSyncSupported() bool       { return false }
func syncFilesystem(*os.File) error  { return nil }
func deviceOf(string) (uint64, bool) { return 0, false }
func unwritten() (int64, bool)       { return 0, false }
