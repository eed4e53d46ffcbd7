package procs

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/testbed"
)

// group is a Group over /bin with its logs in a temporary directory; its
// children are stopped when the test ends.
func group(t *testing.T, tools ...string) *Group {
	for _, tool := range tools {
		if _, err := os.Stat(filepath.Join("/bin", tool)); err != nil {
			t.Skipf("no /bin/%s here", tool)
		}
	}
	g := &Group{Bin: "/bin", Dir: t.TempDir()}
	t.Cleanup(g.StopAll)
	return g
}

func TestGroupStartsNamedChildrenAndMeasuresThem(t *testing.T) {
	g := group(t, "sleep")
	p, err := g.Start("sleep", "30")
	require.NoError(t, err)
	require.Equal(t, "sleep", p.Name)
	require.Equal(t, filepath.Join(g.Dir, "sleep.log"), p.Log())
	require.Equal(t, []*Proc{p}, g.List())

	cpu := g.CPU()
	require.Contains(t, cpu, "sleep")
	require.Contains(t, cpu, "bench")

	g.StopAll()
	require.True(t, p.Exited())
}

func TestWaitForReturnsOnceReady(t *testing.T) {
	g := group(t, "sleep")
	p, err := g.Start("sleep", "30")
	require.NoError(t, err)
	calls := 0
	err = WaitFor(context.Background(), p, "sleep", 10*time.Second, func() error {
		if calls++; calls < 2 {
			return errors.New("not yet")
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 2, calls)
}

func TestWaitForSaysTheProcessExited(t *testing.T) {
	g := group(t, "true")
	p, err := g.Start("true")
	require.NoError(t, err)
	require.Eventually(t, p.Exited, 10*time.Second, 10*time.Millisecond)
	err = WaitFor(context.Background(), p, "true", 10*time.Second, func() error { return errors.New("refused") })
	require.ErrorIs(t, err, ErrExited)
	require.EqualError(t, err, "true exited: refused")
}

func TestWaitForGivesUpAfterWithin(t *testing.T) {
	g := group(t, "sleep")
	p, err := g.Start("sleep", "30")
	require.NoError(t, err)
	err = WaitFor(context.Background(), p, "sleep", 300*time.Millisecond, func() error { return errors.New("refused") })
	require.EqualError(t, err, "sleep not ready within 300ms: refused")
	require.NotErrorIs(t, err, ErrExited)
}

func TestSleepEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, Sleep(ctx, time.Hour), context.Canceled)
	require.NoError(t, Sleep(context.Background(), time.Millisecond))
}

func TestTabletCountsParsesAListAndNamesTheFlagOnABadOne(t *testing.T) {
	got, err := TabletCounts("tablets", "16, 64")
	require.NoError(t, err)
	require.Equal(t, []int{16, 64}, got)
	for _, bad := range []string{"", "16,", "0", "-4", "x"} {
		_, err := TabletCounts("tablets", bad)
		require.ErrorContains(t, err, "--tablets: ", "%q", bad)
	}
}

// The benchmarks' dev server runs SQLite in WAL mode and eager activity
// execution on, unless told otherwise.
func TestDevServerFlagsTurnOnWALAndEagerActivities(t *testing.T) {
	args := DevServerFlags()
	require.Equal(t, append(append([]string(nil), testbed.SQLiteWAL...), eagerActivities...), args())
	require.Contains(t, strings.Join(args(), " "), "system.enableActivityEagerExecution=true")
	require.NoError(t, flag.Set("no-eager-activities", "true"))
	require.NoError(t, flag.Set("sqlite-defaults", "true"))
	t.Cleanup(func() { _ = flag.Set("no-eager-activities", "false"); _ = flag.Set("sqlite-defaults", "false") })
	require.Empty(t, args(), "--no-eager-activities and --sqlite-defaults: the server's own settings")
}
