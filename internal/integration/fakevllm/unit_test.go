package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

var v0LineRE = regexp.MustCompile(`^(INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d [a-z_]+\.py:\d+\] `)

func TestParseServeArgs(t *testing.T) {
	a, err := parseServeArgs([]string{"org/m", "--port=9000", "--max-num-seqs", "8", "--gpu-memory-utilization", "0.8", "--enforce-eager", "--kv-cache-memory-bytes=1024"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Model != "org/m" || a.Port != 9000 || a.MaxNumSeqs != 8 || a.GPUMemUtil != 0.8 || !a.EnforceEager || a.KVCacheMemoryBytes != 1024 || a.ServedName != "org/m" || a.Host != "0.0.0.0" || a.MaxModelLen != 4096 {
		t.Errorf("parsed %+v", a)
	}
	// The engine gets the arguments back and must parse them the same way.
	b, err := parseServeArgs(a.argv())
	if err != nil {
		t.Fatal(err)
	}
	if b.Model != a.Model || b.Port != a.Port || b.MaxNumSeqs != a.MaxNumSeqs || b.GPUMemUtil != a.GPUMemUtil || b.EnforceEager != a.EnforceEager || b.KVCacheMemoryBytes != a.KVCacheMemoryBytes {
		t.Errorf("round trip %+v != %+v", b, a)
	}
	for _, c := range []struct {
		argv []string
		want string
	}{
		{[]string{"m", "--max-num-seqz", "8"}, "unrecognized arguments: --max-num-seqz 8"},
		// argparse's allow_abbrev over vLLM's flags (issue 32 item 3).
		{[]string{"m", "--api", "k"}, "ambiguous option: --api could match --api-key, --api-server-count"},
		{[]string{"m", "--por", "x"}, "argument --port: invalid int value: 'x'"},
		{[]string{"m", "--bogus=1", "extra"}, "unrecognized arguments: --bogus=1 extra"},
		{[]string{"m", "--port"}, "argument --port: expected one argument"},
		{[]string{"m", "--port", "x"}, "argument --port: invalid int value: 'x'"},
		{[]string{"m", "--shutdown-timeout", "2.5"}, "argument --shutdown-timeout: invalid int value: '2.5'"}, // merged vLLM: whole seconds
		{[]string{"m", "--gpu-memory-utilization", "high"}, "argument --gpu-memory-utilization: invalid float value: 'high'"},
		{[]string{"m", "--enforce-eager=1"}, "argument --enforce-eager: ignored explicit argument '1'"},
		{[]string{"--port", "1"}, "the following arguments are required: model_tag"},
	} {
		_, err := parseServeArgs(c.argv)
		var ae *argError
		if !errors.As(err, &ae) || ae.msg != c.want {
			t.Errorf("%q: got %v, want %q", c.argv, err, c.want)
		}
	}
	if _, err := parseServeArgs([]string{"-h"}); err != errHelp {
		t.Errorf("-h: %v", err)
	}
}

// An unambiguous abbreviation is its flag, as in vLLM: --api-ke sets the
// API key, --max_num_se the sequences.
func TestParseServeArgsAbbreviations(t *testing.T) {
	a, err := parseServeArgs([]string{"m", "--api-ke", "k1", "k2", "--max_num_se=8", "--enforce-ea"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.APIKeys, []string{"k1", "k2"}) || a.MaxNumSeqs != 8 || !a.EnforceEager {
		t.Errorf("parsed %+v", a)
	}
}

func TestNonDefaultArgs(t *testing.T) {
	a, _ := parseServeArgs([]string{"org/m", "--max-num-seqs", "64", "--gpu-memory-utilization", "1"})
	got := a.nonDefaultArgs()
	want := "{'model_tag': 'org/m', 'model': 'org/m', 'gpu_memory_utilization': 1.0, 'max_num_seqs': 64}"
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

func TestLoadEnv(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	e, err := loadEnv(env(map[string]string{}))
	if err != nil {
		t.Fatal(err)
	}
	if e.Era != eraV1ANSI || e.LoadWeights != 300*time.Millisecond || e.GPUTotal != 80*gib || e.SeqCost != 40*mib || e.APIMem != 256*mib || e.OrphanTTL != 10*time.Minute || e.VisibleSet {
		t.Errorf("defaults %+v", e)
	}
	e, err = loadEnv(env(map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-abc,1", "FAKEVLLM_WEIGHTS_GIB": "0.5"}))
	if err != nil || e.VisibleDev != "GPU-abc" || e.Weights != gib/2 {
		t.Errorf("got %+v, %v", e, err)
	}
	_, err = loadEnv(env(map[string]string{"FAKEVLLM_LOAD_WEIGHTS": "5", "FAKEVLLM_ERA": "v2"}))
	if err == nil || !strings.Contains(err.Error(), "FAKEVLLM_LOAD_WEIGHTS") || !strings.Contains(err.Error(), "FAKEVLLM_ERA") {
		t.Errorf("bad env error %v", err)
	}
}

func TestParseFaults(t *testing.T) {
	f, err := parseFaults(" crash_after=2s, ignore_sigterm ,log_flood=2.5")
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := f.after(fCrashAfter); !ok || d != 2*time.Second || !f.has(fIgnoreSIGTERM) || f.FloodMBps != 2.5 {
		t.Errorf("parsed %+v", f)
	}
	back, err := parseFaults(f.String())
	if err != nil || back.String() != f.String() {
		t.Errorf("round trip %q → %q (%v)", f.String(), back.String(), err)
	}
	for _, bad := range []string{"crash_after", "crash_after=x", "hang_loading=1s", "nope", "log_flood=0"} {
		if _, err := parseFaults(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestMarker(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "m")
	e := &simEnv{Marker: marker}
	if !e.markerAllows() {
		t.Fatal("marker absent but faults disallowed")
	}
	e.fired()
	if e.markerAllows() {
		t.Fatal("marker created but faults still allowed")
	}
}

func TestParseDevices(t *testing.T) {
	devs, err := parseDevices([]byte("# comment\n\nGPU-a 100 10 NVIDIA  H100 80GB\nGPU-b 200 0 Other\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].Name != "NVIDIA  H100 80GB" || devs[1].Index != 1 || devs[1].Total != 200 {
		t.Errorf("devices %+v", devs)
	}
	for _, bad := range []string{"GPU-a 100 10", "GPU-a x 1 n", "GPU-a 100 200 n"} {
		if _, err := parseDevices([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for want, sel := range map[string]string{"GPU-a": "", "GPU-b": "1"} {
		if d, ok := pickDevice(devs, sel); !ok || d.UUID != want {
			t.Errorf("pick %q = %v %v", sel, d, ok)
		}
	}
	if d, ok := pickDevice(devs, "GPU-b"); !ok || d.Index != 1 {
		t.Errorf("pick by uuid %v", d)
	}
	if _, ok := pickDevice(devs, "GPU-"); ok {
		t.Error("ambiguous prefix accepted")
	}
	if _, ok := pickDevice(devs, "2"); ok {
		t.Error("index out of range accepted")
	}
}

func TestGPUViewState(t *testing.T) {
	dir := t.TempDir()
	e := &simEnv{StateDir: dir, GPUTotal: 40 * gib}
	v, err := openGPU(e)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, "devices"))
	if string(data) != fmt.Sprintf("%s %d %d NVIDIA H100 80GB HBM3\n", defaultUUID, 40*gib, defaultReserved) {
		t.Errorf("created devices %q", data)
	}
	me := os.Getpid()
	if err := v.setUsage(me, 5*gib); err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "procs", strconv.Itoa(dead.Process.Pid)), []byte("0 999999999999\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "procs", ".tmp-junk"), []byte("0 1\n"), 0o644)
	if got := v.othersUsed(0); got != 5*gib {
		t.Errorf("others = %d, want only the live pid's 5 GiB", got)
	}
	if got := v.othersUsed(me); got != 0 {
		t.Errorf("others excluding me = %d", got)
	}
	v.clearUsage(me)
	if _, err := os.Stat(filepath.Join(dir, "procs", strconv.Itoa(me))); !os.IsNotExist(err) {
		t.Errorf("procs file not removed: %v", err)
	}
	if _, err := openGPU(&simEnv{StateDir: dir, VisibleSet: true, VisibleDev: "3"}); err != errNoGPU {
		t.Errorf("device 3 of 1: %v", err)
	}
}

func TestProcStatState(t *testing.T) {
	if s := procStatState([]byte("42 (a) b) Z 1 2")); s != 'Z' {
		t.Errorf("state %q", s)
	}
	if s := procStatState([]byte("garbage")); s != 0 {
		t.Errorf("state %q", s)
	}
}

func TestMemModel(t *testing.T) {
	m := memModel{Total: 80 * gib, Reserved: 512 * mib, Util: 0.9, Weights: 15 * gib, SeqCost: 40 * mib, TokenCost: 16 * kib, LeakPerSec: mib, MaxNumSeqs: 256, BytesPerKV: 131072}
	if m.budget() != int64(0.9*float64(m.Total)) {
		t.Errorf("budget %d", m.budget())
	}
	if want := m.budget() - 15*gib - 256*40*mib; m.kvAvailable() != want {
		t.Errorf("kv %d want %d", m.kvAvailable(), want)
	}
	if got := m.serving(2, 64, 2*time.Second); got != m.budget()+80*mib+64*16*kib+2*mib {
		t.Errorf("serving %d", got)
	}
	// room = 80 − 0.5 − 0.25 − 72 GiB = 7.25 GiB = 185.6 sequences.
	if got := m.safeMaxNumSeqs(256*mib, 0, 0); got != 185 {
		t.Errorf("safe %d want 185", got)
	}
	k := m
	k.KVBytes = 10 * gib
	if k.budget() != 25*gib || k.kvAvailable() != 10*gib || k.kvTokens() != 10*gib/131072 {
		t.Errorf("kv-cache-memory-bytes: budget %d kv %d", k.budget(), k.kvAvailable())
	}
}

func TestBackgroundSeqs(t *testing.T) {
	for _, c := range []struct {
		n               int
		after, ramp, at time.Duration
		want            int
	}{
		{0, 0, 0, time.Hour, 0},
		{10, 0, 0, 0, 10},
		{10, time.Second, 0, 999 * time.Millisecond, 0},
		{10, time.Second, 0, time.Second, 10},
		{10, time.Second, 10 * time.Second, 6 * time.Second, 5},
		{10, 0, 10 * time.Second, time.Minute, 10},
	} {
		if got := backgroundSeqs(c.n, c.after, c.ramp, c.at); got != c.want {
			t.Errorf("%+v: got %d", c, got)
		}
	}
}

func TestRunPhase(t *testing.T) {
	var steps []int
	runPhase(0, 3, time.Second, func(s int) { steps = append(steps, s) })
	if fmt.Sprint(steps) != "[1 2 3]" {
		t.Errorf("zero-length phase steps %v", steps)
	}
	// 30 ms with a 5 ms progress period: the idle callback runs, every
	// 5 ms of the phase (fake time: a loaded machine's scheduling does not
	// thin the ticks out).
	synctest.Test(t, func(t *testing.T) {
		var steps []int
		runPhase(30*time.Millisecond, 1, 5*time.Millisecond, func(s int) { steps = append(steps, s) })
		if len(steps) < 3 || steps[len(steps)-1] != 1 || steps[0] != -1 {
			t.Errorf("steps %v, want idle ticks then step 1", steps)
		}
	})
}

func TestLoggerEras(t *testing.T) {
	fixed := func() time.Time { return time.Date(2025, 10, 14, 12, 0, 0, 0, time.Local) }
	for _, c := range []struct {
		era  era
		want string
	}{
		{eraV0, "INFO 10-14 12:00:00 api_server.py:1] hello\n"},
		{eraV1Plain, "(APIServer pid=7) INFO 10-14 12:00:00 [api_server.py:1] hello\n"},
		{eraV1ANSI, "\x1b[1;36m(APIServer pid=7)\x1b[0;0m INFO 10-14 12:00:00 [api_server.py:1] hello\n"},
	} {
		var out, errb strings.Builder
		stats := &writeStats{}
		l := newLogger(c.era, "APIServer", 7, &streamWriter{w: &out, stats: stats}, &streamWriter{w: &errb, stats: stats})
		l.now = fixed
		l.info("api_server.py:1", "hello")
		if out.String() != c.want {
			t.Errorf("%s: %q want %q", c.era, out.String(), c.want)
		}
		l.stderrLines("Traceback (most recent call last):\nValueError: x")
		if n := strings.Count(errb.String(), l.prefix+"ValueError: x\n"); n != 1 {
			t.Errorf("%s: traceback lines %q", c.era, errb.String())
		}
		if s := stats.snapshot(); s.Lines != 3 || s.Bytes != int64(out.Len()+errb.Len()) {
			t.Errorf("stats %+v", s)
		}
	}
}

func TestProgressBars(t *testing.T) {
	// Below one shard a second tqdm inverts the rate (format_meter: "s/it").
	if got := shardsBar(1, 2, 2*time.Second); got != "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:02<00:02,  2.00s/it]" {
		t.Errorf("shards bar %q", got)
	}
	if got := tqdmBar("Capturing CUDA graphs", 67, 67, time.Second); !strings.HasPrefix(got, "Capturing CUDA graphs: 100%|██████████| 67/67 [00:01<00:00") {
		t.Errorf("tqdm bar %q", got)
	}
	if withThousands(425424) != "425,424" || withThousands(-1234) != "-1,234" || withThousands(12) != "12" {
		t.Error("thousands separators")
	}
	if torchSize(50*mib) != "50.00 MiB" || torchSize(23*gib) != "23.00 GiB" {
		t.Error("torch sizes")
	}
}

func TestSchedulerFIFO(t *testing.T) {
	s := newScheduler(1)
	ctx := context.Background()
	if err := s.admit(ctx, 10); err != nil {
		t.Fatal(err)
	}
	// Prompt tokens count once the prefill ran, not at admission (a
	// wedged engine admits but never prefills).
	if s.snapshot().PromptTotal != 0 {
		t.Errorf("prompt tokens counted at admission")
	}
	s.prefilled(10)
	order := make(chan int, 2)
	for i := 1; i <= 2; i++ {
		go func() {
			if err := s.admit(ctx, 5); err == nil {
				s.prefilled(5)
				order <- i
				s.finish(5, 0)
			}
		}()
		// Queue them in order: wait until this one waits.
		for s.snapshot().Waiting != i {
			<-s.changed
		}
	}
	// A cancelled waiter leaves the queue and its prompt tokens go.
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- s.admit(cctx, 100) }()
	for s.snapshot().Waiting != 3 {
		<-s.changed
	}
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("cancelled admit succeeded")
	}
	if snap := s.snapshot(); snap.Waiting != 2 || snap.AdmittedPrompt != 20 || snap.Running != 1 {
		t.Errorf("after cancel %+v", snap)
	}
	s.generated(3)
	s.finish(10, 3)
	if a, b := <-order, <-order; a != 1 || b != 2 {
		t.Errorf("order %d %d, want FIFO", a, b)
	}
	snap := s.snapshot()
	if snap.Running != 0 || snap.Waiting != 0 || snap.AdmittedPrompt != 0 || snap.KVInUse != 0 || snap.PromptTotal != 20 || snap.GenTotal != 3 {
		t.Errorf("final %+v", snap)
	}
}

func TestPromptTokens(t *testing.T) {
	for raw, want := range map[string]int{
		`"abcdefgh"`:          2,
		`""`:                  1,
		`["abcd","abcdabcd"]`: 3,
		`[1,2,3]`:             3,
		`[[1,2],[3]]`:         3,
	} {
		got, err := promptTokens(json.RawMessage(raw))
		if err != nil || got != want {
			t.Errorf("%s: %d %v, want %d", raw, got, err, want)
		}
	}
	for _, bad := range []string{``, `null`, `[]`, `{}`, `[{}]`} {
		if _, err := promptTokens(json.RawMessage(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	n, err := chatTokens([]chatMessage{{Role: "user", Content: json.RawMessage(`"abcdabcd"`)}, {Role: "user", Content: json.RawMessage(`[{"type":"text","text":"abcd"}]`)}})
	// 2 + 1 content ids, a role and an end token per message, the assistant's.
	if err != nil || n != 8 {
		t.Errorf("chat tokens %d %v, want 8", n, err)
	}
}

func TestMessages(t *testing.T) {
	m, err := parseMsg(formatMsg("load", "running", 3, "prompt_tokens", 40))
	if err != nil || m.Kind != "load" {
		t.Fatal(m, err)
	}
	if n, err := m.int("running"); err != nil || n != 3 {
		t.Errorf("running %d %v", n, err)
	}
	if _, err := m.int("absent"); err == nil {
		t.Error("absent field read")
	}
	if _, err := parseMsg("load running"); err == nil {
		t.Error("field without = accepted")
	}
}

// Fuzz targets: every parser, seeded with the fixtures above.

func FuzzParseServeArgs(f *testing.F) {
	f.Add("org/m --port=9000 --max-num-seqs 8 --enforce-eager")
	f.Add("m --max-num-seq 8")
	f.Add("-- m --port")
	f.Add("m --gpu-memory-utilization -0.5")
	f.Fuzz(func(t *testing.T, line string) {
		a, err := parseServeArgs(strings.Fields(line))
		if err != nil {
			var ae *argError
			if !errors.As(err, &ae) {
				t.Fatalf("non-argparse error %v", err)
			}
			return
		}
		if a.Model == "" || a.ServedName == "" {
			t.Fatalf("accepted without a model: %+v", a)
		}
		a.nonDefaultArgs()
		if a.validate() == nil && !strings.HasPrefix(a.Model, "-") {
			b, err := parseServeArgs(a.argv())
			if err != nil || b.MaxNumSeqs != a.MaxNumSeqs || b.Port != a.Port {
				t.Fatalf("round trip of %q: %v", a.argv(), err)
			}
		}
	})
}

func FuzzParseDevices(f *testing.F) {
	f.Add([]byte("GPU-a 100 10 NVIDIA H100 80GB HBM3\n"))
	f.Add([]byte("# c\n\n GPU-b\t200 0 x y\n"))
	f.Add([]byte("GPU-a 1 2 n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		devs, err := parseDevices(data)
		if err != nil {
			return
		}
		for i, d := range devs {
			if d.Index != i || d.Total <= 0 || d.Reserved < 0 || d.Reserved > d.Total || d.Name == "" {
				t.Fatalf("bad device %+v", d)
			}
		}
	})
}

func FuzzParseProcEntries(f *testing.F) {
	f.Add([]byte("0 1073741824\n"))
	f.Add([]byte("0 1\n1 2\n0 3\n"))
	f.Add([]byte("x y z"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseProcEntries(data)
		if err != nil {
			return
		}
		for idx := range m {
			if idx < 0 {
				t.Fatalf("negative index in %v", m)
			}
		}
	})
}

func FuzzParseFaults(f *testing.F) {
	f.Add("crash_after=2s,ignore_sigterm")
	f.Add("log_flood=2.5,long_line")
	f.Add("hang_loading=1s")
	f.Fuzz(func(t *testing.T, spec string) {
		fs, err := parseFaults(spec)
		if err != nil {
			return
		}
		back, err := parseFaults(fs.String())
		if err != nil || back.String() != fs.String() {
			t.Fatalf("round trip of %q: %q, %v", fs.String(), back.String(), err)
		}
	})
}

func FuzzParseMsg(f *testing.F) {
	f.Add("load running=3 prompt_tokens=40")
	f.Add("loaded kv_tokens=100")
	f.Add("dead reason=oom")
	f.Add("mem a=")
	f.Fuzz(func(t *testing.T, line string) {
		m, err := parseMsg(line)
		if err != nil {
			return
		}
		m2, err := parseMsg(m.String())
		if err != nil || m2.String() != m.String() {
			t.Fatalf("round trip %q → %q (%v)", m.String(), m2.String(), err)
		}
	})
}

func FuzzPromptTokens(f *testing.F) {
	f.Add([]byte(`"abcdefgh"`))
	f.Add([]byte(`["a",[1,2],3]`))
	f.Add([]byte(`{"x":1}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		n, err := promptTokens(raw)
		if err == nil && n < 1 {
			t.Fatalf("%q: %d tokens", raw, n)
		}
		var msgs []chatMessage
		if json.Unmarshal(raw, &msgs) == nil {
			if n, err := chatTokens(msgs); err == nil && n < 1 {
				t.Fatalf("chat %q: %d tokens", raw, n)
			}
		}
	})
}

func TestParseServeArgsProduction(t *testing.T) {
	a, err := parseServeArgs([]string{"--port", "1", "org/m", "--max_num_seqs=4", "-tp", "2", "--api-key", "k1", "k2", "--served-model-name", "a", "b", "--kv-cache-memory-bytes", "1.5g", "--max-model-len", "32K"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Model != "org/m" || a.MaxNumSeqs != 4 || a.TensorParallel != 2 || strings.Join(a.APIKeys, ",") != "k1,k2" ||
		strings.Join(a.ServedNames, ",") != "a,b" || a.ServedName != "a" || a.KVCacheMemoryBytes != 1500000000 || a.MaxModelLen != 32768 {
		t.Errorf("parsed %+v", a)
	}
	if len(a.Warnings) != 0 {
		t.Errorf("warnings %q", a.Warnings)
	}
	// The engine's copy parses back the same, without the keys.
	b, err := parseServeArgs(a.argv())
	if err != nil || strings.Join(b.ServedNames, ",") != "a,b" || b.TensorParallel != 2 || len(b.APIKeys) != 0 || b.KVCacheMemoryBytes != a.KVCacheMemoryBytes {
		t.Errorf("round trip %+v %v", b, err)
	}
	a, _ = parseServeArgs([]string{"m", "--max-num-seqs", "1", "--max-num-seqs", "2", "--model", "other"})
	if a.MaxNumSeqs != 2 || a.Model != "m" || len(a.Warnings) != 2 || !strings.Contains(a.Warnings[1], "Found duplicate keys --max-num-seqs") {
		t.Errorf("last wins, positional over --model, two warnings: %+v %q", a, a.Warnings)
	}
	a, _ = parseServeArgs([]string{"m", "--max-model-len", "auto"})
	if !a.MaxModelLenAuto || !strings.Contains(a.nonDefaultArgs(), "'max_model_len': -1") {
		t.Errorf("auto: %+v", a)
	}
	for _, c := range []struct {
		argv []string
		want string
	}{
		{[]string{"m", "--kv-cache-memory-bytes", "1.5G"}, "argument --kv-cache-memory-bytes: Decimals are not allowed with binary suffixes like G. Did you mean to use 1.5g instead?"},
		{[]string{"m", "--max-model-len", "lots"}, "argument --max-model-len: invalid human_readable_int value: 'lots'"},
		{[]string{"m", "--api-key"}, "argument --api-key: expected at least one argument"},
		{[]string{"m", "--runner", "fast"}, "argument --runner: invalid choice: 'fast' (choose from 'auto', 'generate', 'pooling')"},
	} {
		_, err := parseServeArgs(c.argv)
		var ae *argError
		if !errors.As(err, &ae) || ae.msg != c.want {
			t.Errorf("%q: got %v, want %q", c.argv, err, c.want)
		}
	}
}

// The eras' flags: --task is known before merged vLLM and unknown in it;
// --convert decides the pooling task in every era.
func TestTaskFlagsByEra(t *testing.T) {
	if a, err := parseServeArgsFor([]string{"m", "--task", "embed"}, eraV1ANSI); err != nil || a.poolingTask() != "embed" {
		t.Errorf("2025 --task embed: %+v %v", a, err)
	}
	_, err := parseServeArgsFor([]string{"m", "--task", "embed", "--max-num-seqs", "4"}, eraV1Plain)
	var ae *argError
	if !errors.As(err, &ae) || ae.msg != "unrecognized arguments: --task embed" {
		t.Errorf("merged --task: %v", err)
	}
	for _, e := range []era{eraV1ANSI, eraV1Plain} {
		a, err := parseServeArgsFor([]string{"m", "--runner", "pooling", "--convert", "classify"}, e)
		if err != nil || a.poolingTask() != "classify" || !strings.Contains(a.nonDefaultArgs(), "'convert': 'classify'") {
			t.Errorf("%s --convert classify: %+v %v", e, a, err)
		}
		if b, err := parseServeArgsFor(a.argv(), e); err != nil || b.poolingTask() != "classify" {
			t.Errorf("%s: the engine's argv loses --convert: %v %v", e, a.argv(), err)
		}
	}
	if got := supportedTasks("embed", eraV1Plain); !slices.Equal(got, []string{"embed", "token_embed"}) {
		t.Errorf("merged embed tasks %v", got)
	}
}

func TestHumanReadableInt(t *testing.T) {
	for in, want := range map[string]int64{"1k": 1000, "1K": 1024, "25.6k": 25600, "2G": 2 << 30, "3m": 3000000, "7": 7, " 8 ": 8, "1T": 1 << 40} {
		if got, err := humanReadableInt(in); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "k", "1.5K", "1x", "-k"} {
		if _, err := humanReadableInt(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestConfigFileGoesRightAfterTheModel(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cfg, []byte("max-num-seqs: 5   # comment\nport: 9\nserved_model_name:\n  - n1\n  - 'n2'\nenforce-eager: false\n"), 0o644)
	// Flags before --config on the command line still come after the
	// config's keys (they are inserted right after the model).
	a, err := parseServeArgs([]string{"org/m", "--max-num-seqs", "6", "--config", cfg})
	if err != nil {
		t.Fatal(err)
	}
	if a.MaxNumSeqs != 6 || a.Port != 9 || strings.Join(a.ServedNames, ",") != "n1,n2" || a.EnforceEager || a.ConfigFile != cfg {
		t.Errorf("parsed %+v", a)
	}
	if len(a.Warnings) != 0 {
		t.Errorf("a config key overridden by a flag warned: %q", a.Warnings)
	}
	if _, err := parseServeArgs([]string{"--config", filepath.Join(t.TempDir(), "absent.yaml")}); err == nil {
		t.Error("a missing config file was accepted")
	}
	for _, bad := range []string{"nested:\n  key: 1\n", "- item\n", "noval:\n"} {
		if _, err := parseYAMLSubset([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestTaskFromName(t *testing.T) {
	for model, want := range map[string]string{
		"meta-llama/Llama-3.1-8B": "generate", "BAAI/bge-m3": "embed", "intfloat/e5-mistral-7b-instruct": "embed",
		"BAAI/bge-reranker-large": "classify", "Skywork/Skywork-Reward-V2": "reward", "nomic-ai/nomic-embed-text-v1": "embed",
	} {
		if got := taskFromName(model); got != want {
			t.Errorf("%s: %s, want %s", model, got, want)
		}
	}
}

// chatTokens counts a chat prompt's tokens.
func chatTokens(msgs []chatMessage) (int, error) {
	ids, err := chatPromptIDs(msgs, true)
	return len(ids), err
}

// parseServeArgs parses as the default era does.
func parseServeArgs(argv []string) (*serveArgs, error) {
	return parseServeArgsFor(argv, eraV1ANSI)
}
