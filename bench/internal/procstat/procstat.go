// Package procstat reads what the benchmarks measure of the host and of
// single processes from Linux's /proc: CPU seconds a process used, the
// host's CPU times, pressure stall and load average. Each reader has a
// pure parser beside it, so the format is tested without a /proc.
package procstat

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ClockTick is USER_HZ, the unit of /proc's CPU times (100 on Linux).
const ClockTick = 100

// Seconds converts CPU time in ticks to seconds.
func Seconds(ticks uint64) float64 { return float64(ticks) / ClockTick }

// ProcessCPU returns the CPU seconds (user + system) a process has used
// so far.
func ProcessCPU(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return ParseProcessCPU(data)
}

// ParseProcessCPU reads user + system CPU seconds from a /proc/<pid>/stat
// line. The command name may hold spaces and parentheses, so the fields
// are counted after the last ')'.
func ParseProcessCPU(data []byte) (float64, error) {
	s := string(data)
	// Fields after the command name: state is the first, utime the 12th,
	// stime the 13th.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the command, want 13 or more", len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat: %w", err)
	}
	return Seconds(u + st), nil
}

// SelfCPU returns the CPU seconds (user + system) this process has used.
func SelfCPU() (float64, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds(), nil
}

// HostCPU is the host's CPU time since boot over all cores, in ticks, as
// the first line of /proc/stat counts it. A field an older kernel does
// not report is 0.
type HostCPU struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal uint64
}

// Busy is the time the cores ran anything: user, nice, system, irq and
// softirq. Guest time is counted in user already; steal (another guest
// of the hypervisor ran) is apart.
func (h HostCPU) Busy() uint64 { return h.User + h.Nice + h.System + h.IRQ + h.SoftIRQ }

// ReadHostCPU reads the host's CPU times from /proc/stat.
func ReadHostCPU() (HostCPU, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return HostCPU{}, err
	}
	return ParseHostCPU(data)
}

// ParseHostCPU reads the aggregate "cpu" line, the first of /proc/stat:
// cpu user nice system idle iowait irq softirq steal guest guest_nice.
func ParseHostCPU(data []byte) (HostCPU, error) {
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "cpu" {
		return HostCPU{}, fmt.Errorf("/proc/stat: first line %q is not the cpu total", line)
	}
	var h HostCPU
	for i, dst := range []*uint64{&h.User, &h.Nice, &h.System, &h.Idle, &h.IOWait, &h.IRQ, &h.SoftIRQ, &h.Steal} {
		if i+1 >= len(f) {
			break
		}
		v, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return HostCPU{}, fmt.Errorf("/proc/stat: %w", err)
		}
		*dst = v
	}
	return h, nil
}

// PressureStall returns how long, in seconds since boot, some task waited
// for the resource ("cpu", "io" or "memory"), from /proc/pressure: on a
// shared host, how much the others took.
func PressureStall(resource string) (float64, error) {
	data, err := os.ReadFile("/proc/pressure/" + resource)
	if err != nil {
		return 0, err
	}
	return ParsePressureStall(data)
}

// ParsePressureStall reads the total of the first line of a
// /proc/pressure file, "some avg10=… avg60=… avg300=… total=<µs>", in
// seconds.
func ParsePressureStall(data []byte) (float64, error) {
	line, _, _ := strings.Cut(string(data), "\n")
	_, tot, ok := strings.Cut(line, "total=")
	if !ok || !strings.HasPrefix(line, "some") {
		return 0, fmt.Errorf("pressure: first line %q is not some … total=", line)
	}
	us, err := strconv.ParseFloat(strings.TrimSpace(tot), 64)
	if err != nil {
		return 0, fmt.Errorf("pressure: %w", err)
	}
	return us / 1e6, nil
}

// LoadAvg is the host's 1-minute load average, 0 if unknown: the machine
// may be shared, and the numbers mean less when it is busy.
func LoadAvg() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	l, err := ParseLoadAvg(data)
	if err != nil {
		return 0
	}
	return l
}

// ParseLoadAvg reads the 1-minute load average, the first field of
// /proc/loadavg.
func ParseLoadAvg(data []byte) (float64, error) {
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0, errors.New("loadavg: empty")
	}
	return strconv.ParseFloat(f[0], 64)
}

// Snapshot is CPU seconds used so far, by name (a process, the host's
// busy time, …); two snapshots give what was used between them.
type Snapshot map[string]float64

// Minus returns the CPU seconds used since prev, rounded to 10 ms. A name
// prev lacks counts from 0.
func (s Snapshot) Minus(prev Snapshot) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s {
		out[k] = math.Round((v-prev[k])*100) / 100
	}
	return out
}
