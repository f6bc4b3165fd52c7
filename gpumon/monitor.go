// Package gpumon owns the guard's view of GPU memory: NVML sampling of the
// chosen devices, attribution of memory to processes (the supervised tree or
// others), the trend of each device (steady, climbing, spike) with the time
// left until critical, the memory-side alerts (gpu_memory_warn,
// gpu_memory_critical, oom_predicted), and the checks around a restart:
// waiting until a dead tree's memory is released and whether enough is free
// to launch again.
//
// NVML comes from go-nvml, which needs cgo; without cgo, or without a driver,
// the monitor reports "GPU metrics unavailable" and every check answers that
// it could not look. The pure parts (trend.go, alerts.go, devices.go) need no
// NVML and are tested on recorded series.
package gpumon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.uber.org/zap"
)

// Options configure a Monitor; zero values take the [gpu] defaults.
type Options struct {
	Devices            []string // [gpu] devices (indices or UUIDs); empty → CUDAVisibleDevices → all
	CUDAVisibleDevices string   // the child's CUDA_VISIBLE_DEVICES (indices or UUIDs, as CUDA reads them; "" = unset)
	SampleInterval     time.Duration
	WarnFraction       float64 // fixed thresholds, used when Thresholds is nil
	CriticalFraction   float64
	// Thresholds, when set, gives the warn and critical fractions for vLLM's
	// budget (a fraction of total; see SetBudget): memory beyond what vLLM
	// holds by design is what can run out.
	Thresholds     func(budget float64) (warn, critical float64)
	PredictHorizon time.Duration
	History        time.Duration // ring length, default 15m
}

func (o Options) withDefaults() Options {
	if o.SampleInterval <= 0 {
		o.SampleInterval = time.Second
	}
	if o.WarnFraction <= 0 {
		o.WarnFraction = 0.90
	}
	if o.CriticalFraction <= 0 {
		o.CriticalFraction = 0.97
	}
	if o.PredictHorizon <= 0 {
		o.PredictHorizon = 10 * time.Minute
	}
	if o.History <= 0 {
		o.History = 15 * time.Minute
	}
	return o
}

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

// Release is the outcome of WaitReleased.
type Release struct {
	Released  bool          `json:"released"`
	Method    string        `json:"method"` // "pid" | "device totals" | "unavailable"
	Waited    time.Duration `json:"waited"`
	Held      []Proc        `json:"held,omitempty"` // the tree's processes still listed by NVML (device totals: every process listed on a device still above its baseline)
	HeldBytes uint64        `json:"held_bytes"`     // still held: Σ Held, or the excess over the baseline
	Message   string        `json:"message"`
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
}

const (
	historyShown     = 10 * time.Minute
	releaseMargin    = 0.02 // device totals: released when back within this of the baseline
	subscriberBuffer = 64
	maxInitRetry     = time.Minute
)

// source is the seam to NVML: go-nvml under cgo, or an unavailable stand-in.
// Calls are serialised by the Monitor.
type source interface {
	open() (driver string, devices []deviceInfo, err error)
	read(indices []int) ([]reading, error)
	close()
}

// reading is one device's memory at one instant.
type reading struct {
	used, total, free uint64
	procs             []procUse
	noProcs           bool // the driver does not list processes on this device
}

type procUse struct {
	pid  int
	used uint64
}

// unavailableError means retrying cannot help (no cgo, no library given).
type unavailableError struct{ reason string }

func (e *unavailableError) Error() string { return e.reason }

type unavailableSource struct{ reason string }

func (u unavailableSource) open() (string, []deviceInfo, error) {
	return "", nil, &unavailableError{u.reason}
}
func (u unavailableSource) read([]int) ([]reading, error) { return nil, &unavailableError{u.reason} }
func (u unavailableSource) close()                        {}

// Disabled returns a Monitor that never reads NVML and reports reason, for
// builds and tests with no GPU library.
func Disabled(reason string, opts Options, log *zap.Logger) *Monitor {
	return newMonitor(unavailableSource{reason}, opts, log)
}

// sample is one tick's readings of every watched device.
type sample struct {
	at    time.Time
	read  time.Time // just before NVML was asked: the reading is no older
	used  []uint64
	total []uint64
}

// Monitor samples NVML and keeps the trend and alert state. Its methods are
// safe from any goroutine.
type Monitor struct {
	opts    Options
	log     *zap.Logger
	src     source
	trend   trendConfig
	alert   alertConfig
	histCap int

	callMu   sync.Mutex // serialises every use of src
	opened   bool       // guarded by callMu
	cmdCache map[int]string

	mu          sync.Mutex
	up          bool
	reason      string
	driver      string
	errors      uint64
	failing     bool // inside an episode of failed queries (logged once)
	downLogged  bool
	devs        []deviceInfo
	trackers    []trendTracker
	alerts      []alertState
	trends      []trendResult
	procs       [][]Proc
	noProcs     bool
	hist        []sample
	tree        func() []int
	pidWorks    bool // a tree pid was seen in NVML's lists: pid attribution works here
	attribution string
	loading     bool
	budget      float64   // SetBudget's: utilization, or 0 (learned at ready)
	loadPeak    []float64 // per device, the highest fraction while loading
	learned     []float64 // per device, what vLLM held when it became ready
	subs        map[chan Alert]struct{}
	dropped     uint64
}

func newMonitor(src source, opts Options, log *zap.Logger) *Monitor {
	if log == nil {
		log = zap.NewNop()
	}
	o := opts.withDefaults()
	m := &Monitor{
		opts:        o,
		log:         log,
		src:         src,
		trend:       trendConfig{window: trendWindow(o.SampleInterval, o.PredictHorizon), warn: o.WarnFraction, critical: o.CriticalFraction},
		alert:       alertConfig{warn: o.WarnFraction, critical: o.CriticalFraction, horizon: o.PredictHorizon},
		histCap:     max(int(o.History/o.SampleInterval), 1),
		cmdCache:    map[int]string{},
		reason:      "GPU metrics not sampled yet",
		attribution: "pid",
		subs:        map[chan Alert]struct{}{},
	}
	return m
}

// Run samples every SampleInterval until ctx is done, then shuts NVML down.
// When NVML cannot be initialised it retries with backoff (up to a minute
// apart), logging "GPU metrics unavailable" once per outage.
func (m *Monitor) Run(ctx context.Context) {
	defer m.Close()
	retry := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(m.opts.SampleInterval),
		backoff.WithMaxInterval(maxInitRetry),
		backoff.WithMaxElapsedTime(0))
	tick := time.NewTicker(m.opts.SampleInterval)
	defer tick.Stop()
	for {
		if err := m.open(); err != nil {
			m.setDown(err)
			if _, ok := errors.AsType[*unavailableError](err); ok {
				<-ctx.Done()
				return
			}
			t := time.NewTimer(retry.NextBackOff())
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		retry.Reset()
		m.tick()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Open initialises NVML now, so that checks made before Run's first sample
// (the pre-start free-memory check) already see the GPUs. Run logs failures.
func (m *Monitor) Open() error { return m.open() }

// Once opens NVML if needed, takes one sample and returns the snapshot; for
// `vllm-guard gpus`, without Run. It shuts NVML down again if it opened it.
func (m *Monitor) Once() Snapshot {
	m.callMu.Lock()
	wasOpen := m.opened
	m.callMu.Unlock()
	if err := m.open(); err != nil {
		m.setDown(err)
		return m.Snapshot()
	}
	m.tick()
	s := m.Snapshot()
	if !wasOpen {
		m.Close()
	}
	return s
}

// Close shuts NVML down; Run does it when it returns.
func (m *Monitor) Close() {
	m.callMu.Lock()
	defer m.callMu.Unlock()
	if m.opened {
		m.src.close()
		m.opened = false
		m.mu.Lock()
		m.up = false
		m.reason = "GPU monitor stopped"
		m.mu.Unlock()
	}
}

func (m *Monitor) open() error {
	m.callMu.Lock()
	defer m.callMu.Unlock()
	if m.opened {
		return nil
	}
	driver, all, err := m.src.open()
	if err != nil {
		return err
	}
	chosen, note, err := selectDevices(all, m.opts.Devices, m.opts.CUDAVisibleDevices)
	if err != nil {
		m.src.close()
		return err
	}
	m.opened = true
	m.mu.Lock()
	m.driver = driver
	m.devs = chosen
	m.trackers = make([]trendTracker, len(chosen))
	for i := range m.trackers {
		m.trackers[i].cfg = m.trend
	}
	m.alerts = make([]alertState, len(chosen))
	m.loadPeak = make([]float64, len(chosen))
	m.learned = make([]float64, len(chosen))
	m.trends = make([]trendResult, len(chosen))
	m.procs = make([][]Proc, len(chosen))
	m.hist = nil
	m.up, m.reason, m.downLogged, m.failing = true, "", false, false
	m.mu.Unlock()
	idx := make([]int, len(chosen))
	for i, d := range chosen {
		idx[i] = d.Index
	}
	m.log.Info("GPU metrics available", zap.String("driver", driver), zap.Ints("gpus", idx))
	if note != "" {
		m.log.Warn("GPU selection", zap.String("note", note))
	}
	return nil
}

func (m *Monitor) setDown(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.up = false
	m.reason = "GPU metrics unavailable: " + err.Error()
	if !m.downLogged {
		m.downLogged = true
		m.log.Warn("GPU metrics unavailable", zap.String("reason", err.Error()))
	}
}

// SetTree gives the function that lists the supervised tree's pids.
func (m *Monitor) SetTree(pids func() []int) {
	m.mu.Lock()
	m.tree = pids
	m.mu.Unlock()
}

// SetLoading tells the monitor whether vLLM is loading. While it loads,
// memory climbs by design up to its budget, so oom_predicted is not raised;
// each change restarts the trend fit, so neither the load nor the drop after
// a death reads as a trend.
func (m *Monitor) SetLoading(loading bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.loading == loading {
		return
	}
	m.loading = loading
	now := time.Now()
	for i := range m.trackers {
		m.trackers[i].restart(now)
	}
	for i := range m.loadPeak {
		if loading {
			m.loadPeak[i], m.learned[i] = 0, 0
		} else {
			// Loaded: what vLLM holds now it holds for the whole run.
			m.learned[i] = m.loadPeak[i]
		}
	}
}

// SetThresholds replaces how warn and critical follow the budget (a config
// reload); the next sample uses them.
func (m *Monitor) SetThresholds(f func(budget float64) (warn, critical float64)) {
	m.mu.Lock()
	m.opts.Thresholds = f
	m.mu.Unlock()
}

// SetBudget tells the monitor vLLM's budget for the next run, as a
// fraction of each device's total: its gpu_memory_utilization, or 0 when
// vLLM sizes its KV cache in bytes (--kv-cache-memory-bytes) and the budget
// is learned. Either way, once vLLM is ready the budget is at least what it
// held then (its non-torch memory, CUDA graphs and context come on top of
// the utilization share). Alerts mean memory beyond the budget.
func (m *Monitor) SetBudget(fraction float64) {
	m.mu.Lock()
	m.budget = fraction
	m.mu.Unlock()
}

// budgetOf is device i's budget (mu held); 0 when not known yet.
func (m *Monitor) budgetOf(i int) float64 {
	b := m.budget
	if i >= 0 && i < len(m.learned) {
		b = max(b, m.learned[i])
	}
	return b
}

// thresholdsOf are device i's warn and critical fractions (mu held). An
// unknown budget (bytes-sized KV cache, still loading) alerts only near a
// full device.
func (m *Monitor) thresholdsOf(i int) (warn, critical float64) {
	if m.opts.Thresholds == nil {
		return m.opts.WarnFraction, m.opts.CriticalFraction
	}
	b := m.budgetOf(i)
	if b <= 0 {
		b = 1
	}
	return m.opts.Thresholds(b)
}

// CriticalFraction is the lowest critical threshold of the watched devices
// now (the classifier's "memory was critical before the death").
func (m *Monitor) CriticalFraction() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := 1.0
	for i := range m.devs {
		_, ci := m.thresholdsOf(i)
		c = min(c, ci)
	}
	if len(m.devs) == 0 {
		_, c = m.thresholdsOf(-1)
	}
	return c
}

// Subscribe returns alert events (raised and cleared) and a function that
// ends the subscription. Events never block the monitor: when the buffer is
// full the event is dropped and counted (Snapshot.DroppedAlerts).
func (m *Monitor) Subscribe() (<-chan Alert, func()) {
	ch := make(chan Alert, subscriberBuffer)
	m.mu.Lock()
	m.subs[ch] = struct{}{}
	m.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			m.mu.Lock()
			delete(m.subs, ch)
			m.mu.Unlock()
			close(ch)
		})
	}
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

// readNow takes a fresh reading; callers hold nothing.
func (m *Monitor) readNow(ours map[int]bool) ([]deviceInfo, []reading, [][]Proc, error) {
	m.callMu.Lock()
	defer m.callMu.Unlock()
	if !m.opened {
		m.mu.Lock()
		reason := m.reason
		m.mu.Unlock()
		return nil, nil, nil, &unavailableError{reason}
	}
	m.mu.Lock()
	devs := slices.Clone(m.devs)
	m.mu.Unlock()
	idx := make([]int, len(devs))
	for i, d := range devs {
		idx[i] = d.Index
	}
	rs, err := m.src.read(idx)
	if err == nil {
		err = validate(devs, rs)
	}
	if err != nil {
		return devs, nil, nil, err
	}
	return devs, rs, m.procsOf(devs, rs, ours), nil
}

// validate rejects readings no GPU can produce, so they neither raise a false
// critical alert nor bend the trend.
func validate(devs []deviceInfo, rs []reading) error {
	for i, r := range rs {
		if r.total == 0 || r.used > r.total {
			return fmt.Errorf("NVML reported %d bytes used of %d on GPU %d: impossible reading, sample skipped (driver fault?)",
				r.used, r.total, devs[i].Index)
		}
	}
	return nil
}

// procsOf builds the process lists, with command lines cached per pid
// (callMu held).
func (m *Monitor) procsOf(devs []deviceInfo, rs []reading, ours map[int]bool) [][]Proc {
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
			out[i] = append(out[i], Proc{PID: p.pid, Device: devs[i].Index, Used: p.used, Command: cmd, Ours: ours[p.pid]})
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

// tick takes one sample and updates trends, alerts and attribution.
func (m *Monitor) tick() {
	ours := m.treePids()
	read := time.Now()
	devs, rs, procs, err := m.readNow(ours)
	if _, ok := errors.AsType[*unavailableError](err); ok {
		return
	}
	visible := map[int]bool{}
	if err == nil && len(ours) > 0 {
		m.reattribute(procs, ours)
		for _, ps := range procs {
			for _, p := range ps {
				if !p.Ours && pidVisible(p.PID) {
					visible[p.PID] = true
				}
			}
		}
	}
	at := time.Now()

	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Equal(devs, m.devs) {
		return // reopened meanwhile
	}
	if err != nil {
		m.errors++
		m.up = false
		m.reason = "NVML query failed: " + err.Error()
		if !m.failing {
			m.failing = true
			m.log.Warn("NVML query failed; GPU readings paused until it recovers", zap.Error(err))
		}
		return
	}
	if m.failing {
		m.failing = false
		m.log.Info("NVML queries recovered", zap.Uint64("errors_total", m.errors))
	}
	m.up, m.reason = true, ""

	s := sample{at: at, read: read, used: make([]uint64, len(rs)), total: make([]uint64, len(rs))}
	m.noProcs = false
	for i, r := range rs {
		s.used[i], s.total[i] = r.used, r.total
		m.noProcs = m.noProcs || r.noProcs
	}
	m.hist = append(m.hist, s)
	if len(m.hist) >= 2*m.histCap {
		m.hist = append(m.hist[:0], m.hist[len(m.hist)-m.histCap:]...)
	}
	m.procs = procs
	m.attribute(ours, visible)

	var events []Alert
	for i, d := range devs {
		f := float64(s.used[i]) / float64(s.total[i])
		if m.loading {
			m.loadPeak[i] = max(m.loadPeak[i], f)
		}
		warn, crit := m.thresholdsOf(i)
		m.trackers[i].cfg.warn, m.trackers[i].cfg.critical = warn, crit
		tr := m.trackers[i].update(m.points(i))
		m.trends[i] = tr
		ac := m.alert
		ac.warn, ac.critical = warn, crit
		events = append(events, m.alerts[i].update(ac, d.Index, f, tr, m.loading, at)...)
	}
	for _, a := range events {
		log := m.log.Info
		if a.Active {
			log = m.log.Warn
		}
		log("GPU memory alert", zap.String("alert", a.Name), zap.Bool("active", a.Active),
			zap.Int("gpu", a.Device), zap.Float64("fraction", a.Fraction), zap.String("message", a.Message))
		for ch := range m.subs {
			select {
			case ch <- a:
			default:
				m.dropped++
			}
		}
	}
}

// reattribute asks for the tree once more when NVML lists a process this
// host can see that the tree, read just before NVML, did not name: one
// started in between (vLLM's EngineCore early in a load) is ours, not a
// neighbour's.
func (m *Monitor) reattribute(procs [][]Proc, ours map[int]bool) {
	unknown := false
	for _, ps := range procs {
		for _, p := range ps {
			unknown = unknown || (!p.Ours && pidVisible(p.PID))
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

// points is device i's recent history for the trend (mu held).
func (m *Monitor) points(i int) []point {
	need := int(m.trend.window/m.opts.SampleInterval) + spikeSamples + 2
	start := max(len(m.hist)-need, 0)
	out := make([]point, 0, len(m.hist)-start)
	for _, s := range m.hist[start:] {
		out = append(out, point{at: s.at, used: s.used[i], total: s.total[i]})
	}
	return out
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
		df := DeviceFree{Index: devs[i].Index, UUID: devs[i].UUID, Free: r.free, Needed: need, Total: r.total, OK: r.free >= need}
		fc.Devices = append(fc.Devices, df)
		if df.OK {
			continue
		}
		fc.OK = false
		fc.Holders = append(fc.Holders, procs[i]...)
		short = append(short, fmt.Sprintf("GPU %d: %s free of %s, %s needed (%s); held by %s",
			df.Index, gibU(df.Free), gibU(df.Total), gibU(df.Needed), needFor(utilization, kvBytes), describe(procs[i])))
	}
	if fc.OK {
		fc.Message = "enough free GPU memory for " + needFor(utilization, kvBytes)
	} else {
		fc.Message = strings.Join(short, "; ")
	}
	return fc
}

// WaitReleased waits until none of pids appears in NVML's process lists, up
// to timeout, checking once per SampleInterval. Where NVML's pids cannot be
// matched to ours (a container's PID namespace), it waits instead until each
// device's used memory is back within 2% of total of baselineUsed (the level
// before launch, in Snapshot.Devices order; a device without a baseline is
// not waited on). On timeout it says what is still held.
func (m *Monitor) WaitReleased(ctx context.Context, pids []int, baselineUsed []uint64, timeout time.Duration) Release {
	start := time.Now()
	deadline := start.Add(timeout)
	set := map[int]bool{}
	for _, p := range pids {
		set[p] = true
	}
	for {
		rel, done := m.releaseCheck(set, baselineUsed)
		rel.Waited = time.Since(start)
		if done {
			return rel
		}
		left := time.Until(deadline)
		if left <= 0 {
			rel.Message = fmt.Sprintf("GPU memory still held after %s: %s", timeout, rel.Message)
			return rel
		}
		t := time.NewTimer(min(left, m.opts.SampleInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			rel.Waited = time.Since(start)
			rel.Message = fmt.Sprintf("stopped waiting for GPU memory (%v): %s", ctx.Err(), rel.Message)
			return rel
		case <-t.C:
		}
	}
}

// CheckReleased is one reading of WaitReleased's test, without waiting:
// Released says whether the memory of pids (or, where PIDs cannot be
// matched, the devices' totals) is back.
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
			held = append(held, procs[i]...)
			over = append(over, fmt.Sprintf("GPU %d at %s, %s before launch (listed: %s)",
				devs[i].Index, gibU(r.used), gibU(baseline[i]), describe(procs[i])))
		}
	}
	if len(over) > 0 {
		return Release{Method: "device totals", Held: held, HeldBytes: bytes, Message: strings.Join(over, "; ")}, false
	}
	return Release{Released: true, Method: "device totals", Message: "GPU memory back to its level before launch"}, true
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
