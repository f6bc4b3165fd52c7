package gpumon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// scripted is a source for unit tests of the monitor's own logic (the
// go-nvml path is tested against the stand-in library in nvml_test.go).
type scripted struct {
	mu        sync.Mutex
	openErrs  []error // returned by successive open calls, then success
	opens     int
	used      []uint64 // next reading of each device
	total     uint64
	readErr   error
	closeCall int
}

func (s *scripted) open() (string, []deviceInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opens++
	if len(s.openErrs) > 0 {
		err := s.openErrs[0]
		s.openErrs = s.openErrs[1:]
		return "", nil, err
	}
	devs := make([]deviceInfo, len(s.used))
	for i := range devs {
		devs[i] = deviceInfo{Index: i, UUID: "GPU-" + string(rune('a'+i)), Name: "Test GPU"}
	}
	return "999.1", devs, nil
}

func (s *scripted) read(idx []int) ([]reading, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readErr != nil {
		return nil, s.readErr
	}
	out := make([]reading, len(idx))
	for k, i := range idx {
		out[k] = reading{used: s.used[i], total: s.total, free: s.total - s.used[i]}
	}
	return out, nil
}

func (s *scripted) close() {
	s.mu.Lock()
	s.closeCall++
	s.mu.Unlock()
}

func (s *scripted) set(i int, f float64) {
	s.mu.Lock()
	s.used[i] = uint64(f * float64(s.total))
	s.mu.Unlock()
}

func observed() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.DebugLevel)
	return zap.New(core), logs
}

func TestRunRetriesInitAndLogsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &scripted{
			openErrs: []error{errors.New("driver busy"), errors.New("driver busy"), errors.New("driver busy")},
			used:     []uint64{10 << 30}, total: 80 << 30,
		}
		log, logs := observed()
		m := newMonitor(src, Options{SampleInterval: time.Second}, log)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { m.Run(ctx); close(done) }()

		synctest.Wait()
		if s := m.Snapshot(); s.Up || s.Reason != "GPU metrics unavailable: driver busy" {
			t.Fatalf("after the first failed init: up=%v reason=%q", s.Up, s.Reason)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		s := m.Snapshot()
		if !s.Up || s.Driver != "999.1" || len(s.Devices) != 1 || s.Devices[0].Used != 10<<30 {
			t.Fatalf("after init succeeded: %+v", s)
		}
		if src.opens != 4 {
			t.Fatalf("open called %d times, want 4 (3 failures, 1 success)", src.opens)
		}
		if n := logs.FilterMessage("GPU metrics unavailable").Len(); n != 1 {
			t.Fatalf("logged 'GPU metrics unavailable' %d times across one outage, want 1", n)
		}
		if n := logs.FilterMessage("GPU metrics available").Len(); n != 1 {
			t.Fatalf("logged 'GPU metrics available' %d times, want 1", n)
		}
		cancel()
		<-done
		if src.closeCall != 1 {
			t.Fatalf("NVML shut down %d times at the end of Run, want 1", src.closeCall)
		}
	})
}

func TestRunSamplesAtInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &scripted{used: []uint64{10 << 30, 20 << 30}, total: 80 << 30}
		m := newMonitor(src, Options{SampleInterval: 2 * time.Second}, nil)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { m.Run(ctx); close(done) }()
		time.Sleep(9 * time.Second) // samples at 0, 2, 4, 6, 8
		synctest.Wait()
		got := m.RecentFractions(100)
		if len(got) != 5 {
			t.Fatalf("%d samples in 9 s at a 2 s interval, want 5", len(got))
		}
		if got[0] != 0.25 {
			t.Fatalf("RecentFractions = %v, want the max over devices (0.25)", got)
		}
		if h := m.Snapshot().Devices[0].History; len(h) != 5 || h[0] != 0.125 {
			t.Fatalf("history %v", h)
		}
		if got := m.RecentFractions(2); len(got) != 2 {
			t.Fatalf("RecentFractions(2) returned %d", len(got))
		}
		cancel()
		<-done
	})
}

func TestQueryErrorsCountedOncePerEpisode(t *testing.T) {
	src := &scripted{used: []uint64{10 << 30}, total: 80 << 30}
	log, logs := observed()
	m := newMonitor(src, Options{}, log)
	if err := m.open(); err != nil {
		t.Fatal(err)
	}
	m.tick()
	src.readErr = errors.New("GPU is lost")
	m.tick()
	m.tick()
	s := m.Snapshot()
	if s.Up || s.Errors != 2 || !strings.Contains(s.Reason, "GPU is lost") {
		t.Fatalf("during the fault: up=%v errors=%d reason=%q", s.Up, s.Errors, s.Reason)
	}
	if s.Devices[0].Used != 10<<30 {
		t.Fatalf("the last good reading is kept during a fault, got %d", s.Devices[0].Used)
	}
	src.readErr = nil
	m.tick()
	if s := m.Snapshot(); !s.Up || s.Errors != 2 {
		t.Fatalf("after recovery: up=%v errors=%d", s.Up, s.Errors)
	}
	if n := logs.FilterMessage("NVML query failed; GPU readings paused until it recovers").Len(); n != 1 {
		t.Fatalf("fault logged %d times, want once per episode", n)
	}
	if n := logs.FilterMessage("NVML queries recovered").Len(); n != 1 {
		t.Fatalf("recovery logged %d times", n)
	}
}

func TestSubscribeDropsWhenSlow(t *testing.T) {
	src := &scripted{used: []uint64{0}, total: 80 << 30}
	m := newMonitor(src, Options{}, nil)
	if err := m.open(); err != nil {
		t.Fatal(err)
	}
	slow, cancelSlow := m.Subscribe()
	defer cancelSlow()
	fast, cancelFast := m.Subscribe()
	var got []Alert
	for i := range 100 { // 100 events: warn raised and cleared 50 times each
		if i%2 == 0 {
			src.set(0, 0.95)
		} else {
			src.set(0, 0.50)
		}
		m.tick()
		for len(fast) > 0 {
			got = append(got, <-fast)
		}
	}
	cancelFast()
	if _, open := <-fast; open {
		t.Fatal("cancelled subscription's channel still open")
	}
	cancelFast() // idempotent
	if len(got) != 100 {
		t.Fatalf("fast subscriber got %d events, want 100", len(got))
	}
	if got[0].Name != AlertWarn || !got[0].Active || got[1].Active {
		t.Fatalf("events %+v", got[:2])
	}
	if len(slow) != subscriberBuffer {
		t.Fatalf("slow subscriber holds %d events, want a full buffer (%d)", len(slow), subscriberBuffer)
	}
	if d := m.Snapshot().DroppedAlerts; d != 100-subscriberBuffer {
		t.Fatalf("dropped %d events, want %d", d, 100-subscriberBuffer)
	}
}

// Sampled's channel is closed by the next stored reading and by nothing
// else: not a failed query, not a monitor without NVML.
func TestSampledClosesOnEachStoredReading(t *testing.T) {
	src := &scripted{used: []uint64{10 << 30}, total: 80 << 30}
	m := newMonitor(src, Options{}, nil)
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	ch := m.Sampled()
	if m.Sampled() != ch {
		t.Fatal("two calls before a reading gave two channels; the readers would not wake together")
	}
	m.tick() // NVML not opened: nothing stored
	if closed(ch) {
		t.Fatal("closed with nothing read")
	}
	if err := m.open(); err != nil {
		t.Fatal(err)
	}
	m.tick()
	if !closed(ch) {
		t.Fatal("not closed after a reading was stored")
	}
	first := m.Snapshot().Devices[0].ReadAt
	if first.IsZero() {
		t.Fatal("woken before the snapshot had the reading")
	}
	next := m.Sampled()
	if closed(next) {
		t.Fatal("the channel for the next reading is already closed")
	}
	src.readErr = errors.New("GPU is lost")
	m.tick()
	if closed(next) {
		t.Fatal("a failed query closed the channel: no reading was stored")
	}
	src.readErr = nil
	m.Once()
	if !closed(next) {
		t.Fatal("Once's reading did not close the channel")
	}

	d := Disabled("built without cgo", Options{}, nil)
	dch := d.Sampled()
	d.Once()
	if closed(dch) {
		t.Fatal("a monitor without NVML woke its readers")
	}
}

// Every reader waiting on Sampled wakes once for each reading Run stores,
// and sees that reading in the snapshot; a stretch of failed queries wakes
// nobody. The readers stop with their context and leave nothing behind
// (TestMain's goleak).
func TestSampledWakesEveryReaderOnEachReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &scripted{used: []uint64{10 << 30}, total: 80 << 30}
		m := newMonitor(src, Options{SampleInterval: time.Second}, nil)
		ctx, cancel := context.WithCancel(t.Context())
		var mu sync.Mutex
		seen := make([][]time.Time, 3) // each reader's ReadAt, one per wake
		var readers sync.WaitGroup
		for r := range seen {
			readers.Go(func() {
				for {
					ch := m.Sampled()
					select {
					case <-ctx.Done():
						return
					case <-ch:
					}
					at := m.Snapshot().Devices[0].ReadAt
					mu.Lock()
					seen[r] = append(seen[r], at)
					mu.Unlock()
				}
			})
		}
		synctest.Wait() // every reader waits
		done := make(chan struct{})
		go func() { m.Run(ctx); close(done) }()
		synctest.Wait()               // the first reading, at once
		time.Sleep(2*time.Second + 1) // two more
		synctest.Wait()
		src.mu.Lock()
		src.readErr = errors.New("GPU is lost")
		src.mu.Unlock()
		time.Sleep(3 * time.Second) // three failed queries
		synctest.Wait()
		src.mu.Lock()
		src.readErr = nil
		src.mu.Unlock()
		time.Sleep(time.Second) // one more reading
		synctest.Wait()
		cancel()
		<-done
		readers.Wait()
		for r, ats := range seen {
			if len(ats) != 4 {
				t.Fatalf("reader %d woke %d times for 4 readings: %v", r, len(ats), ats)
			}
			for i := 1; i < len(ats); i++ {
				if !ats[i].After(ats[i-1]) {
					t.Fatalf("reader %d saw the same reading twice: %v", r, ats)
				}
			}
		}
	})
}

func TestDisabled(t *testing.T) {
	m := Disabled("built without cgo", Options{}, nil)
	s := m.Once()
	if s.Up || s.Reason != "GPU metrics unavailable: built without cgo" {
		t.Fatalf("snapshot %+v", s)
	}
	fc := m.CheckFree(0.9, 0)
	if !fc.OK || fc.Known || !strings.Contains(fc.Message, "not checked") {
		t.Fatalf("CheckFree %+v", fc)
	}
	rel := m.CheckReleased([]int{1}, nil)
	if !rel.Released || rel.Method != "unavailable" {
		t.Fatalf("CheckReleased %+v", rel)
	}
	if h := m.Holders(); len(h) != 0 {
		t.Fatalf("holders %+v", h)
	}
	// Run returns when the context ends, without retrying a permanent failure.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	m.Run(ctx)
}

func TestWriteTable(t *testing.T) {
	s := Snapshot{Up: true, Driver: "550.54.15", Attribution: "pid", Devices: []Device{
		{Index: 0, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-aaaa", Used: 60 << 30, Total: 80 << 30, Fraction: 0.75,
			Trend: TrendClimbing, SecondsToCritical: 125,
			Processes: []Proc{{PID: 4242, Device: 0, Used: 59 << 30, Command: "python3 -m vllm.entrypoints.openai.api_server", Ours: true}}},
		{Index: 1, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-bbbb", Used: 1 << 30, Total: 80 << 30, Fraction: 1.0 / 80,
			Trend: TrendSteady, SecondsToCritical: -1,
			Processes: []Proc{{PID: 77, Device: 1, Used: 512 << 20}}},
	}}
	var b strings.Builder
	if err := WriteTable(&b, s); err != nil {
		t.Fatal(err)
	}
	want := `driver 550.54.15
GPU  NAME                   UUID      USED GiB  TOTAL GiB  USED %  TREND
0    NVIDIA H100 80GB HBM3  GPU-aaaa  60.0      80.0       75.0    climbing, critical in 2m5s
1    NVIDIA H100 80GB HBM3  GPU-bbbb  1.0       80.0       1.2     steady

GPU  PID   USED GiB  COMMAND
0    4242  59.0      python3 -m vllm.entrypoints.openai.api_server  [vllm-guard child]
1    77    0.5       (not visible here)
`
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	if err := WriteTable(&b, Snapshot{Reason: "GPU metrics unavailable: built without cgo"}); err != nil {
		t.Fatal(err)
	}
	if b.String() != "GPU metrics unavailable: built without cgo\n" {
		t.Fatalf("unavailable table: %q", b.String())
	}
}

// budgetThresholds is the guard's rule: budget + 3 %, budget + 5 %, capped.
func budgetThresholds(b float64) (float64, float64) { return min(b+0.03, 0.995), min(b+0.05, 0.995) }

// A healthy vLLM holds its budget for the whole run: at 0.9 and 0.95
// utilization (plus a little non-torch memory) nothing is raised; memory
// beyond the budget is.
func TestAlertsRelativeToBudget(t *testing.T) {
	for _, util := range []float64{0.90, 0.95} {
		src := &scripted{used: []uint64{0}, total: 80 << 30}
		m := newMonitor(src, Options{Thresholds: budgetThresholds}, nil)
		if err := m.open(); err != nil {
			t.Fatal(err)
		}
		events, stop := m.Subscribe()
		m.SetBudget(util)
		m.SetLoading(true)
		for _, f := range []float64{0.1, 0.3, util, util + 0.008} { // the load, then the budget and the CUDA context
			src.set(0, f)
			m.tick()
		}
		m.SetLoading(false)
		for range 60 {
			m.tick()
		}
		if d := m.Snapshot().Devices[0]; d.Budget < util || d.WarnAt <= d.Budget || d.CriticalAt <= d.WarnAt {
			t.Fatalf("util %g: budget %g warn %g critical %g", util, d.Budget, d.WarnAt, d.CriticalAt)
		}
		select {
		case a := <-events:
			t.Fatalf("util %g: healthy vLLM raised %+v", util, a)
		default:
		}
		src.set(0, util+0.04) // beyond the budget
		m.tick()
		if a := <-events; a.Name != AlertWarn || !a.Active {
			t.Fatalf("util %g: want the warning, got %+v", util, a)
		}
		stop()
	}
}

// With --kv-cache-memory-bytes the budget is what vLLM held once loaded.
func TestBudgetLearnedAtReady(t *testing.T) {
	src := &scripted{used: []uint64{0}, total: 80 << 30}
	m := newMonitor(src, Options{Thresholds: budgetThresholds}, nil)
	if err := m.open(); err != nil {
		t.Fatal(err)
	}
	m.SetBudget(0)
	m.SetLoading(true)
	src.set(0, 0.97)
	m.tick()
	if d := m.Snapshot().Devices[0]; d.Budget != 0 || d.WarnAt != 0.995 {
		t.Fatalf("unknown budget while loading: %+v", d)
	}
	m.SetLoading(false)
	m.tick()
	if d := m.Snapshot().Devices[0]; d.Budget < 0.969 || d.CriticalAt != 0.995 || len(m.Snapshot().Active) != 0 {
		t.Fatalf("learned budget: %+v active %v", d, m.Snapshot().Active)
	}
	if c := m.CriticalFraction(); c != 0.995 {
		t.Fatalf("CriticalFraction %g", c)
	}
}

// A process's command line never shows vLLM's API key (status, `gpus`,
// the holders named while waiting for memory).
func TestCommandOfMasksAPIKey(t *testing.T) {
	root := t.TempDir()
	old := procRoot
	procRoot = root
	defer func() { procRoot = old }()
	os.MkdirAll(filepath.Join(root, "42"), 0o755)
	os.WriteFile(filepath.Join(root, "42", "cmdline"), []byte("vllm\x00serve\x00m\x00--api-key\x00sk-a\x00sk-b\x00--port\x008000\x00"), 0o644)
	if got := commandOf(42); got != "vllm serve m --api-key *** *** --port 8000" {
		t.Fatalf("commandOf = %q", got)
	}
}

// A GPU NVML answers "GPU is lost" for while listing the GPUs (lost before
// the guard started) is known lost, not unknown, until an open succeeds.
func TestOpenOnALostGPUKnowsItLost(t *testing.T) {
	src := &scripted{
		openErrs: []error{&lostError{index: 1, err: errors.New("NVML could not open GPU 1: GPU is lost")}},
		used:     []uint64{10 << 30, 10 << 30}, total: 80 << 30,
	}
	m := newMonitor(src, Options{SampleInterval: time.Second}, nil)
	if err := m.Open(); err == nil {
		t.Fatal("open succeeded on a lost GPU")
	}
	h := m.Health()
	if !h.Known || len(h.Devices) != 1 || h.Devices[0].Index != 1 || !h.Devices[0].Lost {
		t.Fatalf("health after an open that found GPU 1 lost: %+v", h)
	}
	if err := m.Open(); err != nil { // the GPU reset: it lists again
		t.Fatal(err)
	}
	defer m.Close()
	for _, d := range m.Health().Devices {
		if d.Lost {
			t.Fatalf("GPU %d still lost after a successful open: %+v", d.Index, m.Health())
		}
	}
}
