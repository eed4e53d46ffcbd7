package procs

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEndRemovesTheDirectoryOfARunThatPassedAndKeepsAFailedOnesWithTheBedStopped(t *testing.T) {
	for _, tc := range []struct {
		name         string
		failed, keep bool
		kept, logs   bool
	}{
		{name: "passed", kept: false},
		{name: "passed, --keep", keep: true, kept: true},
		{name: "failed", failed: true, kept: true, logs: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			r := &Run{name: "test", keep: &tc.keep}
			var order []string
			r.Bed(func() error { order = append(order, "bed"); return errors.New("already stopped") },
				func() string { order = append(order, "bed logs"); return "" })
			r.End(&Group{Dir: dir}, tc.failed, func() { order = append(order, "close") })
			_, err := os.Stat(dir)
			require.Equal(t, tc.kept, err == nil, "kept")
			want := []string{"close", "bed"}
			if tc.logs {
				want = append(want, "bed logs")
			}
			require.Equal(t, want, order)
		})
	}
}
