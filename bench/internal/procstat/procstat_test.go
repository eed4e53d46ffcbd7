package procstat

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseProcessCPUCountsFieldsAfterTheCommand(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stat    string
		want    float64
		wantErr bool
	}{
		// A plain command: utime 150 + stime 50 ticks.
		{"plain", "42 (worker) S 1 42 42 0 -1 4194304 100 0 0 0 150 50 0 0 20 0 8 0 100 0 0", 2, false},
		// Spaces and parentheses in the name must not shift the fields.
		{"odd name", "42 (my (odd) name) S 1 42 42 0 -1 4194304 100 0 0 0 150 50 0 0 20 0 8 0 100 0 0", 2, false},
		// Cut short: no stime.
		{"short", "42 (worker) S 1 42 42 0 -1 4194304 100 0 0 0 150", 0, true},
		// Not a number where utime stands.
		{"garbage", "42 (worker) S 1 42 42 0 -1 4194304 100 0 0 0 x 50", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseProcessCPU([]byte(tc.stat))
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestParseHostCPUReadsTheTotalLine(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stat    string
		want    HostCPU
		wantErr bool
	}{
		// Every field, guest and guest_nice past steal ignored.
		{"full", "cpu  100 2 30 900 40 5 6 7 8 9\ncpu0 50 1 15 450 20 2 3 3 4 4\n",
			HostCPU{User: 100, Nice: 2, System: 30, Idle: 900, IOWait: 40, IRQ: 5, SoftIRQ: 6, Steal: 7}, false},
		// An old kernel without steal: it is 0.
		{"no steal", "cpu 100 2 30 900 40 5 6\n",
			HostCPU{User: 100, Nice: 2, System: 30, Idle: 900, IOWait: 40, IRQ: 5, SoftIRQ: 6}, false},
		// The first line is not the total.
		{"not cpu", "intr 1 2 3\n", HostCPU{}, true},
		{"empty", "", HostCPU{}, true},
		{"garbage", "cpu 100 x\n", HostCPU{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseHostCPU([]byte(tc.stat))
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestHostCPUBusyLeavesOutIdleIOWaitAndSteal(t *testing.T) {
	h := HostCPU{User: 100, Nice: 2, System: 30, Idle: 900, IOWait: 40, IRQ: 5, SoftIRQ: 6, Steal: 7}
	require.Equal(t, uint64(143), h.Busy())
	require.Equal(t, 1.43, Seconds(h.Busy()))
}

func TestParsePressureStallReadsSomeTotal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    string
		want    float64
		wantErr bool
	}{
		// total is in microseconds.
		{"some and full", "some avg10=16.40 avg60=8.88 avg300=14.63 total=4323360731\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 4323.360731, false},
		// A file that starts with "full" says nothing of "some".
		{"full first", "full avg10=0.00 avg60=0.00 avg300=0.00 total=12\n", 0, true},
		{"no total", "some avg10=0.00\n", 0, true},
		{"empty", "", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePressureStall([]byte(tc.data))
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.InDelta(t, tc.want, got, 1e-9)
		})
	}
}

func TestParseLoadAvgReadsTheOneMinuteAverage(t *testing.T) {
	got, err := ParseLoadAvg([]byte("0.98 1.46 2.33 2/97 3756\n"))
	require.NoError(t, err)
	require.Equal(t, 0.98, got)
	_, err = ParseLoadAvg(nil)
	require.Error(t, err)
}

func TestSnapshotMinusRoundsToTenMilliseconds(t *testing.T) {
	now := Snapshot{"worker": 12.3456, "tabletd": 1, "new": 0.5}
	prev := Snapshot{"worker": 10, "tabletd": 1, "gone": 3}
	// A name only now has counts from 0; one only prev has is dropped.
	require.Equal(t, map[string]float64{"worker": 2.35, "tabletd": 0, "new": 0.5}, now.Minus(prev))
}

func TestReadersWorkOnThisHost(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	s, err := ProcessCPU(os.Getpid())
	require.NoError(t, err)
	require.GreaterOrEqual(t, s, 0.0)
	_, err = ReadHostCPU()
	require.NoError(t, err)
	_, err = SelfCPU()
	require.NoError(t, err)
}
