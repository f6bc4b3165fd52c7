// Attribution: which processes hold memory on each device, and whether it
// is the supervised tree's (by PID, or by the device when the driver hides
// PIDs, as in a container).

package gpumon

import (
	"cmp"
	"slices"
)

// SetTree gives the function that lists the supervised tree's pids.
func (m *Monitor) SetTree(pids func() []int) {
	m.mu.Lock()
	m.tree = pids
	m.mu.Unlock()
}

// treePids calls the tree function outside any lock (it may be slow).
func (m *Monitor) treePids() map[int]bool {
	m.mu.Lock()
	f := m.tree
	m.mu.Unlock()
	if f == nil {
		return nil
	}
	set := map[int]bool{}
	for _, p := range f() {
		set[p] = true
	}
	return set
}

// SetOwn gives the function that lists the PIDs of the guard's own
// other holders of GPU memory, outside vLLM's tree (the weight cache
// daemon's), and what they are (role): their memory is held by design for
// vLLM. CheckFree counts it in vLLM's budget, as vLLM's own start check
// does for an ipc_cache engine, and never names it as a holder; the
// snapshot names it by role.
func (m *Monitor) SetOwn(role string, pids func() []int) {
	m.mu.Lock()
	m.own, m.ownRole = pids, role
	m.mu.Unlock()
}

// ownPids calls SetOwn's function outside any lock.
func (m *Monitor) ownPids() (map[int]bool, string) {
	m.mu.Lock()
	f, role := m.own, m.ownRole
	m.mu.Unlock()
	if f == nil {
		return nil, ""
	}
	set := map[int]bool{}
	for _, p := range f() {
		set[p] = true
	}
	return set, role
}

// procsOf builds the process lists, with command lines cached per pid
// (callMu held).
func (m *Monitor) procsOf(devs []deviceInfo, rs []reading, ours map[int]bool) [][]Proc {
	own, role := m.ownPids()
	out := make([][]Proc, len(rs))
	seen := map[int]bool{}
	for i, r := range rs {
		for _, p := range r.procs {
			cmd, ok := m.cmdCache[p.pid]
			if !ok {
				cmd = commandOf(p.pid)
				m.cmdCache[p.pid] = cmd
			}
			seen[p.pid] = true
			pr := Proc{PID: p.pid, Device: devs[i].Index, Used: p.used, Command: cmd, Ours: ours[p.pid]}
			if own[p.pid] && !pr.Ours {
				pr.Role = role
			}
			out[i] = append(out[i], pr)
		}
		slices.SortFunc(out[i], func(a, b Proc) int { return cmp.Or(cmp.Compare(b.Used, a.Used), cmp.Compare(a.PID, b.PID)) })
	}
	for pid := range m.cmdCache {
		if !seen[pid] {
			delete(m.cmdCache, pid) // gone: a reused pid must not inherit the command
		}
	}
	return out
}

// reattribute asks for the tree once more when NVML lists a process this
// host can see that the tree, read just before NVML, did not name: one
// started in between (vLLM's EngineCore early in a load) is ours, not a
// neighbour's.
func (m *Monitor) reattribute(procs [][]Proc, ours map[int]bool) {
	unknown := false
	for _, ps := range procs {
		for _, p := range ps {
			unknown = unknown || (!p.Ours && p.Role == "" && pidVisible(p.PID))
		}
	}
	if !unknown {
		return
	}
	again := m.treePids()
	for _, ps := range procs {
		for j := range ps {
			if again[ps[j].PID] {
				ps[j].Ours, ours[ps[j].PID] = true, true
			}
		}
	}
}

// attribute decides whether NVML's pids can be matched to the tree (mu held).
func (m *Monitor) attribute(ours, visible map[int]bool) {
	anyProcs, anyOurs := false, false
	for _, ps := range m.procs {
		for _, p := range ps {
			anyProcs = true
			anyOurs = anyOurs || p.Ours
		}
	}
	switch {
	case m.noProcs:
		m.attribution = "device totals: the driver does not list processes"
	case anyOurs:
		m.pidWorks = true // pid namespaces do not change under a running guard
		m.attribution = "pid"
	case m.pidWorks:
		m.attribution = "pid"
	case anyProcs && len(ours) > 0 && len(visible) == 0:
		m.attribution = "device totals: pids not visible (container?)"
	}
}
