// The GPU's own word on its hardware: XID events (waited on by a goroutine
// of their own, never by the sampler), uncorrected ECC counts, remapped
// rows, retired pages pending and a GPU that fell off the bus. The rest of
// the guard reads it as a HealthSnapshot; what it means for vLLM is decided
// by package policy.

package gpumon

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// healthSource is implemented by sources that can read hardware health
// (go-nvml). Calls of health are serialised by the Monitor like read;
// the eventWaiter's wait runs on the waiter goroutine alone.
type healthSource interface {
	health(index int) devHealth
	events(indices []int) (eventWaiter, []unsupportedNote, error)
}

// eventWaiter waits for the next hardware event of its set.
type eventWaiter interface {
	// wait returns the next event, or ok false after timeout with none.
	wait(timeout time.Duration) (ev hwEvent, ok bool, err error)
	free()
}

// hwEvent is one event NVML delivered.
type hwEvent struct {
	index int    // NVML index of the device
	xid   uint64 // XID number; 0 for an ECC event
	kind  string // "xid" | "dbe" (double-bit ECC) | "sbe"
}

// unsupportedNote says once that a device lacks a feature.
type unsupportedNote struct {
	index   int
	feature string
	why     string
}

// devHealth is one reading of one device's health.
type devHealth struct {
	lost  bool   // NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus
	reset string // NVML_ERROR_RESET_REQUIRED on a query: the driver wants a GPU reset

	eccKnown              bool
	eccVolatileUncorr     uint64
	eccAggregateUncorr    uint64
	remapKnown            bool
	remapCorr, remapUnc   int
	remapPending, remapKO bool
	retiredKnown          bool
	retiredPending        bool
	throttleKnown         bool
	throttle              []string // hardware clock event reasons in force

	unsupported []unsupportedNote // features this device does not report
}

// lostError marks a query that failed because the GPU is lost.
type lostError struct {
	index int
	err   error
}

func (e *lostError) Error() string { return e.err.Error() }
func (e *lostError) Unwrap() error { return e.err }

// Health is the snapshot of every watched device's hardware health.
type Health struct {
	Known   bool           `json:"known"` // false: NVML unavailable, nothing is known
	Devices []DeviceHealth `json:"devices"`
}

// DeviceHealth is one watched GPU's hardware health. Pointers are nil where
// the driver does not report the feature on this device.
type DeviceHealth struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// Lost: NVML answered "GPU is lost" (fallen off the bus): only a reset
	// or a reboot brings it back.
	Lost bool `json:"lost"`
	// ResetRequired: NVML answered "GPU requires reset" on a query.
	ResetRequired bool `json:"reset_required"`
	// ECC: uncorrected ECC error counts (volatile: since the driver loaded;
	// aggregate: the device's lifetime). nil: not supported.
	ECC *ECCCounts `json:"ecc,omitempty"`
	// Remap: rows remapped by the row remapper (A100 and later); nil: not
	// supported. Pending rows are remapped at the next GPU reset.
	Remap *RemappedRows `json:"remapped_rows,omitempty"`
	// RetiredPagesPending: pages retired by dynamic page retirement (before
	// A100) that wait for a reboot or reset; nil: not supported.
	RetiredPagesPending *bool `json:"retired_pages_pending,omitempty"`
	// Throttle: the hardware reasons the GPU's clocks are held down now
	// (hw_slowdown, hw_thermal, hw_power_brake, sw_thermal); nil: not
	// reported, empty: none.
	Throttle []string `json:"throttle,omitempty"`
	// ThrottleKnown: the driver reports clock event reasons on this GPU.
	ThrottleKnown bool `json:"throttle_known,omitempty"`
	// XIDs are the last XID events on the device, oldest first (at most
	// maxXIDsKept); XIDCounts counts every one since the guard started.
	XIDs      []XIDEvent        `json:"xids,omitempty"`
	XIDCounts map[uint64]uint64 `json:"xid_counts,omitempty"`
	// DoubleBitECCEvents counts NVML's double-bit ECC events.
	DoubleBitECCEvents uint64 `json:"double_bit_ecc_events,omitempty"`
	// Unsupported names what this device does not report (said once in
	// the log when first seen).
	Unsupported []string `json:"unsupported,omitempty"`
}

// ECCCounts are uncorrected ECC error counts.
type ECCCounts struct {
	VolatileUncorrected  uint64 `json:"volatile_uncorrected"`
	AggregateUncorrected uint64 `json:"aggregate_uncorrected"`
}

// RemappedRows is what the row remapper reports.
type RemappedRows struct {
	Correctable   int  `json:"correctable"`
	Uncorrectable int  `json:"uncorrectable"`
	Pending       bool `json:"pending"`
	Failure       bool `json:"failure"`
}

// XIDEvent is one XID NVML delivered.
type XIDEvent struct {
	Device int       `json:"device"`
	UUID   string    `json:"uuid"`
	XID    uint64    `json:"xid"`
	At     time.Time `json:"at"`
}

const (
	maxXIDsKept = 32
	// eventPoll is the waiter's pause between two NVML waits. Each NVML
	// wait is given no time of its own (an event already queued in the set
	// is returned at once, none is lost while the waiter pauses): the pause
	// is a Go timer, so the waiter blocks in Go, where Close stops it at
	// once and fake time (testing/synctest) sees it blocked, never inside a
	// C call that neither can interrupt.
	eventPoll = 200 * time.Millisecond
	// eventRetry: after a failed wait (not a timeout), the next one waits this long.
	eventRetry = time.Second
)

// hwState is the monitor's hardware-health state; guarded by Monitor.mu.
type hwState struct {
	devs   []DeviceHealth // by watched device
	said   map[string]bool
	stop   chan struct{} // closed to stop the waiter
	done   chan struct{} // closed when the waiter returned
	waiter eventWaiter
}

// openHealth registers for events on the chosen devices and starts the
// waiter (callMu held, from open).
func (m *Monitor) openHealth(chosen []deviceInfo) {
	hs, ok := m.src.(healthSource)
	m.mu.Lock()
	devs := make([]DeviceHealth, len(chosen))
	for i, d := range chosen {
		devs[i] = DeviceHealth{Index: d.Index, UUID: d.UUID, XIDCounts: map[uint64]uint64{}}
		if m.hw != nil { // reopened: keep the counts and events seen before
			for _, old := range m.hw.devs {
				if old.UUID == d.UUID {
					devs[i].XIDs, devs[i].XIDCounts, devs[i].DoubleBitECCEvents = old.XIDs, old.XIDCounts, old.DoubleBitECCEvents
				}
			}
		}
	}
	said := map[string]bool{}
	if m.hw != nil {
		said = m.hw.said
	}
	m.hw = &hwState{devs: devs, said: said}
	m.mu.Unlock()
	if !ok {
		return
	}
	idx := make([]int, len(chosen))
	for i, d := range chosen {
		idx[i] = d.Index
	}
	w, notes, err := hs.events(idx)
	m.sayUnsupported(notes)
	if err != nil {
		m.sayOnce("events", "GPU hardware events (XID) cannot be watched: faults are found from the ECC and row-remap counters and vLLM's log only", zap.Error(err))
		return
	}
	if w == nil {
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	m.mu.Lock()
	m.hw.stop, m.hw.done, m.hw.waiter = stop, done, w
	m.mu.Unlock()
	go m.waitEvents(w, stop, done)
}

// closeHealth stops the waiter and frees its set (callMu held, before the
// source is closed).
func (m *Monitor) closeHealth() {
	m.mu.Lock()
	hw := m.hw
	var stop, done chan struct{}
	var w eventWaiter
	if hw != nil {
		stop, done, w = hw.stop, hw.done, hw.waiter
		hw.stop, hw.done, hw.waiter = nil, nil, nil
	}
	m.mu.Unlock()
	if stop == nil {
		return
	}
	close(stop)
	<-done
	w.free()
}

// waitEvents is the waiter goroutine: it takes every queued event, then
// waits eventPoll, in a loop, until stopped. It never holds callMu: NVML's
// event wait is thread-safe and the sampler must not wait behind it.
func (m *Monitor) waitEvents(w eventWaiter, stop, done chan struct{}) {
	defer close(done)
	failing := false
	pause := time.NewTimer(eventPoll)
	defer pause.Stop()
	for {
		ev, ok, err := w.wait(0)
		if ok && err == nil {
			failing = false
			m.recordEvent(ev, time.Now())
			continue // more may be queued
		}
		if err != nil {
			if !failing {
				failing = true
				m.log.Warn("waiting for GPU hardware events failed; retrying", zap.Error(err))
			}
		} else {
			failing = false
		}
		d := eventPoll
		if failing {
			d = eventRetry
		}
		pause.Reset(d)
		select {
		case <-stop:
			return
		case <-pause.C:
		}
	}
}

// recordEvent files one event under its device.
func (m *Monitor) recordEvent(ev hwEvent, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hw == nil {
		return
	}
	for i := range m.hw.devs {
		d := &m.hw.devs[i]
		if d.Index != ev.index {
			continue
		}
		switch ev.kind {
		case "xid":
			d.XIDs = append(d.XIDs, XIDEvent{Device: d.Index, UUID: d.UUID, XID: ev.xid, At: at})
			if len(d.XIDs) > maxXIDsKept {
				d.XIDs = slices.Delete(d.XIDs, 0, len(d.XIDs)-maxXIDsKept)
			}
			d.XIDCounts[ev.xid]++
			m.log.Error("GPU reported an XID error", zap.Int("gpu", d.Index), zap.String("uuid", d.UUID), zap.Uint64("xid", ev.xid))
		case "dbe":
			d.DoubleBitECCEvents++
			m.log.Error("GPU reported a double-bit (uncorrectable) ECC error", zap.Int("gpu", d.Index), zap.String("uuid", d.UUID))
		}
		for ch := range m.healthSubs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		return
	}
}

// sampleHealth reads every watched device's counters, once per sample;
// lost is the NVML index the memory query found lost (-1: none).
func (m *Monitor) sampleHealth(lost int) {
	hs, ok := m.src.(healthSource)
	if !ok {
		return
	}
	m.callMu.Lock()
	if !m.opened {
		m.callMu.Unlock()
		return
	}
	m.mu.Lock()
	devs := slices.Clone(m.devs)
	m.mu.Unlock()
	got := make([]devHealth, len(devs))
	for i, d := range devs {
		got[i] = hs.health(d.Index)
		got[i].lost = got[i].lost || d.Index == lost
	}
	m.callMu.Unlock()
	var notes []unsupportedNote
	for _, h := range got {
		notes = append(notes, h.unsupported...)
	}
	m.sayUnsupported(notes)
	m.applyHealth(devs, got)
}

// applyHealth stores readings of devs (in the monitor's order).
func (m *Monitor) applyHealth(devs []deviceInfo, got []devHealth) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hw == nil || !slices.Equal(devs, m.devs) || len(m.hw.devs) != len(got) {
		return
	}
	for i, h := range got {
		d := &m.hw.devs[i]
		if h.lost && !d.Lost {
			m.log.Error("GPU is lost (fallen off the bus): it needs a reset or the node a reboot", zap.Int("gpu", d.Index), zap.String("uuid", d.UUID))
		}
		if !h.lost && d.Lost {
			m.log.Info("GPU answers again (reset)", zap.Int("gpu", d.Index), zap.String("uuid", d.UUID))
		}
		// The latest reading: a GPU that was reset answers again (the XIDs
		// it reported stay in its record).
		d.Lost, d.ResetRequired = h.lost, h.reset != ""
		if h.lost || h.reset != "" {
			continue // the other counters could not be read
		}
		d.ECC, d.Remap, d.RetiredPagesPending = nil, nil, nil
		if h.eccKnown {
			d.ECC = &ECCCounts{VolatileUncorrected: h.eccVolatileUncorr, AggregateUncorrected: h.eccAggregateUncorr}
		}
		if h.remapKnown {
			d.Remap = &RemappedRows{Correctable: h.remapCorr, Uncorrectable: h.remapUnc, Pending: h.remapPending, Failure: h.remapKO}
		}
		if h.retiredKnown {
			p := h.retiredPending
			d.RetiredPagesPending = &p
		}
		if h.throttleKnown && len(h.throttle) > 0 && !slices.Equal(h.throttle, d.Throttle) {
			m.log.Warn("GPU clocks held down by the hardware", zap.Int("gpu", d.Index), zap.Strings("reasons", h.throttle))
		}
		d.ThrottleKnown, d.Throttle = h.throttleKnown, slices.Clone(h.throttle)
		for _, n := range h.unsupported {
			if !slices.Contains(d.Unsupported, n.feature) {
				d.Unsupported = append(d.Unsupported, n.feature)
			}
		}
	}
}

// sayUnsupported logs each device's missing feature once, ever.
func (m *Monitor) sayUnsupported(notes []unsupportedNote) {
	for _, n := range notes {
		m.sayOnce(fmt.Sprintf("%d/%s", n.index, n.feature),
			fmt.Sprintf("GPU %d does not report %s; that evidence of hardware faults is off for it", n.index, n.feature),
			zap.String("nvml", n.why))
	}
}

func (m *Monitor) sayOnce(key, msg string, fields ...zap.Field) {
	m.mu.Lock()
	if m.hw == nil {
		m.hw = &hwState{said: map[string]bool{}}
	}
	if m.hw.said == nil {
		m.hw.said = map[string]bool{}
	}
	said := m.hw.said[key]
	m.hw.said[key] = true
	m.mu.Unlock()
	if !said {
		m.log.Info(msg, fields...)
	}
}

// HealthNow reads every watched device's counters now (not waiting for
// the next sample), then returns Health: the check before a start must not
// miss a state the sampler has not read yet.
func (m *Monitor) HealthNow() Health {
	m.sampleHealth(-1)
	return m.Health()
}

// Health returns the hardware health of every watched device.
func (m *Monitor) Health() Health {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := Health{Known: m.up || (m.hw != nil && len(m.hw.devs) > 0), Devices: []DeviceHealth{}}
	if m.hw == nil {
		if !m.up && m.lostAtOpen > 0 {
			// NVML could not list the GPUs because this one is lost: its
			// UUID is not known, the loss is.
			h.Known = true
			h.Devices = append(h.Devices, DeviceHealth{Index: m.lostAtOpen - 1, Lost: true})
		}
		return h
	}
	for _, d := range m.hw.devs {
		c := d
		c.XIDs = slices.Clone(d.XIDs)
		c.XIDCounts = make(map[uint64]uint64, len(d.XIDCounts))
		for k, v := range d.XIDCounts {
			c.XIDCounts[k] = v
		}
		c.Unsupported = slices.Clone(d.Unsupported)
		c.Throttle = slices.Clone(d.Throttle)
		if d.ECC != nil {
			e := *d.ECC
			c.ECC = &e
		}
		if d.Remap != nil {
			r := *d.Remap
			c.Remap = &r
		}
		if d.RetiredPagesPending != nil {
			p := *d.RetiredPagesPending
			c.RetiredPagesPending = &p
		}
		h.Devices = append(h.Devices, c)
	}
	return h
}

// HealthChanged returns a channel that receives (without blocking the
// monitor, coalesced) when a hardware event arrives, and a function that
// ends the subscription.
func (m *Monitor) HealthChanged() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	if m.healthSubs == nil {
		m.healthSubs = map[chan struct{}]struct{}{}
	}
	m.healthSubs[ch] = struct{}{}
	m.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			m.mu.Lock()
			delete(m.healthSubs, ch)
			m.mu.Unlock()
		})
	}
}

// isLost reports whether err says a GPU is lost, and which.
func isLost(err error) (int, bool) {
	if le, ok := errors.AsType[*lostError](err); ok {
		return le.index, true
	}
	return 0, false
}
