package main

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// era is the generation of vLLM whose log format the simulator imitates.
type era string

const (
	eraV0      era = "v0"      // 2024: no brackets, no process prefix, V0 messages
	eraV1ANSI  era = "v1-ansi" // 2025: brackets, ANSI-coloured process prefix
	eraV1Plain era = "v1"      // 2026: brackets, plain process prefix, new banner
)

// simEnv is every FAKEVLLM_* knob, read once at process start. Both
// processes read the same environment, so they agree on the model.
type simEnv struct {
	Era era

	LoadWeights   time.Duration
	Compile       time.Duration
	KVProfile     time.Duration
	Graphs        time.Duration
	Server        time.Duration
	ProgressEvery time.Duration
	SilentCompile bool

	TokenInterval time.Duration
	SplitChars    bool // FAKEVLLM_SPLIT_CHARS: some characters take two ids
	Tick          time.Duration
	OrphanTTL     time.Duration
	DrainCut      time.Duration // v1 era: how long a drain lets requests in flight run before it cuts them

	StateDir       string // FAKENVML_STATE; "" = no shared state
	GPUTotal       int64
	Weights        int64
	SeqCost        int64
	TokenCost      int64
	LeakPerSec     int64
	APIMem         int64
	KVBytesPerTok  int64
	BackgroundSeqs int
	BackgroundAt   time.Duration
	BackgroundRamp time.Duration

	Faults      faults
	FaultSpec   string // FAKEVLLM_FAULT as given
	Marker      string
	StatsFile   string
	VisibleDev  string   // first entry of CUDA_VISIBLE_DEVICES
	VisibleDevs []string // every entry (tensor parallel rank i uses entry i)
	VisibleSet  bool

	DownloadFor  time.Duration // FAKEVLLM_DOWNLOAD: silent download phase
	DownloadDir  string        // FAKEVLLM_DOWNLOAD_DIR: where it writes
	DownloadRate int64         // FAKEVLLM_DOWNLOAD_MIBPS, bytes per second
	ListenDelay  time.Duration // FAKEVLLM_LISTEN_DELAY: "Application startup complete." → listen
	ListenGate   string        // FAKEVLLM_LISTEN_GATE: listen only once this file exists
	BindGate     string        // FAKEVLLM_BIND_GATE: bind the port only once this file exists (vLLM's imports)
	APIKeyEnv    string        // VLLM_API_KEY
	// EngineDeadExit (FAKEVLLM_ENGINE_DEAD_EXIT): from a runtime engine
	// death to the API server's exit. vLLM 0.32.0's watchdog looks every
	// 5 s (about 6 s seen on the real server); the default, 100 ms, keeps
	// the scenes that do not wait on it quick.
	EngineDeadExit time.Duration

	// Standby (issue 42; sleep.go, preload.go, startupplan.go).
	Device        string        // FAKEVLLM_DEVICE: "cuda" (default) or "cpu" (the CPU build's refusals)
	DevMode       bool          // VLLM_SERVER_DEV_MODE=1: the dev routes (/sleep, /wake_up, /is_sleeping)
	Wake          time.Duration // FAKEVLLM_WAKE: wake_up from level 1 (0: the weights at 20 GiB/s)
	SleepResidual int64         // FAKEVLLM_SLEEP_RESIDUAL_MIB: what a sleeping engine keeps on the GPU
	IPCMap        time.Duration // FAKEVLLM_IPC_MAP: mapping the weights from the weight cache daemon
	StartupPlan   bool          // VLLM_ENABLE_STARTUP_PLAN=1
	CacheRoot     string        // VLLM_CACHE_ROOT (default $XDG_CACHE_HOME/vllm, ~/.cache/vllm)
	TempDir       string        // TMPDIR (default /tmp): the weight cache daemon's socket folder's parent
}

// loadEnv reads the environment through lookup (os.LookupEnv in the
// binary, a map in tests). Every malformed value is an error naming the
// variable.
func loadEnv(lookup func(string) (string, bool)) (*simEnv, error) {
	get := func(name string) string { v, _ := lookup(name); return v }
	e := &simEnv{}
	var errs []string
	dur := func(name string, def time.Duration) time.Duration {
		v := strings.TrimSpace(get(name))
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			errs = append(errs, fmt.Sprintf("%s=%q is not a Go duration such as \"300ms\" or \"2s\"", name, v))
			return def
		}
		return d
	}
	size := func(name string, def float64, unit int64) int64 {
		v := strings.TrimSpace(get(name))
		if v == "" {
			return int64(def * float64(unit))
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1<<40 {
			errs = append(errs, fmt.Sprintf("%s=%q is not a non-negative number", name, v))
			return int64(def * float64(unit))
		}
		return int64(f * float64(unit))
	}
	integer := func(name string, def int) int {
		v := strings.TrimSpace(get(name))
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Sprintf("%s=%q is not a non-negative integer", name, v))
			return def
		}
		return n
	}

	switch v := strings.TrimSpace(get("FAKEVLLM_ERA")); v {
	case "", string(eraV1ANSI):
		e.Era = eraV1ANSI
	case string(eraV0), string(eraV1Plain):
		e.Era = era(v)
	default:
		errs = append(errs, fmt.Sprintf("FAKEVLLM_ERA=%q is not one of v0, v1-ansi, v1", v))
	}
	e.LoadWeights = dur("FAKEVLLM_LOAD_WEIGHTS", 300*time.Millisecond)
	e.Compile = dur("FAKEVLLM_COMPILE", 100*time.Millisecond)
	e.KVProfile = dur("FAKEVLLM_KV_PROFILE", 50*time.Millisecond)
	e.Graphs = dur("FAKEVLLM_GRAPHS", 100*time.Millisecond)
	e.Server = dur("FAKEVLLM_SERVER", 50*time.Millisecond)
	e.ProgressEvery = dur("FAKEVLLM_PROGRESS_EVERY", time.Second)
	if e.ProgressEvery <= 0 {
		e.ProgressEvery = time.Second
	}
	e.SilentCompile = truthy(get("FAKEVLLM_SILENT_COMPILE"))
	e.TokenInterval = dur("FAKEVLLM_TOKEN_INTERVAL", time.Millisecond)
	e.EngineDeadExit = dur("FAKEVLLM_ENGINE_DEAD_EXIT", 100*time.Millisecond)
	e.SplitChars = truthy(get("FAKEVLLM_SPLIT_CHARS"))
	e.Tick = dur("FAKEVLLM_TICK", 50*time.Millisecond)
	if e.Tick <= 0 {
		e.Tick = 50 * time.Millisecond
	}
	e.OrphanTTL = dur("FAKEVLLM_ORPHAN_TTL", 10*time.Minute)
	e.DrainCut = dur("FAKEVLLM_DRAIN_CUT", 4*time.Second)

	e.StateDir = get("FAKENVML_STATE")
	e.GPUTotal = size("FAKEVLLM_GPU_TOTAL_GIB", 80, gib)
	e.Weights = size("FAKEVLLM_WEIGHTS_GIB", 15, gib)
	e.SeqCost = size("FAKEVLLM_SEQ_COST_MIB", 40, mib)
	e.TokenCost = size("FAKEVLLM_TOKEN_COST_KIB", 16, kib)
	e.LeakPerSec = size("FAKEVLLM_LEAK_MIB_PER_S", 0, mib)
	e.APIMem = size("FAKEVLLM_API_MIB", 256, mib)
	e.KVBytesPerTok = size("FAKEVLLM_KV_BYTES_PER_TOKEN", 131072, 1)
	if e.KVBytesPerTok <= 0 {
		errs = append(errs, "FAKEVLLM_KV_BYTES_PER_TOKEN must be positive")
		e.KVBytesPerTok = 131072
	}
	if e.GPUTotal <= 0 {
		errs = append(errs, "FAKEVLLM_GPU_TOTAL_GIB must be positive")
		e.GPUTotal = 80 * gib
	}
	e.BackgroundSeqs = integer("FAKEVLLM_BACKGROUND_SEQS", 0)
	e.BackgroundAt = dur("FAKEVLLM_BACKGROUND_AFTER", 0)
	e.BackgroundRamp = dur("FAKEVLLM_BACKGROUND_RAMP", 0)

	e.FaultSpec = get("FAKEVLLM_FAULT")
	f, err := parseFaults(e.FaultSpec)
	if err != nil {
		errs = append(errs, "FAKEVLLM_FAULT: "+err.Error())
	}
	e.Faults = f
	e.Marker = get("FAKEVLLM_FAULT_MARKER")
	e.StatsFile = get("FAKEVLLM_STATS_FILE")
	if v, ok := lookup("CUDA_VISIBLE_DEVICES"); ok {
		e.VisibleSet = true
		first, _, _ := strings.Cut(v, ",")
		e.VisibleDev = strings.TrimSpace(first)
		for _, d := range strings.Split(v, ",") {
			if d = strings.TrimSpace(d); d != "" {
				e.VisibleDevs = append(e.VisibleDevs, d)
			}
		}
	}
	e.DownloadFor = dur("FAKEVLLM_DOWNLOAD", 0)
	e.DownloadDir = get("FAKEVLLM_DOWNLOAD_DIR")
	if e.DownloadFor > 0 && e.DownloadDir == "" {
		errs = append(errs, "FAKEVLLM_DOWNLOAD is set but FAKEVLLM_DOWNLOAD_DIR (the folder it writes to) is not")
	}
	e.DownloadRate = size("FAKEVLLM_DOWNLOAD_MIBPS", 64, mib)
	if e.DownloadRate <= 0 {
		e.DownloadRate = 64 * mib
	}
	e.ListenDelay = dur("FAKEVLLM_LISTEN_DELAY", 0)
	e.ListenGate = get("FAKEVLLM_LISTEN_GATE")
	e.BindGate = get("FAKEVLLM_BIND_GATE")
	e.APIKeyEnv = get("VLLM_API_KEY")
	switch v := strings.TrimSpace(get("FAKEVLLM_DEVICE")); v {
	case "", "cuda":
		e.Device = "cuda"
	case "cpu":
		e.Device = "cpu"
	default:
		errs = append(errs, fmt.Sprintf("FAKEVLLM_DEVICE=%q is not cuda or cpu", v))
	}
	e.DevMode = pyIntFlag(get("VLLM_SERVER_DEV_MODE"), "VLLM_SERVER_DEV_MODE", &errs)
	e.StartupPlan = pyIntFlag(get("VLLM_ENABLE_STARTUP_PLAN"), "VLLM_ENABLE_STARTUP_PLAN", &errs)
	e.Wake = dur("FAKEVLLM_WAKE", 0)
	e.SleepResidual = size("FAKEVLLM_SLEEP_RESIDUAL_MIB", 512, mib)
	e.IPCMap = dur("FAKEVLLM_IPC_MAP", 100*time.Millisecond)
	e.CacheRoot = vllmCacheRoot(get)
	e.TempDir = get("TMPDIR")
	if e.TempDir == "" {
		e.TempDir = "/tmp"
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("fakevllm: bad environment: %s; fix the variable or unset it to use the default", strings.Join(errs, "; "))
	}
	return e, nil
}

func truthy(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

// faults is the parsed FAKEVLLM_FAULT: name → duration (0 for faults
// without a value) and the log-flood rate.
type faults struct {
	set       map[string]time.Duration
	FloodMBps float64
}

// Fault names. The *_after faults take a duration measured from ready.
const (
	fCrashOnStart  = "crash_on_start"
	fCrashAfter    = "crash_after"
	fSegvAfter     = "segv_after"
	fHangLoading   = "hang_loading"
	fHangAfter     = "hang_after"
	fHealth503     = "health503_after"
	fNeverReady    = "never_ready"
	fIgnoreSIGTERM = "ignore_sigterm"
	fLogFlood      = "log_flood"
	fInvalidUTF8   = "invalid_utf8"
	fLongLine      = "long_line"
	fControlBytes  = "control_bytes"
	fCloseStdout   = "close_stdout"
	fOrphanAfter   = "orphan_after"
	fGrandchild    = "grandchild"
	fOOMOnStart    = "oom_on_start"
	fNCCLOOMStart  = "nccl_oom_on_start"
	fNCCLOOMAfter  = "nccl_oom_after"
	fWedgeAfter    = "wedge_after"
	fWedgeAfterReq = "wedge_after_requests"
)

var faultTakesDuration = map[string]bool{
	fCrashAfter: true, fSegvAfter: true, fHangAfter: true, fHealth503: true, fOrphanAfter: true,
	fNCCLOOMAfter: true, fWedgeAfter: true,
}

// faultTakesCount: faults whose value is a count of requests.
var faultTakesCount = map[string]bool{fWedgeAfterReq: true}

var faultPlain = map[string]bool{
	fCrashOnStart: true, fHangLoading: true, fNeverReady: true, fIgnoreSIGTERM: true,
	fInvalidUTF8: true, fLongLine: true, fControlBytes: true, fCloseStdout: true, fGrandchild: true, fOOMOnStart: true,
	fNCCLOOMStart: true,
}

// parseFaults parses "crash_after=2s,ignore_sigterm,log_flood=5".
func parseFaults(spec string) (faults, error) {
	f := faults{set: map[string]time.Duration{}}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, val, hasVal := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		val = strings.TrimSpace(val)
		switch {
		case faultPlain[name]:
			if hasVal {
				return faults{}, fmt.Errorf("fault %q takes no value (got %q)", name, val)
			}
			f.set[name] = 0
		case faultTakesDuration[name]:
			d, err := time.ParseDuration(val)
			if !hasVal || err != nil || d < 0 {
				return faults{}, fmt.Errorf("fault %q needs a duration after ready, such as %s=2s (got %q)", name, name, val)
			}
			f.set[name] = d
		case faultTakesCount[name]:
			n, err := strconv.Atoi(val)
			if !hasVal || err != nil || n < 1 || n > 1<<30 {
				return faults{}, fmt.Errorf("fault %q needs a count of requests, such as %s=3 (got %q)", name, name, val)
			}
			f.set[name] = time.Duration(n)
		case name == fLogFlood:
			r, err := strconv.ParseFloat(val, 64)
			if !hasVal || err != nil || r <= 0 || r > 10000 {
				return faults{}, fmt.Errorf("fault log_flood needs a rate in MB/s between 0 and 10000, such as log_flood=5 (got %q)", val)
			}
			f.set[name] = 0
			f.FloodMBps = r
		default:
			return faults{}, fmt.Errorf("unknown fault %q; known: %s", name, strings.Join(allFaultNames(), ", "))
		}
	}
	return f, nil
}

func allFaultNames() []string {
	var n []string
	for k := range faultPlain {
		n = append(n, k)
	}
	for k := range faultTakesDuration {
		n = append(n, k)
	}
	for k := range faultTakesCount {
		n = append(n, k)
	}
	n = append(n, fLogFlood)
	sort.Strings(n)
	return n
}

func (f faults) has(name string) bool { _, ok := f.set[name]; return ok }

// count is a count fault's value.
func (f faults) count(name string) (int, bool) {
	d, ok := f.set[name]
	return int(d), ok
}

func (f faults) after(name string) (time.Duration, bool) {
	d, ok := f.set[name]
	return d, ok
}

// String renders the faults back in FAKEVLLM_FAULT syntax, for the engine.
func (f faults) String() string {
	var parts []string
	for k, d := range f.set {
		switch {
		case faultTakesDuration[k]:
			parts = append(parts, k+"="+d.String())
		case faultTakesCount[k]:
			parts = append(parts, k+"="+strconv.FormatInt(int64(d), 10))
		case k == fLogFlood:
			parts = append(parts, k+"="+strconv.FormatFloat(f.FloodMBps, 'g', -1, 64))
		default:
			parts = append(parts, k)
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// markerAllows reports whether faults may fire: the marker file, when
// configured, must not exist yet.
func (e *simEnv) markerAllows() bool {
	if e.Marker == "" {
		return true
	}
	_, err := os.Stat(e.Marker)
	return os.IsNotExist(err)
}

// fired records that a fault fired, making the marker exist so that the
// next start runs clean.
func (e *simEnv) fired() {
	if e.Marker == "" {
		return
	}
	if f, err := os.OpenFile(e.Marker, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		f.Close()
	}
}
