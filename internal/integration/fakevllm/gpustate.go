package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
)

// The stand-in NVML state shared with integration/fakenvml:
//
//	DIR/devices       one device per line: <uuid> <total_bytes> <reserved_bytes> <name with spaces>
//	DIR/procs/<pid>   lines "<device_index> <used_bytes>", written atomically by each process
//
// A device's used memory is its reserved bytes plus the entries of every
// live, non-zombie pid.

const defaultUUID = "GPU-00000000-0000-0000-0000-000000000000"
const defaultReserved = 512 * mib
const defaultDeviceName = "NVIDIA H100 80GB HBM3"

// device is one line of DIR/devices.
type device struct {
	Index    int
	UUID     string
	Total    int64
	Reserved int64
	Name     string
}

// parseDevices parses DIR/devices. Blank and '#' lines are ignored; line
// order is the device index.
func parseDevices(data []byte) ([]device, error) {
	var devs []device
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 {
			return nil, fmt.Errorf("devices line %d: %q has %d fields; want <uuid> <total_bytes> <reserved_bytes> <name>", lineNo, line, len(f))
		}
		total, err1 := strconv.ParseInt(f[1], 10, 64)
		reserved, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || total <= 0 || reserved < 0 || reserved > total {
			return nil, fmt.Errorf("devices line %d: %q: total and reserved must be byte counts with 0 <= reserved <= total", lineNo, line)
		}
		// The name keeps its inner spaces: it is everything after the third
		// field, with fields split as strings.Fields splits them (any
		// Unicode space, \v included).
		rest := line
		for i := 0; i < 3; i++ {
			rest = strings.TrimLeftFunc(rest, unicode.IsSpace)
			if j := strings.IndexFunc(rest, unicode.IsSpace); j >= 0 {
				rest = rest[j:]
			} else {
				rest = ""
			}
		}
		devs = append(devs, device{Index: len(devs), UUID: f[0], Total: total, Reserved: reserved, Name: strings.TrimSpace(rest)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("devices: %w", err)
	}
	return devs, nil
}

// parseProcEntries parses one DIR/procs/<pid> file into device index → bytes.
func parseProcEntries(data []byte) (map[int]int64, error) {
	out := map[int]int64{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("procs line %d: %q: want <device_index> <used_bytes>", i+1, line)
		}
		idx, err1 := strconv.Atoi(f[0])
		used, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil || idx < 0 || used < 0 {
			return nil, fmt.Errorf("procs line %d: %q: want a device index and a byte count", i+1, line)
		}
		out[idx] += used
	}
	return out, nil
}

// gpuView is one process's view of its device: the shared state directory
// when FAKENVML_STATE is set, else a private device of FAKEVLLM_GPU_TOTAL_GIB.
type gpuView struct {
	dir string // "" without shared state
	dev device
	// isAlive reports whether a pid holds memory (live and not a zombie).
	isAlive func(pid int) bool
}

// openGPU finds the simulator's device: the first entry of
// CUDA_VISIBLE_DEVICES (an index or a UUID), default 0. With a state dir
// it creates DIR/devices when missing and DIR/procs.
func openGPU(e *simEnv) (*gpuView, error) {
	if e.VisibleSet && e.VisibleDev == "" {
		return nil, errNoGPU
	}
	return openGPUDevice(e, e.VisibleDev)
}

// openGPUDevice opens the device named by one CUDA_VISIBLE_DEVICES entry
// (an index or a UUID; "" is 0).
func openGPUDevice(e *simEnv, want string) (*gpuView, error) {
	v := &gpuView{dir: e.StateDir, isAlive: pidAlive}
	if v.dir == "" {
		v.dev = device{Index: 0, UUID: defaultUUID, Total: e.GPUTotal, Reserved: defaultReserved, Name: defaultDeviceName}
		return v, nil
	}
	if err := os.MkdirAll(filepath.Join(v.dir, "procs"), 0o755); err != nil {
		return nil, fmt.Errorf("create %s/procs: %w", v.dir, err)
	}
	path := filepath.Join(v.dir, "devices")
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		line := fmt.Sprintf("%s %d %d %s\n", defaultUUID, e.GPUTotal, defaultReserved, defaultDeviceName)
		if err := createExclusive(path, []byte(line)); err != nil {
			return nil, err
		}
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	devs, err := parseDevices(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	d, ok := pickDevice(devs, want)
	if !ok {
		return nil, errNoGPU
	}
	v.dev = d
	return v, nil
}

var errNoGPU = errors.New("No CUDA GPUs are available")

// pickDevice resolves the first CUDA_VISIBLE_DEVICES entry: "" → 0, an
// index, or a UUID (or unique UUID prefix, as CUDA accepts).
func pickDevice(devs []device, want string) (device, bool) {
	if want == "" {
		want = "0"
	}
	if n, err := strconv.Atoi(want); err == nil {
		if n < 0 || n >= len(devs) {
			return device{}, false
		}
		return devs[n], true
	}
	var found []device
	for _, d := range devs {
		if d.UUID == want {
			return d, true
		}
		if strings.HasPrefix(d.UUID, want) {
			found = append(found, d)
		}
	}
	if len(found) == 1 {
		return found[0], true
	}
	return device{}, false
}

// createExclusive writes path atomically and never clobbers a file that
// another process created first (link fails with EEXIST).
func createExclusive(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".devices-*")
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return nil
}

// writeAtomic writes path through a temp file in the same folder + rename.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// setUsage publishes how much memory pid holds on the device (DIR/procs/<pid>).
func (v *gpuView) setUsage(pid int, used int64) error {
	if v.dir == "" {
		return nil
	}
	body := fmt.Sprintf("%d %d\n", v.dev.Index, used)
	return writeAtomic(filepath.Join(v.dir, "procs", strconv.Itoa(pid)), []byte(body))
}

// clearUsage removes pid's procs file (clean exit: the driver frees it).
func (v *gpuView) clearUsage(pid int) {
	if v.dir == "" {
		return
	}
	os.Remove(filepath.Join(v.dir, "procs", strconv.Itoa(pid)))
}

// othersUsed sums the memory of every live process on the device except
// skip. Without shared state nothing else is known.
func (v *gpuView) othersUsed(skip int) int64 {
	if v.dir == "" {
		return 0
	}
	procs := filepath.Join(v.dir, "procs")
	ents, err := os.ReadDir(procs)
	if err != nil {
		return 0
	}
	var sum int64
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid <= 0 || pid == skip || !v.isAlive(pid) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(procs, ent.Name()))
		if err != nil {
			continue // removed between ReadDir and ReadFile: it exited
		}
		m, err := parseProcEntries(data)
		if err != nil {
			continue
		}
		sum += m[v.dev.Index]
	}
	return sum
}

// pidAlive: the process exists and is not a zombie (a zombie's memory is
// already freed).
func pidAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	return procStatState(data) != 'Z' && procStatState(data) != 'X'
}

// procStatState returns the state letter of /proc/PID/stat, which follows
// the last ')' (the command name may itself hold parentheses).
func procStatState(data []byte) byte {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return 0
	}
	return data[i+2]
}
