// The checks around a restart: whether enough memory is free to launch,
// and whether a dead tree's memory was released.

package gpumon

import (
	"errors"
	"fmt"
	"strings"
)

// CheckFree reports whether every watched device has at least
// utilization × total free, as vLLM requires at startup — also when vLLM
// sizes its KV cache in bytes (kvBytes > 0, --kv-cache-memory-bytes): its
// start check asks for the utilization's share all the same — naming the
// holders of memory on the devices that do not.
func (m *Monitor) CheckFree(utilization float64, kvBytes uint64) FreeCheck {
	devs, rs, procs, err := m.readNow(m.treePids())
	if err != nil {
		return FreeCheck{OK: true, Known: false, Message: err.Error() + "; free memory not checked"}
	}
	fc := FreeCheck{OK: true, Known: true}
	var short []string
	for i, r := range rs {
		need := uint64(utilization * float64(r.total))
		others, own := splitOwn(procs[i])
		// The guard's own holder (the weight cache daemon) holds vLLM's
		// weights: they count in vLLM's budget (vLLM's own check asks for
		// utilization × total less them), never against it.
		need -= min(need, own)
		df := DeviceFree{Index: devs[i].Index, UUID: devs[i].UUID, Free: r.free, Needed: need, Total: r.total, OK: r.free >= need, Own: own}
		fc.Devices = append(fc.Devices, df)
		if df.OK {
			continue
		}
		fc.OK = false
		fc.Holders = append(fc.Holders, others...)
		short = append(short, fmt.Sprintf("GPU %d: %s free of %s, %s needed (%s%s); held by %s",
			df.Index, gibU(df.Free), gibU(df.Total), gibU(df.Needed), needFor(utilization, kvBytes), ownText(procs[i], own), describe(others)))
	}
	if fc.OK {
		fc.Message = "enough free GPU memory for " + needFor(utilization, kvBytes)
	} else {
		fc.Message = strings.Join(short, "; ")
	}
	return fc
}

// CheckReleased is one reading, without waiting (the supervisor's
// releasing sub-state reads again at each sample): Released says whether
// none of pids appears in NVML's process lists, or, where NVML's pids
// cannot be matched to ours (a container's PID namespace), whether each
// device's used memory is back within 2% of total of baselineUsed (the
// level before launch, in Snapshot.Devices order; a device without a
// baseline is not waited on). When not, it says what is still held.
func (m *Monitor) CheckReleased(pids []int, baselineUsed []uint64) Release {
	set := make(map[int]bool, len(pids))
	for _, p := range pids {
		set[p] = true
	}
	rel, done := m.releaseCheck(set, baselineUsed)
	rel.Released = done
	return rel
}

func (m *Monitor) releaseCheck(pids map[int]bool, baseline []uint64) (Release, bool) {
	devs, rs, procs, err := m.readNow(pids)
	if err != nil {
		if _, ok := errors.AsType[*unavailableError](err); ok {
			return Release{Released: true, Method: "unavailable", Message: err.Error() + "; release not checked"}, true
		}
		return Release{Method: "pid", Message: err.Error()}, false
	}
	var held []Proc
	var bytes uint64
	for _, ps := range procs {
		for _, p := range ps {
			if p.Ours {
				held = append(held, p)
				bytes += p.Used
			}
		}
	}
	if len(held) > 0 {
		return Release{Method: "pid", Held: held, HeldBytes: bytes,
			Message: "still listed by NVML: " + describe(held)}, false
	}
	m.mu.Lock()
	totals := strings.HasPrefix(m.attribution, "device totals")
	m.mu.Unlock()
	if !totals {
		return Release{Released: true, Method: "pid", Message: "GPU memory released"}, true
	}
	// NVML's pids cannot be matched to ours: judge by the totals, and name
	// whatever NVML lists on the devices still above their baseline.
	var over []string
	for i, r := range rs {
		if i >= len(baseline) {
			continue
		}
		limit := baseline[i] + uint64(releaseMargin*float64(r.total))
		if r.used > limit {
			bytes += r.used - baseline[i]
			others, _ := splitOwn(procs[i]) // the guard's own holder is no survivor
			held = append(held, others...)
			over = append(over, fmt.Sprintf("GPU %d at %s, %s before launch (listed: %s)",
				devs[i].Index, gibU(r.used), gibU(baseline[i]), describe(procs[i])))
		}
	}
	if len(over) > 0 {
		return Release{Method: "device totals", Held: held, HeldBytes: bytes, Message: strings.Join(over, "; ")}, false
	}
	return Release{Released: true, Method: "device totals", Message: "GPU memory back to its level before launch"}, true
}

// splitOwn parts a device's holders into the others and the bytes of the
// guard's own holders outside vLLM's tree (SetOwn).
func splitOwn(ps []Proc) (others []Proc, own uint64) {
	for _, p := range ps {
		if p.Role != "" {
			own += p.Used
			continue
		}
		others = append(others, p)
	}
	return others, own
}

// ownText says what of the budget the guard's own holders already hold.
func ownText(ps []Proc, own uint64) string {
	if own == 0 {
		return ""
	}
	var role string
	for _, p := range ps {
		if p.Role != "" {
			role = p.Role
			break
		}
	}
	return fmt.Sprintf(", less the %s's %s, vLLM's own weights", role, gibU(own))
}

func needFor(utilization float64, kvBytes uint64) string {
	if kvBytes > 0 {
		return fmt.Sprintf("utilization %.2f (vLLM's start check, also with --kv-cache-memory-bytes %d)", utilization, kvBytes)
	}
	return fmt.Sprintf("utilization %.2f", utilization)
}

func describe(ps []Proc) string {
	if len(ps) == 0 {
		return "no listed process"
	}
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		cmd := p.Command
		if cmd == "" {
			cmd = "not visible here"
		}
		parts = append(parts, fmt.Sprintf("pid %d (%s) %s", p.PID, cmd, gibU(p.Used)))
	}
	return strings.Join(parts, ", ")
}

func gibU(b uint64) string { return gib(float64(b)) }
