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
	"context"
	"errors"
	"fmt"
	"slices"
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

const (
	historyShown     = 10 * time.Minute
	releaseMargin    = 0.02 // device totals: released when back within this of the baseline
	subscriberBuffer = 64
	maxInitRetry     = time.Minute
)

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
	lostAtOpen  int // 1 + the index of a GPU NVML answered "GPU is lost" for when listing them; 0: none
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
	own         func() []int // the guard's own other holders (the weight cache daemon): SetOwn
	ownRole     string
	pidWorks    bool // a tree pid was seen in NVML's lists: pid attribution works here
	attribution string
	loading     bool
	budget      float64   // SetBudget's: utilization, or 0 (learned at ready)
	loadPeak    []float64 // per device, the highest fraction while loading
	learned     []float64 // per device, what vLLM held when it became ready
	subs        map[chan Alert]struct{}
	dropped     uint64
	hw          *hwState                   // hardware health (health.go)
	healthSubs  map[chan struct{}]struct{} // HealthChanged's subscribers
	sampled     chan struct{}              // Sampled's: closed when a reading is stored, then nil until asked for again
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
		m.closeHealth()
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
	// A GPU lost when NVML lists them (fallen off the bus before this
	// guard started: after an XID 79 and the guard's exit 69, a restart by
	// Kubernetes or by hand) is known, not unknown: the pre-start check
	// must see it lost rather than start vLLM on it.
	lost := 0
	if i, ok := isLost(err); ok {
		lost = i + 1
	}
	m.mu.Lock()
	m.lostAtOpen = lost
	m.mu.Unlock()
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
	m.openHealth(chosen)
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

// Sampled returns a channel that is closed when the monitor next stores a
// reading, so that the snapshot has it (a newer Device.ReadAt): the other
// parts of the guard step on the monitor's samples instead of sampling on
// clocks of their own. Every call until then returns the same channel and
// the reading closes it (broadcast by close), so any number of readers may
// wait at no cost to the sampler, which never blocks on them, and a reader
// that stops waiting leaves nothing behind to unsubscribe. A query that
// failed stores nothing and closes nothing; neither does a monitor that
// cannot open NVML or has stopped. A reader that calls Sampled again as
// soon as its channel closes, before it reads the snapshot, never sleeps
// through a reading: one stored while it is busy closes its new channel
// (several come as one wake, like a notify channel of capacity 1), and the
// snapshot it then reads is the newest.
func (m *Monitor) Sampled() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sampled == nil {
		m.sampled = make(chan struct{})
	}
	return m.sampled
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

// tick takes one sample and updates trends, alerts and attribution.
func (m *Monitor) tick() {
	ours := m.treePids()
	read := time.Now()
	devs, rs, procs, err := m.readNow(ours)
	if _, ok := errors.AsType[*unavailableError](err); ok {
		return
	}
	lost := -1
	if i, ok := isLost(err); ok {
		lost = i
	}
	m.sampleHealth(lost)
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
	// The reading is in the snapshot (mu is held until it is whole): wake
	// Sampled's readers.
	if m.sampled != nil {
		close(m.sampled)
		m.sampled = nil
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
