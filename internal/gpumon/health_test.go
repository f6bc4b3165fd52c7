//go:build cgo

package gpumon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// appendEvent appends one line to the stand-in's events file, as a driver
// would deliver an event.
func (f *fake) appendEvent(line string) {
	f.t.Helper()
	fh, err := os.OpenFile(filepath.Join(f.dir, "events"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		f.t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteString(line + "\n"); err != nil {
		f.t.Fatal(err)
	}
}

// TestFakeNVMLHealthContract: the stand-in's health queries and events,
// through go-nvml.
func TestFakeNVMLHealthContract(t *testing.T) {
	f := newFake(t, twoGPUs)
	f.write("health", "0 ecc_volatile_uncorrected 2\n0 ecc_aggregate_uncorrected 7\n0 remap_corr 1\n0 remap_unc 3\n0 remap_pending 1\n0 retired_pending 1\n1 unsupported ecc\n1 unsupported remap\n")
	lib := f.nvml()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	d0, _ := lib.DeviceGetHandleByIndex(0)
	d1, _ := lib.DeviceGetHandleByIndex(1)
	if n, ret := d0.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret != nvml.SUCCESS || n != 2 {
		t.Fatalf("volatile uncorrected = %d, %v", n, ret)
	}
	if n, ret := d0.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC); ret != nvml.SUCCESS || n != 7 {
		t.Fatalf("aggregate uncorrected = %d, %v", n, ret)
	}
	if c, u, p, fl, ret := d0.GetRemappedRows(); ret != nvml.SUCCESS || c != 1 || u != 3 || !p || fl {
		t.Fatalf("remapped rows = %d %d %v %v, %v", c, u, p, fl, ret)
	}
	if st, ret := d0.GetRetiredPagesPendingStatus(); ret != nvml.SUCCESS || st != nvml.FEATURE_ENABLED {
		t.Fatalf("retired pages pending = %v, %v", st, ret)
	}
	if _, ret := d1.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("GPU 1 ECC: %v, want not supported", ret)
	}
	if _, _, _, _, ret := d1.GetRemappedRows(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("GPU 1 remap: %v, want not supported", ret)
	}
	if types, ret := d1.GetSupportedEventTypes(); ret != nvml.SUCCESS || types != uint64(nvml.EventTypeXidCriticalError) {
		t.Fatalf("GPU 1 event types = %#x, %v (no ECC: XID only)", types, ret)
	}

	// An event from before the set exists is not delivered; one after is,
	// once, and only to a device that registered its type.
	f.appendEvent("0 xid 13")
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatalf("EventSetCreate: %v", ret)
	}
	defer set.Free()
	if ret := d0.RegisterEvents(uint64(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError), set); ret != nvml.SUCCESS {
		t.Fatalf("RegisterEvents: %v", ret)
	}
	if _, ret := set.Wait(1); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("wait with nothing new: %v, want timeout", ret)
	}
	f.appendEvent("1 xid 31") // GPU 1 registered nothing
	f.appendEvent("0 xid 79")
	f.appendEvent("0 dbe")
	data, ret := set.Wait(10000)
	if ret != nvml.SUCCESS || data.EventType != uint64(nvml.EventTypeXidCriticalError) || data.EventData != 79 {
		t.Fatalf("first event = %+v, %v; want XID 79 on GPU 0", data, ret)
	}
	if i, _ := data.Device.GetIndex(); i != 0 {
		t.Fatalf("event device index %d, want 0", i)
	}
	data, ret = set.Wait(10000)
	if ret != nvml.SUCCESS || data.EventType != uint64(nvml.EventTypeDoubleBitEccError) {
		t.Fatalf("second event = %+v, %v; want a double-bit ECC error", data, ret)
	}
	if _, ret := set.Wait(1); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("a third wait: %v, want timeout (each event once)", ret)
	}

	// A lost GPU answers "GPU is lost" to every query.
	f.write("health", "0 lost 1\n")
	if _, ret := d0.GetMemoryInfo(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("memory on a lost GPU: %v", ret)
	}
	if _, _, _, _, ret := d0.GetRemappedRows(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("remap on a lost GPU: %v", ret)
	}
	if _, ret := d1.GetMemoryInfo(); ret != nvml.SUCCESS {
		t.Fatalf("GPU 1 is not lost: %v", ret)
	}
}

// TestHealthSnapshot: the counters are read with the memory sample, and a
// device's unsupported features are said once, not on every sample.
func TestHealthSnapshot(t *testing.T) {
	f := newFake(t, twoGPUs)
	f.write("health", "0 ecc_volatile_uncorrected 2\n0 ecc_aggregate_uncorrected 7\n0 remap_unc 3\n0 remap_pending 1\n1 unsupported ecc\n1 unsupported remap\n1 unsupported retired\n")
	core, logs := observer.New(zap.DebugLevel)
	m := New(f.nvml(), Options{}, zap.New(core))
	mustOpen(t, m)
	for range 3 {
		m.tick()
	}
	h := m.Health()
	if !h.Known || len(h.Devices) != 2 {
		t.Fatalf("health: %+v", h)
	}
	g0, g1 := h.Devices[0], h.Devices[1]
	if g0.ECC == nil || g0.ECC.VolatileUncorrected != 2 || g0.ECC.AggregateUncorrected != 7 {
		t.Fatalf("GPU 0 ECC: %+v", g0.ECC)
	}
	if g0.Remap == nil || !g0.Remap.Pending || g0.Remap.Uncorrectable != 3 || g0.Remap.Failure {
		t.Fatalf("GPU 0 remap: %+v", g0.Remap)
	}
	if g0.RetiredPagesPending == nil || *g0.RetiredPagesPending || g0.Lost {
		t.Fatalf("GPU 0: %+v", g0)
	}
	if g1.ECC != nil || g1.Remap != nil || g1.RetiredPagesPending != nil || len(g1.Unsupported) != 3 {
		t.Fatalf("GPU 1 reports nothing: %+v", g1)
	}
	said := map[string]int{}
	for _, e := range logs.FilterMessageSnippet("does not report").All() {
		said[e.Message]++
	}
	if len(said) != 3 {
		t.Fatalf("unsupported features said: %v, want ECC, remap and retired pages of GPU 1", said)
	}
	for msg, n := range said {
		if n != 1 {
			t.Errorf("%q said %d times over 3 samples, want once", msg, n)
		}
	}

	// The GPU falls off the bus: the memory query fails and says so.
	f.write("health", "0 lost 1\n")
	m.tick()
	if s := m.Snapshot(); s.Up {
		t.Fatalf("snapshot up with GPU 0 lost")
	}
	if h := m.Health(); !h.Devices[0].Lost || h.Devices[1].Lost {
		t.Fatalf("lost: GPU 0 %v, GPU 1 %v; want GPU 0 only", h.Devices[0].Lost, h.Devices[1].Lost)
	}
	if n := logs.FilterMessageSnippet("GPU is lost").Len(); n != 1 {
		t.Fatalf("\"GPU is lost\" logged %d times, want once", n)
	}
}

// TestXIDWaiter: an XID is delivered to the snapshot by the waiter
// goroutine while sampling goes on, and Close stops the waiter (goleak in
// TestMain checks none is left).
func TestXIDWaiter(t *testing.T) {
	f := newFake(t, twoGPUs)
	m := New(f.nvml(), Options{}, nil)
	changed, unsub := m.HealthChanged()
	defer unsub()
	mustOpen(t, m)
	f.appendEvent("1 xid 94")
	f.appendEvent("0 xid 79")
	seen := map[int]uint64{}
	deadline := time.After(30 * time.Second)
	for len(seen) < 2 {
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("XIDs seen %v after 30 s, want GPU 0: 79 and GPU 1: 94", seen)
		}
		m.tick() // sampling is never held up by the waiter
		for _, d := range m.Health().Devices {
			for _, x := range d.XIDs {
				seen[d.Index] = x.XID
				if x.Device != d.Index || x.UUID != d.UUID || x.At.IsZero() {
					t.Fatalf("event %+v on %d %s", x, d.Index, d.UUID)
				}
			}
		}
	}
	if seen[0] != 79 || seen[1] != 94 {
		t.Fatalf("XIDs %v", seen)
	}
	if c := m.Health().Devices[0].XIDCounts[79]; c != 1 {
		t.Fatalf("XID 79 counted %d times", c)
	}
	m.Close()
	if m.Snapshot().Up {
		t.Fatal("closed monitor still up")
	}
}

// TestOnceReadsHealth: `vllm-guard gpus` (Once) reads the counters with
// its one sample and prints them.
func TestOnceReadsHealth(t *testing.T) {
	f := newFake(t, twoGPUs)
	f.write("health", "0 ecc_volatile_uncorrected 1\n0 ecc_aggregate_uncorrected 4\n0 remap_corr 2\n0 throttle 72\n1 unsupported remap\n1 unsupported throttle\n")
	m := New(f.nvml(), Options{}, nil)
	if s := m.Once(); !s.Up {
		t.Fatalf("Once: %s", s.Reason)
	}
	var b strings.Builder
	WriteHealth(&b, m.Health())
	out := b.String()
	for _, want := range []string{"GPU 0 health: uncorrected ECC volatile 1 aggregate 4; remapped rows correctable 2 uncorrectable 0 pending no failure no",
		"hardware clock slowdown hw_slowdown, hw_thermal", "GPU 1 health:", "not reported: remapped rows, clock throttle reasons"} {
		if !strings.Contains(out, want) {
			t.Errorf("health table lacks %q:\n%s", want, out)
		}
	}
}

// FuzzFakeNVMLHealth: any health and events file gives answers within
// NVML's contract (no crash, no hang, a known return code) on every query
// of the stand-in's health half.
func FuzzFakeNVMLHealth(f *testing.F) {
	f.Add("0 ecc_volatile_uncorrected 2\n0 remap_pending 1\n1 unsupported ecc\n", "0 xid 79\n1 dbe\n")
	f.Add("0 lost 1\n", "0 xid\n")
	f.Add("", "")
	f.Add("x y z\n0 remap_unc -1\n0 ecc_volatile_uncorrected 99999999999999999999999\n", "-1 xid 3\n64 xid 1\n0 sbe 7\n0 xid 18446744073709551615")
	f.Add("0 unsupported events\n0 unsupported retired\n0 unsupported remap\n", strings.Repeat("0 xid 13\n", 600))
	fk := newFake(f, twoGPUs)
	f.Fuzz(func(t *testing.T, health, evs string) {
		fk.t = t
		fk.write("health", health)
		os.Remove(filepath.Join(fk.dir, "events"))
		lib := fk.nvml()
		if ret := lib.Init(); ret != nvml.SUCCESS {
			t.Fatalf("Init: %v", ret)
		}
		defer lib.Shutdown()
		set, ret := lib.EventSetCreate()
		if ret != nvml.SUCCESS {
			t.Fatalf("EventSetCreate: %v", ret)
		}
		defer set.Free()
		ok := func(what string, ret nvml.Return) {
			switch ret {
			case nvml.SUCCESS, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_GPU_IS_LOST, nvml.ERROR_TIMEOUT:
			default:
				t.Fatalf("%s: %v", what, ret)
			}
		}
		for i := range 2 {
			d, ret := lib.DeviceGetHandleByIndex(i)
			if ret != nvml.SUCCESS {
				t.Fatalf("handle %d: %v", i, ret)
			}
			_, r := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
			ok("ecc", r)
			_, _, _, _, r = d.GetRemappedRows()
			ok("remap", r)
			_, r = d.GetRetiredPagesPendingStatus()
			ok("retired", r)
			types, r := d.GetSupportedEventTypes()
			ok("event types", r)
			if r == nvml.SUCCESS && types != 0 {
				ok("register", d.RegisterEvents(types, set))
			}
		}
		fk.appendEvent(evs)
		for range 700 {
			data, r := set.Wait(0)
			ok("wait", r)
			if r != nvml.SUCCESS {
				break
			}
			if data.EventType == uint64(nvml.EventTypeXidCriticalError) {
				if i, r := data.Device.GetIndex(); (r == nvml.SUCCESS && i > 1) || (r != nvml.SUCCESS && r != nvml.ERROR_GPU_IS_LOST) {
					t.Fatalf("event on device %d, %v", i, r)
				}
			}
		}
	})
}

// TestFakeNVMLLongEventLine: a line longer than the stand-in's read buffer
// is skipped; the events after it still arrive.
func TestFakeNVMLLongEventLine(t *testing.T) {
	f := newFake(t, twoGPUs)
	lib := f.nvml()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()
	set, _ := lib.EventSetCreate()
	defer set.Free()
	d0, _ := lib.DeviceGetHandleByIndex(0)
	if ret := d0.RegisterEvents(uint64(nvml.EventTypeXidCriticalError), set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	f.appendEvent("0 xid 1" + strings.Repeat("9", 10000))
	f.appendEvent("0 xid 79")
	for range 10 {
		data, ret := set.Wait(0)
		if ret == nvml.SUCCESS && data.EventData == 79 {
			return
		}
	}
	t.Fatal("the XID after a long line never arrived")
}

// TestLostGPUComesBackAfterAReset: lost is the latest reading, so a GPU
// that was reset can be started on again; a memory query that says the GPU
// is lost counts as lost.
func TestLostGPUComesBackAfterAReset(t *testing.T) {
	f := newFake(t, twoGPUs)
	m := New(f.nvml(), Options{}, nil)
	mustOpen(t, m)
	f.write("health", "1 lost 1\n")
	m.tick()
	if h := m.Health(); !h.Devices[1].Lost {
		t.Fatal("GPU 1 not lost")
	}
	f.write("health", "")
	m.tick()
	if h := m.Health(); h.Devices[1].Lost {
		t.Fatal("GPU 1 still lost after the reset")
	}
	f.write("fault", "15\n") // the memory query answers NVML_ERROR_GPU_IS_LOST
	m.tick()
	if h := m.Health(); !h.Devices[0].Lost {
		t.Fatal("a memory query's \"GPU is lost\" not counted")
	}
}

// TestHealthNowReadsBeforeTheFirstSample: the check before a start sees a
// pending remap even before the sampler ran once.
func TestHealthNowReadsBeforeTheFirstSample(t *testing.T) {
	f := newFake(t, twoGPUs)
	f.write("health", "0 remap_pending 1\n")
	m := New(f.nvml(), Options{}, nil)
	mustOpen(t, m)
	if r := m.Health().Devices[0].Remap; r != nil {
		t.Fatalf("counters before any read: %+v", r)
	}
	if r := m.HealthNow().Devices[0].Remap; r == nil || !r.Pending {
		t.Fatalf("HealthNow: remap %+v, want pending", r)
	}
}
