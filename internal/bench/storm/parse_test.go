package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
)

// Lines of the guard's event stream (run --events), as it writes them.
var eventLines = []string{
	`{"seq":1,"time":"2026-12-02T10:09:30.006Z","kind":"starting","rung":{"index":1,"max_num_seqs":128,"gpu_memory_utilization":0.8},"argv":["/x/fakevllm","serve","Qwen/Qwen2.5-7B-Instruct","--max-num-seqs","128","--gpu-memory-utilization","0.8"],"pid":3204}`,
	`{"seq":9,"time":"2026-12-02T10:09:33.028Z","kind":"ready","rung":{"index":0,"max_num_seqs":256,"gpu_memory_utilization":0.9},"pid":3204,"time_to_ready_ns":3020000000,"first":true}`,
	`{"seq":11,"time":"2026-12-02T10:09:37.374Z","kind":"exited","pid":3204,"failure":{"pid":3204,"exit":"exit code 0","exit_code":0,"phase":"ready","verdict":{"cause":"oom","confidence":"high","evidence":null,"summary":"x"},"decision":{"action":"restart","rung":{"index":1,"max_num_seqs":128,"gpu_memory_utilization":0.8},"delay":0,"wait_gpu":false,"exit_code":0,"reason":"r"},"rung_before":{"index":0,"max_num_seqs":256,"gpu_memory_utilization":0.9},"uptime_ns":1}}`,
	`{"seq":12,"kind":"exited","failure":{"verdict":{"cause":"hang"}}}`,
	`{"seq":13,"kind":"state","state":"failed","from":"backoff","reason":"gave up: config_error"}`,
	`{"seq":14,"kind":"starting","argv":["v","--max-num-seqs=64"]}`,
	`{"seq":15,"kind":"exited"}`,
	`{"seq":16,"kind":"state","state":"ready"}`,
	`not json`,
}

func TestParseGuardEvent(t *testing.T) {
	want := []guardEvent{
		{kind: "launch", maxNumSeqs: 128}, {kind: "ready"}, {kind: "failed", cause: "oom"}, {kind: "failed", cause: "hang"},
		{kind: "gave_up"}, {kind: "launch", maxNumSeqs: 64}, {}, {}, {},
	}
	for i, line := range eventLines {
		got, ok := parseGuardEvent([]byte(line))
		if got != want[i] || ok != (want[i].kind != "") {
			t.Errorf("line %d: %+v %v, want %+v", i, got, ok, want[i])
		}
	}
}

func FuzzParseGuardEvent(f *testing.F) {
	for _, l := range eventLines {
		f.Add([]byte(l))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, ok := parseGuardEvent(b)
		if !ok && ev != (guardEvent{}) {
			t.Fatalf("not an event but %+v", ev)
		}
		if ev.maxNumSeqs < 0 {
			t.Fatalf("negative max_num_seqs %d", ev.maxNumSeqs)
		}
	})
}

// Lines of the guard's log: only the GPU memory alerts are read there.
var guardLines = []string{
	`{"level":"warn","ts":"2026-12-02T10:09:35.358Z","logger":"gpu","msg":"GPU memory alert","alert":"oom_predicted","active":true,"gpu":0}`,
	`{"level":"info","ts":"2026-12-02T10:09:37.257Z","logger":"gpu","msg":"GPU memory alert","alert":"oom_predicted","active":false,"gpu":0}`,
	`not json`,
	`{"msg":"state ready"}`,
}

func TestParseGuardLine(t *testing.T) {
	want := []guardEvent{{kind: "alert", alert: "oom_predicted"}, {}, {}, {}}
	for i, line := range guardLines {
		got, ok := parseGuardLine([]byte(line))
		if got != want[i] || ok != (want[i].kind != "") {
			t.Errorf("line %d: %+v %v, want %+v", i, got, ok, want[i])
		}
	}
}

func FuzzParseGuardLine(f *testing.F) {
	for _, l := range guardLines {
		f.Add([]byte(l))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, ok := parseGuardLine(b)
		if !ok && ev != (guardEvent{}) {
			t.Fatalf("not an event but %+v", ev)
		}
	})
}

func TestParseProcsFile(t *testing.T) {
	if got := parseProcsFile([]byte("0 1073741824\n1 2147483648\n")); got != 3<<30 {
		t.Fatalf("sum %d, want 3 GiB", got)
	}
	if got := parseProcsFile([]byte("garbage\n0 -5\n0 12 extra\n\n0 7")); got != 7 {
		t.Fatalf("sum of a damaged file %d, want 7", got)
	}
}

func FuzzParseProcsFile(f *testing.F) {
	f.Add([]byte("0 1073741824\n"))
	f.Add([]byte("0 1\n1 9223372036854775807\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n := parseProcsFile(b); n < 0 {
			t.Fatalf("negative sum %d", n)
		}
	})
}

var statLines = []string{
	"1234 (fakevllm) S 1 1234 1234 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 6 0 98765 1 1 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0",
	"77 (VLLM::Engine Core) ) Z 12 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 0 0",
}

func TestParseStat(t *testing.T) {
	ppid, state, start, ok := parseStat([]byte(statLines[0]))
	if !ok || ppid != 1 || state != 'S' || start != 98765 {
		t.Fatalf("got ppid=%d state=%c start=%d ok=%v", ppid, state, start, ok)
	}
	ppid, state, start, ok = parseStat([]byte(statLines[1]))
	if !ok || ppid != 12 || state != 'Z' || start != 555 {
		t.Fatalf("name with ') ': ppid=%d state=%c start=%d ok=%v", ppid, state, start, ok)
	}
	if _, _, _, ok := parseStat([]byte("12 (x) S 1")); ok {
		t.Fatal("short stat accepted")
	}
}

func FuzzParseStat(f *testing.F) {
	for _, l := range statLines {
		f.Add([]byte(l))
	}
	f.Fuzz(func(t *testing.T, b []byte) { parseStat(b) })
}

func TestMetricValueAndEnvValue(t *testing.T) {
	text := "# HELP x\nfakevllm_true_safe_max_num_seqsX 1\nfakevllm_true_safe_max_num_seqs{model_name=\"m\"} 244\n"
	if v, ok := metricValue(text, "fakevllm_true_safe_max_num_seqs"); !ok || v != 244 {
		t.Fatalf("metric %v %v, want 244", v, ok)
	}
	if _, ok := metricValue("other 1\n", "fakevllm_true_safe_max_num_seqs"); ok {
		t.Fatal("absent metric found")
	}
	env := []byte("A=1\x00STORM_RUN=leak-guard-1\x00STORM_RUNX=no\x00")
	if got := envValue(env, tagVar); got != "leak-guard-1" {
		t.Fatalf("tag %q", got)
	}
}

func FuzzMetricValue(f *testing.F) {
	f.Add("fakevllm_true_safe_max_num_seqs 12\n")
	f.Add("fakevllm_true_safe_max_num_seqs{a=\"b\"} NaN\n")
	f.Fuzz(func(t *testing.T, s string) { metricValue(s, "fakevllm_true_safe_max_num_seqs") })
}

// The process table finds a run's tree whoever the parents are.
func TestProcTableDescendsAndYoungestChild(t *testing.T) {
	tab := procTable{
		10: {pid: 10, ppid: 1},
		11: {pid: 11, ppid: 10, start: 5},
		12: {pid: 12, ppid: 10, start: 9},
		13: {pid: 13, ppid: 12, tag: "r"},
		14: {pid: 14, ppid: 1, tag: "r"}, // an orphan, reparented to init
	}
	if !tab.descends(13, 10) || tab.descends(14, 10) || tab.descends(13, 0) {
		t.Fatal("descends")
	}
	if got := tab.youngestChild(10); got != 12 {
		t.Fatalf("youngest child %d, want 12", got)
	}
	if n := len(tab.tagged("r")); n != 2 {
		t.Fatalf("%d tagged, want 2", n)
	}
}

// Every duration of the simulator is scaled; rates scale the other way.
func TestSimEnvScales(t *testing.T) {
	var leak, over Scenario
	for _, sc := range scenarios() {
		switch sc.Name {
		case "leak":
			leak = sc
		case "oversubscription":
			over = sc
		}
	}
	env := over.simEnv(0.05, "/g", "/m")
	if env["FAKEVLLM_LOAD_WEIGHTS"] != "1.5s" || env["FAKEVLLM_BACKGROUND_AFTER"] != "1.5s" || env["FAKEVLLM_ORPHAN_TTL"] != "3m0s" {
		t.Fatalf("scaled env %v", env)
	}
	if _, ok := env["FAKEVLLM_FAULT_MARKER"]; ok {
		t.Fatal("marker set for a scenario without a one-shot fault")
	}
	if got := leak.simEnv(0.05, "/g", "/m")["FAKEVLLM_LEAK_MIB_PER_S"]; got != "800" {
		t.Fatalf("leak %s MiB/s real, want 800 (40 per scenario second at 0.05)", got)
	}
	if s := Scale(0.05); s.Back(s.D(time.Minute)) != time.Minute {
		t.Fatal("Back is not the inverse of D")
	}
}

// The guard's config for every scenario passes the guard's own strict loader.
func TestGuardConfigLoads(t *testing.T) {
	dir := t.TempDir()
	for _, sc := range scenarios() {
		r := &run{sc: sc, sup: supGuard, s: 0.05, dir: dir, gpuDir: filepath.Join(dir, "gpu"), port: 18000, tag: "t",
			bins: bins{fakevllm: "/bin/fakevllm"}}
		path := filepath.Join(dir, sc.Name+".toml")
		if err := os.WriteFile(path, []byte(r.guardConfig()), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatalf("%s: %v", sc.Name, err)
		}
		if cfg.Restart.InitialDelay.Duration != 250*time.Millisecond || cfg.GPU.PredictHorizon.Duration != 30*time.Second ||
			cfg.Liveness.Interval.Duration != 500*time.Millisecond || cfg.Readiness.StallTimeout.Duration != 30*time.Second {
			t.Errorf("%s: durations not scaled: %+v %+v", sc.Name, cfg.Restart, cfg.GPU)
		}
		if cfg.VLLM.Env[tagVar] != "t" || !strings.HasSuffix(cfg.VLLM.Command[0], "fakevllm") {
			t.Errorf("%s: command %v env %v", sc.Name, cfg.VLLM.Command, cfg.VLLM.Env)
		}
	}
}
