// Command admission is the admission benchmark (`make bench-admission`):
// more streaming clients than vLLM's memory holds, against three fronts —
// vLLM itself, nginx with limit_conn at max_num_seqs, and the guard's
// proxy — in two shapes: a ramp (0 → N clients over 30 s, then held) and
// a burst (N at once after a warm-up). vLLM is the project's simulator
// over the stand-in NVML, set up as the integration tests' admission scene
// (integration/admission_test.go): a request of 2 000 prompt tokens costs
// 100 MiB + 2 000 × 16 KiB, so 118 run safely and the 119th runs vLLM out
// of memory; N is 200. Under the guard, vLLM is the guard's child; for the
// other two fronts a plain restarter here starts it again 100 ms after
// each exit (systemd's Restart=always with its default RestartSec), with
// the same command line.
//
// Per run it reports vLLM's OOMs, streams cut, requests refused (429, 503,
// 413; those without Retry-After apart), requests failed (no answer, other
// statuses), goodput (tokens/s of completed requests), p50/p99 time to
// first token, vLLM's running requests, and for the guard the concurrency
// its proxy admits at steady state against the true safe 118. It prints a
// Markdown table and the guard's goals, writes results.json, and exits 1
// when the guard misses a goal (2 when it could not run).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/bench/fronts"
	"github.com/vllm-guard/vllm-guard/internal/benchnginx"
)

// The scene's arithmetic, on the 80 GiB device (512 MiB reserved) with the
// API process's 256 MiB at utilization 0.8: 15 616 MiB above vLLM's budget.
const (
	seqMiB        = 100
	tokenKiB      = 16
	promptTokens  = 2000
	maxTokens     = 10
	tokenInterval = 100 * time.Millisecond // a request streams for about a second
	deviceMiB     = 81920
	reservedMiB   = 512
	apiMiB        = 256
	trueSafe      = (deviceMiB - reservedMiB - apiMiB - int(util*deviceMiB)) * 1024 / (seqMiB*1024 + promptTokens*tokenKiB) // 118
)

type bins = fronts.Bins

type options struct {
	clients, warmClients int
	maxTokens            int
	ramp, hold, burst    time.Duration
	warmStep, warmMax    time.Duration
	samples              []time.Duration // the guard runs once per sampling interval
	fronts, shapes       []string
	drain                time.Duration
}

func main() { os.Exit(realMain(os.Args[1:])) }

func realMain(args []string) int {
	fs := flag.NewFlagSet("admission", flag.ContinueOnError)
	guard := fs.String("guard", "bin/vllm-guard", "vllm-guard binary (`make build`)")
	sim := fs.String("fakevllm", "bin/fakevllm", "vLLM simulator binary (`make build`)")
	lib := fs.String("nvml-lib", "build/lib", "folder holding the stand-in libnvidia-ml.so.1 (`make build`)")
	nginx := fs.String("nginx", "", "nginx binary (default: nginx on PATH, else /usr/sbin/nginx)")
	var o options
	fs.IntVar(&o.clients, "clients", 200, "N: clients of the ramp and of the burst (the true safe concurrency is 118)")
	fs.DurationVar(&o.ramp, "ramp", 30*time.Second, "the ramp: 0 → N clients over this long")
	fs.DurationVar(&o.hold, "hold", 45*time.Second, "then all N held this long (steady state: its second half)")
	fs.DurationVar(&o.burst, "burst", 30*time.Second, "the burst: N clients at once, held this long (steady state: its second half)")
	fs.IntVar(&o.warmClients, "warmup-clients", 60, "the burst's warm-up: this many clients, in 6 steps")
	fs.DurationVar(&o.warmStep, "warmup-step", 0, "length of one warm-up step (default: 1s; under the guard 6 GPU sampling intervals, at least 1s: two settled samples or more at each level)")
	fs.DurationVar(&o.warmMax, "warmup-max", 60*time.Second, "under the guard the warm-up goes on until its cost model bounds the proxy by memory, at most this long")
	fs.IntVar(&o.maxTokens, "max-tokens", maxTokens, "tokens per request (one per 100 ms)")
	samples := fs.String("sample-interval", "1s,100ms", "the guard's [gpu] sample_interval, comma-separated: the guard runs once per interval (1s is its default; 100ms the integration tests')")
	fronts := fs.String("fronts", "direct,nginx,guard", "comma-separated fronts: direct, nginx, guard")
	shapes := fs.String("shapes", "ramp,burst", "comma-separated shapes: ramp, burst")
	out := fs.String("json", "internal/bench/admission/results.json", "where to write the JSON results (\"\": nowhere)")
	keep := fs.Bool("keep", false, "keep the scratch folder (the guard's log, nginx's, the GPU state of every run)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o.drain = 40 * time.Second
	var err error
	if o.fronts, err = pickList(*fronts, []string{"direct", "nginx", "guard"}); err == nil {
		o.shapes, err = pickList(*shapes, []string{"ramp", "burst"})
	}
	for _, x := range strings.Split(*samples, ",") {
		d, perr := time.ParseDuration(strings.TrimSpace(x))
		if perr != nil || d < 10*time.Millisecond || d > 15*time.Second {
			err = fmt.Errorf("-sample-interval %q: want durations from 10ms to 15s, comma-separated", x)
			break
		}
		o.samples = append(o.samples, d)
	}
	if err == nil && (o.clients < 1 || o.warmClients < 6 || o.maxTokens < 1 || o.ramp <= 0 || o.hold <= 0 || o.burst <= 0) {
		err = fmt.Errorf("-clients, -max-tokens must be at least 1, -warmup-clients at least 6, -ramp, -hold and -burst positive")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-admission:", err)
		return 2
	}
	b, err := binaries(*guard, *sim, *lib, *nginx, slices.Contains(o.fronts, "nginx"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-admission:", err)
		return 2
	}
	scratch, err := os.MkdirTemp("", "vllm-guard-bench-admission-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-admission: scratch folder:", err)
		return 2
	}
	if *keep {
		fmt.Fprintln(os.Stderr, "bench-admission: run folders kept in", scratch)
	} else {
		defer os.RemoveAll(scratch)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	began := time.Now()
	var results []Result
	for _, shape := range o.shapes {
		for _, f := range o.fronts {
			samples := []time.Duration{0}
			if f == "guard" {
				samples = o.samples
			}
			for _, sample := range samples {
				if ctx.Err() != nil {
					break
				}
				t := time.Now()
				res := runOne(ctx, b, scratch, f, shape, sample, o)
				fmt.Fprintf(os.Stderr, "bench-admission: %-13s %-5s done in %3.0fs: %d OOMs, %d completed%s\n",
					res.label(), shape, time.Since(t).Seconds(), res.OOMs, res.Completed, errSuffix(res.Error))
				results = append(results, res)
			}
		}
	}
	rep := Report{Date: began.UTC().Format("2006-01-02 15:04 MST"), Command: command(args), Clients: o.clients,
		TrueSafe: trueSafe, MaxTokens: o.maxTokens, Ramp: o.ramp.String(), Hold: o.hold.String(), Burst: o.burst.String(),
		WarmupClients: o.warmClients, Results: results, WallS: time.Since(began).Round(time.Second).Seconds()}
	rep.Goals = goals(results)
	rep.markdown(os.Stdout)
	if *out != "" {
		data, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*out, append(data, '\n'), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "bench-admission: write the JSON results to %s: %v\n", *out, err)
			return 2
		}
	}
	switch {
	case ctx.Err() != nil:
		return 130
	case slices.ContainsFunc(results, func(r Result) bool { return r.Error != "" }):
		return 2
	case slices.ContainsFunc(rep.Goals, func(g Goal) bool { return !g.Met }):
		return 1
	}
	return 0
}

// label names the front in the table: the guard with its sampling interval.
func (r Result) label() string {
	if r.Sample != "" {
		return r.Front + " (" + r.Sample + ")"
	}
	return r.Front
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " (error: " + e + ")"
}

func pickList(s string, allowed []string) ([]string, error) {
	var out []string
	for _, x := range strings.Split(s, ",") {
		x = strings.TrimSpace(x)
		if x == "" {
			continue
		}
		if !slices.Contains(allowed, x) {
			return nil, fmt.Errorf("unknown %q; choose from %s", x, strings.Join(allowed, ","))
		}
		out = append(out, x)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("nothing to run: choose from %s", strings.Join(allowed, ","))
	}
	return out, nil
}

// command is how the benchmark was invoked, for the report.
func command(args []string) string {
	if c := os.Getenv("BENCH_ADMISSION_COMMAND"); c != "" {
		return c // scripts/bench-admission.sh says `make bench-admission`
	}
	return strings.TrimSpace("go run ./internal/bench/admission " + strings.Join(args, " "))
}

// binaries checks the built binaries and finds nginx.
func binaries(guard, sim, lib, nginx string, needNginx bool) (bins, error) {
	var b bins
	for _, p := range []struct {
		dst        *string
		path, file string
	}{{&b.Guard, guard, ""}, {&b.Fakevllm, sim, ""}, {&b.NvmlDir, lib, "libnvidia-ml.so.1"}} {
		abs, err := filepath.Abs(p.path)
		if err == nil {
			_, err = os.Stat(filepath.Join(abs, p.file))
		}
		if err != nil {
			return bins{}, fmt.Errorf("%s is missing: run `make build` first (make bench-admission does): %v", filepath.Join(p.path, p.file), err)
		}
		*p.dst = abs
	}
	if !needNginx {
		return b, nil
	}
	if nginx == "" {
		var err error
		if nginx, err = benchnginx.Find(); err != nil {
			return bins{}, fmt.Errorf("%v, or leave nginx out with -fronts direct,guard", err)
		}
	} else if _, err := os.Stat(nginx); err != nil {
		return bins{}, fmt.Errorf("-nginx %s: %v", nginx, err)
	}
	b.Nginx = nginx
	return b, nil
}

// Result is one (front, shape).
type Result struct {
	Front string `json:"front"`
	// Sample is the guard's GPU sampling interval (guard runs only).
	Sample string `json:"guard_sample_interval,omitempty"`
	Shape  string `json:"shape"`
	// Seconds is the measured phase: the ramp and its hold, or the burst
	// (the warm-up before it is not measured).
	Seconds float64 `json:"seconds"`
	OOMs    int     `json:"ooms"`
	Exits   int     `json:"vllm_exits"`
	Counts
	// vLLM's running requests: the median over the steady state (the
	// ramp's hold, the burst's second half) and the most at any time.
	RunningP50 int `json:"vllm_running_p50"`
	RunningMax int `json:"vllm_running_max"`
	// The burst's warm-up: how long, its OOMs, and whether the guard's cost
	// model bounded the proxy by memory at its end.
	WarmupS         float64 `json:"warmup_s,omitempty"`
	WarmupOOMs      int     `json:"warmup_ooms,omitempty"`
	WarmupConfident bool    `json:"warmup_confident,omitempty"`
	// Admitted is the guard's proxy at steady state.
	Admitted *Admitted `json:"admitted,omitempty"`
	Error    string    `json:"error,omitempty"`
}

// Admitted is what the guard's proxy let through at steady state.
type Admitted struct {
	InflightP50 int     `json:"inflight_p50"`
	InflightMax int     `json:"inflight_max"`
	Percent     float64 `json:"percent_of_true_safe"` // of the median
	Limit       int     `json:"limit"`
	Bound       string  `json:"bound"`
	Why         string  `json:"why"`
	Readings    int     `json:"readings"`
}

// sampler reads vLLM's running count (its /metrics) every 250 ms and, for
// the guard, the proxy's status every 500 ms, until stopped.
type sampler struct {
	once    sync.Once
	stopCh  chan struct{}
	done    chan struct{}
	running []timed[int]
	proxy   []timed[proxyStatus]
}

type timed[T any] struct {
	at time.Time
	v  T
}

func startSampler(f front, port int) *sampler {
	s := &sampler{stopCh: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-s.stopCh:
				return
			case <-tick.C:
			}
			if n, ok := vllmRunning(port); ok {
				s.running = append(s.running, timed[int]{time.Now(), n})
			}
			if i%2 == 0 {
				if st, ok := f.admitted(); ok {
					s.proxy = append(s.proxy, timed[proxyStatus]{time.Now(), st})
				}
			}
		}
	}()
	return s
}

func (s *sampler) stop() { s.once.Do(func() { close(s.stopCh) }); <-s.done }

// between is the values taken in [from, to].
func between[T any](xs []timed[T], from, to time.Time) []T {
	var out []T
	for _, x := range xs {
		if !x.at.Before(from) && !x.at.After(to) {
			out = append(out, x.v)
		}
	}
	return out
}

func medianInt(xs []int) int {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// runOne runs one front in one shape, from a fresh simulator and GPU state
// (and a guard with no saved state).
func runOne(ctx context.Context, b bins, scratch, frontName, shape string, sample time.Duration, o options) (res Result) {
	res = Result{Front: frontName, Shape: shape}
	name := frontName + "-" + shape
	warmStep := o.warmStep
	if sample > 0 {
		res.Sample = sample.String()
		name += "-" + sample.String()
		if warmStep == 0 {
			warmStep = max(6*sample, time.Second)
		}
	}
	if warmStep == 0 {
		warmStep = time.Second
	}
	e, err := newRunEnv(b, scratch, name, sample)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer func() {
		if n := fronts.KillTagged(e.Tag); n > 0 && res.Error == "" {
			res.Error = fmt.Sprintf("%d simulator processes outlived the run (killed)", n)
		}
	}()
	e.setVLLM(model, "--max-num-seqs", fmt.Sprint(maxNumSeqs), "--gpu-memory-utilization", fmt.Sprint(util))
	var f front
	switch frontName {
	case "direct":
		f, err = startDirect(ctx, e)
	case "nginx":
		f, err = startNginx(ctx, e)
	case "guard":
		f, err = startGuard(ctx, e)
	}
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer f.Stop()
	body := requestBody(model, promptTokens, o.maxTokens)
	smp := startSampler(f, e.Port)
	defer smp.stop()
	var l *load
	var t0, t1, steady time.Time
	switch shape {
	case "ramp":
		l = newLoad(f.URL(), body, o.clients)
		t0 = time.Now()
		go l.start(o.clients, o.ramp)
		steady = t0.Add(o.ramp + o.hold/2)
		wait(ctx, o.ramp+o.hold)
	case "burst":
		warmT0 := time.Now()
		warm := newLoad(f.URL(), body, o.warmClients)
		// Six steps. Each step's clients arrive over its first half (at
		// most a second), not in one instant: clients that start together
		// with requests of equal length stay in lockstep, all their
		// requests ending in the same millisecond, as no real traffic does.
		step := o.warmClients / 6
		for i := 1; i <= 6 && ctx.Err() == nil; i++ {
			n := step
			if i == 6 {
				n = o.warmClients - 5*step
			}
			began := time.Now()
			warm.start(n, min(warmStep/2, time.Second))
			wait(ctx, warmStep-time.Since(began))
		}
		if frontName == "guard" {
			deadline := warmT0.Add(o.warmMax)
			for !f.confident() && time.Now().Before(deadline) && ctx.Err() == nil {
				wait(ctx, 200*time.Millisecond)
			}
			res.WarmupConfident = f.confident()
		}
		warm.stop(drain(ctx, o.drain))
		res.WarmupS = time.Since(warmT0).Round(100 * time.Millisecond).Seconds()
		_, res.WarmupOOMs = f.vllmExits()
		l = newLoad(f.URL(), body, o.clients)
		t0 = time.Now()
		l.start(o.clients, 0)
		steady = t0.Add(o.burst / 2)
		wait(ctx, o.burst)
	}
	t1 = time.Now()
	l.stop(drain(ctx, o.drain))
	exits, ooms := f.vllmExits()
	res.Seconds = t1.Sub(t0).Round(100 * time.Millisecond).Seconds()
	res.Exits, res.OOMs = exits, ooms-res.WarmupOOMs
	res.Counts = count(l.records(), t0, t1)
	smp.stop()
	res.RunningP50 = medianInt(between(smp.running, steady, t1))
	if all := between(smp.running, t0, t1); len(all) > 0 {
		res.RunningMax = slices.Max(all)
	}
	if sts := between(smp.proxy, steady, t1); len(sts) > 0 {
		var infl []int
		for _, st := range sts {
			infl = append(infl, st.Inflight)
		}
		last := sts[len(sts)-1]
		a := &Admitted{InflightP50: medianInt(infl), InflightMax: slices.Max(infl), Limit: last.Limit, Bound: last.Bound, Why: last.Why, Readings: len(sts)}
		a.Percent = float64(a.InflightP50) * 100 / float64(trueSafe)
		res.Admitted = a
	}
	if ctx.Err() != nil {
		res.Error = "interrupted"
	}
	return res
}

// drain is how long the requests in flight may finish: none once the
// benchmark is interrupted.
func drain(ctx context.Context, d time.Duration) time.Duration {
	if ctx.Err() != nil {
		return 0
	}
	return d
}

func wait(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// vllmRunning reads vllm:num_requests_running from the simulator.
func vllmRunning(port int) (int, bool) {
	m, err := scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return 0, false
	}
	v, ok := m["vllm:num_requests_running"]
	return int(v), ok
}
