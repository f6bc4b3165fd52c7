//go:build cgo

package gpumon

import (
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The hardware-health half of nvmlSource: counters read with each sample,
// and the event set the waiter goroutine waits on.

// eventTypes are the events registered: critical XIDs and uncorrectable
// (double-bit) ECC errors, where the device supports them.
const eventTypes = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)

// notSupported: the driver or the device lacks the feature (not an error
// to retry).
func notSupported(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND
}

func (s *nvmlSource) health(i int) devHealth {
	var h devHealth
	if i < 0 || i >= len(s.handles) {
		h.lost = true
		return h
	}
	d := s.handles[i]
	// fatal marks a query that says the GPU is gone or must be reset; it
	// reports whether the others are worth asking.
	fatal := func(ret nvml.Return) bool {
		switch ret {
		case nvml.ERROR_GPU_IS_LOST:
			h.lost = true
			return true
		case nvml.ERROR_RESET_REQUIRED:
			h.reset = ret.Error()
			return true
		}
		return false
	}
	unsup := func(feature string, ret nvml.Return) {
		h.unsupported = append(h.unsupported, unsupportedNote{index: i, feature: feature, why: ret.Error()})
	}

	vol, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	if fatal(ret) {
		return h
	}
	switch {
	case ret == nvml.SUCCESS:
		agg, ret2 := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC)
		if fatal(ret2) {
			return h
		}
		h.eccKnown, h.eccVolatileUncorr = true, vol
		if ret2 == nvml.SUCCESS {
			h.eccAggregateUncorr = agg
		}
	case notSupported(ret):
		unsup("ECC error counts", ret)
	}

	corr, unc, pending, failed, ret := d.GetRemappedRows()
	if fatal(ret) {
		return h
	}
	switch {
	case ret == nvml.SUCCESS:
		h.remapKnown, h.remapCorr, h.remapUnc, h.remapPending, h.remapKO = true, corr, unc, pending, failed
	case notSupported(ret):
		unsup("remapped rows", ret)
	}

	st, ret := d.GetRetiredPagesPendingStatus()
	if fatal(ret) {
		return h
	}
	switch {
	case ret == nvml.SUCCESS:
		h.retiredKnown, h.retiredPending = true, st == nvml.FEATURE_ENABLED
	case notSupported(ret):
		unsup("retired pages", ret)
	}

	// The clock event reasons that mean hardware (nvmlDeviceGetCurrentClocks
	// EventReasons since driver 535; the older ThrottleReasons name before).
	// Checked before calling: a missing symbol ends the process.
	if s.throttleFn == 0 {
		s.throttleFn = 2
		if ext := s.lib.Extensions(); ext != nil && ext.LookupSymbol("nvmlDeviceGetCurrentClocksEventReasons") == nil {
			s.throttleFn = 1
		}
	}
	var mask uint64
	if s.throttleFn == 1 {
		mask, ret = d.GetCurrentClocksEventReasons()
	} else {
		mask, ret = d.GetCurrentClocksThrottleReasons()
	}
	if fatal(ret) {
		return h
	}
	switch {
	case ret == nvml.SUCCESS:
		h.throttleKnown = true
		for _, r := range hwThrottleReasons {
			if mask&r.bit != 0 {
				h.throttle = append(h.throttle, r.name)
			}
		}
	case notSupported(ret):
		unsup("clock throttle reasons", ret)
	}
	return h
}

// hwThrottleReasons are the clock event reasons that mean hardware: the
// GPU slowed itself for heat, power or an external signal.
var hwThrottleReasons = []struct {
	bit  uint64
	name string
}{
	{nvml.ClocksThrottleReasonHwSlowdown, "hw_slowdown"},
	{nvml.ClocksThrottleReasonHwThermalSlowdown, "hw_thermal"},
	{nvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hw_power_brake"},
	{nvml.ClocksThrottleReasonSwThermalSlowdown, "sw_thermal"},
}

// nvmlEvents waits on one NVML event set.
type nvmlEvents struct {
	set   nvml.EventSet
	index map[nvml.Device]int // handle → NVML index
}

func (s *nvmlSource) events(indices []int) (eventWaiter, []unsupportedNote, error) {
	set, ret := s.lib.EventSetCreate()
	if notSupported(ret) {
		return nil, []unsupportedNote{{index: -1, feature: "events", why: ret.Error()}}, nil
	}
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("NVML could not create an event set: %w", ret)
	}
	w := &nvmlEvents{set: set, index: map[nvml.Device]int{}}
	var notes []unsupportedNote
	for _, i := range indices {
		if i < 0 || i >= len(s.handles) {
			continue
		}
		d := s.handles[i]
		types, ret := d.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			notes = append(notes, unsupportedNote{index: i, feature: "XID events", why: ret.Error()})
			continue
		}
		want := types & eventTypes
		if want&uint64(nvml.EventTypeXidCriticalError) == 0 {
			notes = append(notes, unsupportedNote{index: i, feature: "XID events", why: "not among the device's supported event types"})
		}
		if want == 0 {
			continue
		}
		if ret := d.RegisterEvents(want, set); ret != nvml.SUCCESS {
			notes = append(notes, unsupportedNote{index: i, feature: "XID events", why: ret.Error()})
			continue
		}
		w.index[d] = i
	}
	if len(w.index) == 0 {
		set.Free()
		return nil, notes, nil
	}
	return w, notes, nil
}

func (w *nvmlEvents) wait(timeout time.Duration) (hwEvent, bool, error) {
	data, ret := w.set.Wait(uint32(timeout.Milliseconds()))
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_TIMEOUT:
		return hwEvent{}, false, nil
	default:
		return hwEvent{}, false, fmt.Errorf("NVML event wait: %w", ret)
	}
	i, ok := w.index[data.Device]
	if !ok {
		i = -1
	}
	ev := hwEvent{index: i}
	switch {
	case data.EventType&uint64(nvml.EventTypeXidCriticalError) != 0:
		ev.kind, ev.xid = "xid", data.EventData
	case data.EventType&uint64(nvml.EventTypeDoubleBitEccError) != 0:
		ev.kind = "dbe"
	default:
		return hwEvent{}, false, nil
	}
	return ev, true, nil
}

func (w *nvmlEvents) free() { w.set.Free() }
