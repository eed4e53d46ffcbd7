package jsonl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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

// manifest is a tablet's commit record, <tablet>.manifest.json. It is the
// only source of truth for what is committed: the first Offset bytes of the
// data file, and Checkpoint. Bytes past Offset are an uncommitted tail that
// the next Open truncates and readers ignore. The first Open of a tablet
// writes its manifest before any data, so a data file with bytes but no
// manifest is corrupt; an empty one (a first Open that crashed) holds
// nothing.
type manifest struct {
	Stream     string            `json:"stream"`
	Tablet     string            `json:"tablet"`
	Checkpoint source.Checkpoint `json:"checkpoint"`
	Offset     int64             `json:"offset"`
	Updated    time.Time         `json:"updated"`
}

// errNoManifest: the tablet has no manifest file. What that means is the
// caller's to say: a new tablet at Open, corruption anywhere else.
var errNoManifest = errors.New("no manifest")

// readManifest reads the tablet's manifest; errNoManifest (naming the
// file) if there is none.
func readManifest(dir, tablet string) (manifest, error) {
	b, err := os.ReadFile(manifestPath(dir, tablet))
	if errors.Is(err, fs.ErrNotExist) {
		return manifest{}, fmt.Errorf("%w: %s", errNoManifest, manifestPath(dir, tablet))
	}
	if err != nil {
		return manifest{}, fmt.Errorf("read manifest: %w", err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return manifest{}, fmt.Errorf("%w: manifest of tablet %s: %v", ErrCorrupt, tablet, err)
	}
	if m.Offset < 0 {
		return manifest{}, fmt.Errorf("%w: manifest of tablet %s: negative offset %d", ErrCorrupt, tablet, m.Offset)
	}
	return m, nil
}

// writeManifest replaces the tablet's manifest atomically: after a crash at
// any point the old or the new manifest is on disk, whole. It writes a temp
// file, fsyncs it, renames it over the manifest and fsyncs the directory.
// The temp file has a fixed name: the tablet's lock keeps one writer per
// tablet, and a temp file left by a crash is simply overwritten.
func writeManifest(dir, tablet string, m manifest) (err error) {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	b = append(b, '\n')
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
