// What the monitor reports: the snapshot of every watched device, the
// recent fractions and the processes that hold memory.

package gpumon

import (
	"cmp"
	"slices"
	"time"
)

// Snapshot is the monitor's state for status, metrics and incidents.
type Snapshot struct {
	Up            bool     `json:"up"`
	Reason        string   `json:"reason,omitempty"`      // why not up
	Attribution   string   `json:"attribution,omitempty"` // "pid" | "device totals: <why>"
	Driver        string   `json:"driver,omitempty"`
	Errors        uint64   `json:"errors"`         // failed NVML queries since start
	DroppedAlerts uint64   `json:"dropped_alerts"` // alert events a slow subscriber missed
	Devices       []Device `json:"devices"`
	Active        []Alert  `json:"active_alerts"`
}

// Device is one watched GPU.
type Device struct {
	Index             int       `json:"index"`
	UUID              string    `json:"uuid"`
	Name              string    `json:"name"`
	Used              uint64    `json:"used_bytes"` // everything not free, driver reserve included
	Total             uint64    `json:"total_bytes"`
	Fraction          float64   `json:"fraction"`
	Trend             string    `json:"trend"` // steady | climbing | spike
	SlopeBytesPerSec  float64   `json:"slope_bytes_per_sec"`
	SecondsToCritical float64   `json:"seconds_to_critical"` // < 0 when not climbing
	History           []float64 `json:"history"`             // fractions, last 10 min, 1 per sample, oldest first
	Budget            float64   `json:"budget_fraction"`     // what vLLM holds by design (0: not known yet)
	WarnAt            float64   `json:"warn_fraction"`       // gpu_memory_warn is raised at this fraction
	CriticalAt        float64   `json:"critical_fraction"`   // gpu_memory_critical is raised at this fraction
	// ReadAt: when Used was read (just before NVML was asked, so memory
	// was at least this recent); the admission samples pair it with the
	// proxy's requests in flight at that moment.
	ReadAt    time.Time `json:"read_at,omitzero"`
	Processes []Proc    `json:"processes"`
}

// Proc is one process holding memory on a watched GPU.
type Proc struct {
	PID     int    `json:"pid"`
	Device  int    `json:"device"`
	Used    uint64 `json:"used_bytes"`
	Command string `json:"command,omitempty"` // "" when not visible from here
	Ours    bool   `json:"ours"`              // part of the supervised tree
	// Role names a holder that is the guard's own but not vLLM's tree (the
	// weight cache daemon): memory held by design, never an orphan's nor
	// another process's.
	Role string `json:"role,omitempty"`
}

// Alert is one alert event: raised (Active) or cleared.
type Alert struct {
	Name              string    `json:"name"` // gpu_memory_warn | gpu_memory_critical | oom_predicted
	Device            int       `json:"device"`
	Active            bool      `json:"active"`
	Fraction          float64   `json:"fraction"`
	SecondsToCritical float64   `json:"seconds_to_critical"`
	At                time.Time `json:"at"`
	Message           string    `json:"message"`
}

// Release is the outcome of CheckReleased.
type Release struct {
	Released  bool   `json:"released"`
	Method    string `json:"method"`         // "pid" | "device totals" | "unavailable"
	Held      []Proc `json:"held,omitempty"` // the tree's processes still listed by NVML (device totals: every process listed on a device still above its baseline)
	HeldBytes uint64 `json:"held_bytes"`     // still held: Σ Held, or the excess over the baseline
	Message   string `json:"message"`
}

// FreeCheck is the outcome of CheckFree.
type FreeCheck struct {
	OK      bool         `json:"ok"`    // launching may go ahead
	Known   bool         `json:"known"` // false: NVML unavailable, nothing was checked (OK is then true)
	Devices []DeviceFree `json:"devices,omitempty"`
	Holders []Proc       `json:"holders,omitempty"` // who holds memory on the devices short of it
	Message string       `json:"message"`
}

// DeviceFree is one device's part of a FreeCheck.
type DeviceFree struct {
	Index  int    `json:"index"`
	UUID   string `json:"uuid"`
	Free   uint64 `json:"free_bytes"`
	Needed uint64 `json:"needed_bytes"`
	Total  uint64 `json:"total_bytes"`
	OK     bool   `json:"ok"`
	// Own is what the guard's own holder outside vLLM's tree (the weight
	// cache daemon) holds here, counted in vLLM's budget: Needed is less it.
	Own uint64 `json:"own_bytes,omitempty"`
}

// Snapshot returns the current state.
func (m *Monitor) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Snapshot{Up: m.up, Reason: m.reason, Driver: m.driver, Errors: m.errors, DroppedAlerts: m.dropped,
		Devices: []Device{}, Active: []Alert{}}
	if len(m.devs) > 0 {
		s.Attribution = m.attribution
	}
	shown := max(int(historyShown/m.opts.SampleInterval), 1)
	from := max(len(m.hist)-shown, 0)
	for i, d := range m.devs {
		dev := Device{Index: d.Index, UUID: d.UUID, Name: d.Name, Trend: TrendSteady, SecondsToCritical: -1,
			History: []float64{}, Processes: slices.Clone(m.procs[i])}
		if dev.Processes == nil {
			dev.Processes = []Proc{}
		}
		if n := len(m.hist); n > 0 {
			last := m.hist[n-1]
			dev.Used, dev.Total, dev.ReadAt = last.used[i], last.total[i], last.read
			dev.Fraction = float64(dev.Used) / float64(dev.Total)
			tr := m.trends[i]
			dev.Trend, dev.SlopeBytesPerSec, dev.SecondsToCritical = tr.trend, tr.slope, tr.stc
		}
		for _, h := range m.hist[from:] {
			dev.History = append(dev.History, float64(h.used[i])/float64(h.total[i]))
		}
		dev.Budget = m.budgetOf(i)
		dev.WarnAt, dev.CriticalAt = m.thresholdsOf(i)
		s.Devices = append(s.Devices, dev)
		s.Active = append(s.Active, m.alerts[i].active()...)
	}
	return s
}

// RecentFractions returns the max-over-devices used fraction of the last n
// samples, oldest first (evidence for the exit classifier).
func (m *Monitor) RecentFractions(n int) []float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	from := max(len(m.hist)-max(n, 0), 0)
	out := make([]float64, 0, len(m.hist)-from)
	for _, s := range m.hist[from:] {
		f := 0.0
		for i := range s.used {
			f = max(f, float64(s.used[i])/float64(s.total[i]))
		}
		out = append(out, f)
	}
	return out
}

// Holders lists the processes holding memory on the watched devices now
// (the last sample's when NVML cannot be read right now), biggest first.
func (m *Monitor) Holders() []Proc {
	_, _, procs, err := m.readNow(m.treePids())
	if err != nil {
		m.mu.Lock()
		procs = slices.Clone(m.procs)
		m.mu.Unlock()
	}
	var out []Proc
	for _, ps := range procs {
		out = append(out, ps...)
	}
	slices.SortStableFunc(out, func(a, b Proc) int { return cmp.Compare(b.Used, a.Used) })
	return out
}
