// Command resume is the resume benchmark (`make bench-resume`): vLLM dies
// under a steady load of 64 concurrent greedy streams (completions and
// chat in turn), and each front is measured on what its clients saw. vLLM
// is the project's simulator over the stand-in NVML; two scenarios:
//
//   - oom: the simulator's runtime out of memory (NCCL's "Cuda failure 2
//     'out of memory'"), once, 5 s after the first ready;
//   - leak: memory that leaks from ready on until vLLM runs out of it, and
//     again after the restart: two deaths in a row.
//
// Four fronts, each over its own simulator: vLLM direct, started again
// after each exit as systemd's Restart=always does; nginx with its retry
// (proxy_next_upstream error timeout http_502 http_503) in front of that;
// the guard's proxy with [proxy] resume = false; the guard (resume on).
//
// Before the runs every request of the pool is sent once, not streamed,
// to a simulator that does not fail: its answer is the request's
// uninterrupted greedy output (the simulator is deterministic for
// temperature 0). Per death and front it reports the requests the death
// touched (in flight when vLLM's process exited, or ending within
// touchWindow before: the engine dies a moment before its API process),
// how many failed (no answer or a status other than 200), how many
// streams were cut (no data: [DONE], or an error event), the tokens
// repeated or missing against the uninterrupted output (checked, see
// compareTokens; missing counts in streams that ended with [DONE] and no
// error, a cut stream's loss is its cut), and the latency the death added
// to the touched requests that completed after vLLM's exit (their time
// less the median time of the run's untouched requests), p50 and p99. It prints a Markdown table, writes
// results.json, and exits 1 when the guard (resume on) has a failed
// request, a cut stream or a token repeated or missing (2 when it could
// not run).
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
	"syscall"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/bench/fronts"
	"github.com/vllm-guard/vllm-guard/internal/benchnginx"
)

const (
	clients        = 64
	maxTokens      = 48
	promptPool     = 256
	tokenInterval  = 20 * time.Millisecond // a stream lasts about a second
	loadWeights    = 2 * time.Second       // a restart takes about 2.5 s
	restartDelay   = 200 * time.Millisecond
	requestTimeout = 3 * time.Minute
	touchWindow    = 500 * time.Millisecond
)

type bins = fronts.Bins

// sampled: the requests are sampled (temperature 0.8, a seed for a third
// of them) and judged for consistency instead of against a reference.
var sampled bool

// streamInterval is the simulator's --stream-interval (-stream-interval).
var streamInterval = 1

// simArgs are the simulator's arguments after "serve <model>" beyond the
// rung's own.
func simArgs() []string {
	if streamInterval <= 1 {
		return nil
	}
	return []string{"--stream-interval", fmt.Sprint(streamInterval)}
}

// scenario is how vLLM dies.
type scenario struct {
	name   string
	deaths int // the run goes on until this many deaths, then settle
	sim    map[string]string
}

var scenarios = []scenario{
	{name: "oom", deaths: 1, sim: map[string]string{
		"FAKEVLLM_FAULT":        "nccl_oom_after=5s",
		"FAKEVLLM_FAULT_MARKER": "$DIR/oom-fired", // once: not again after the restart
	}},
	// About 4.8 GiB of room above the budget with 64 streams running: a
	// leak of 1 GiB/s runs vLLM out of memory about 5 s after each ready.
	{name: "leak", deaths: 2, sim: map[string]string{"FAKEVLLM_LEAK_MIB_PER_S": "1000"}},
}

var allFronts = []string{"direct", "nginx", "guard-noresume", "guard"}

func main() { os.Exit(realMain(os.Args[1:])) }

func realMain(args []string) int {
	fs := flag.NewFlagSet("resume", flag.ContinueOnError)
	guard := fs.String("guard", "bin/vllm-guard", "vllm-guard binary (`make build`)")
	sim := fs.String("fakevllm", "bin/fakevllm", "vLLM simulator binary (`make build`)")
	lib := fs.String("nvml-lib", "build/lib", "folder holding the stand-in libnvidia-ml.so.1 (`make build`)")
	nginx := fs.String("nginx", "", "nginx binary (default: nginx on PATH, else /usr/sbin/nginx)")
	fronts := fs.String("fronts", strings.Join(allFronts, ","), "comma-separated fronts: "+strings.Join(allFronts, ", "))
	scens := fs.String("scenarios", "oom,leak", "comma-separated scenarios: oom, leak")
	settle := fs.Duration("settle", 6*time.Second, "after the last death the load goes on this long")
	limit := fs.Duration("run-limit", 90*time.Second, "a run ends after this long even when vLLM did not die as often as the scenario wants")
	out := fs.String("json", "internal/bench/resume/results.json", "where to write the JSON results (\"\": nowhere)")
	keep := fs.Bool("keep", false, "keep the scratch folder (the guard's log, nginx's, the GPU state of every run)")
	fs.BoolVar(&sampled, "sampled", false, "sampled requests (temperature 0.8, a seed for a third; ids and usage asked): each answer checked for consistency — its text the detokenized ids, at most max_tokens, usage and finish_reason true")
	fs.IntVar(&streamInterval, "stream-interval", 1, "the simulator's --stream-interval: ids per streamed chunk (issue 40: several ids a chunk)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fl, err := pickList(*fronts, allFronts)
	var sl []string
	if err == nil {
		sl, err = pickList(*scens, []string{"oom", "leak"})
	}
	var b bins
	if err == nil {
		b, err = binaries(*guard, *sim, *lib, *nginx, slices.Contains(fl, "nginx"))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-resume:", err)
		return 2
	}
	scratch, err := os.MkdirTemp("", "vllm-guard-bench-resume-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-resume: scratch folder:", err)
		return 2
	}
	if *keep {
		fmt.Fprintln(os.Stderr, "bench-resume: run folders kept in", scratch)
	} else {
		defer os.RemoveAll(scratch)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	began := time.Now()
	ref, endRef, err := referenceRun(ctx, b, scratch)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-resume: the uninterrupted reference run:", err)
		return 2
	}
	defer endRef()
	var results []Result
	for _, sc := range scenarios {
		if !slices.Contains(sl, sc.name) {
			continue
		}
		for _, f := range fl {
			if ctx.Err() != nil {
				break
			}
			t := time.Now()
			res := runOne(ctx, b, scratch, sc, f, ref, *settle, *limit)
			fmt.Fprintf(os.Stderr, "bench-resume: %-5s %-15s done in %3.0fs: %d deaths, %d requests, %d failed, %d cut%s\n",
				sc.name, f, time.Since(t).Seconds(), len(res.Deaths), res.Total.Requests, res.Total.Failed, res.Total.Cut, errSuffix(res.Error))
			results = append(results, res)
		}
	}
	rep := Report{Date: began.UTC().Format("2006-01-02 15:04 MST"), Command: command(args), Clients: clients, MaxTokens: maxTokens, Sampled: sampled, StreamInterval: streamInterval,
		TokenInterval: tokenInterval.String(), Results: results, WallS: time.Since(began).Round(time.Second).Seconds()}
	rep.Goals = goals(results)
	rep.markdown(os.Stdout)
	if *out != "" {
		data, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*out, append(data, '\n'), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "bench-resume: write the JSON results to %s: %v\n", *out, err)
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

// referenceRun answers every request of the pool once, uninterrupted
// (greedy runs), and keeps that simulator for the checks' detokenizing
// until end is called.
func referenceRun(ctx context.Context, b bins, scratch string) (ref oracle, end func(), err error) {
	e, err := newRunEnv(b, scratch, "reference", map[string]string{"FAKEVLLM_TOKEN_INTERVAL": "1ms"})
	if err != nil {
		return oracle{}, nil, err
	}
	r, err := fronts.StartRestarter(ctx, e)
	if err != nil {
		return oracle{}, nil, err
	}
	end = func() { r.Stop(); fronts.KillTagged(e.Tag) }
	base := fmt.Sprintf("http://127.0.0.1:%d", e.Port)
	ref.base = base
	if !sampled {
		ref.answers, err = reference(ctx, base)
	}
	if err != nil {
		end()
		return oracle{}, nil, err
	}
	return ref, end, nil
}

// runOne is one (scenario, front): the load from vLLM's first ready until
// settle after the scenario's last death (or limit), then the requests in
// flight end.
func runOne(ctx context.Context, b bins, scratch string, sc scenario, frontName string, ref oracle, settle, limit time.Duration) (res Result) {
	res = Result{Scenario: sc.name, Front: frontName}
	e, err := newRunEnv(b, scratch, sc.name+"-"+frontName, sc.sim)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer func() {
		if n := fronts.KillTagged(e.Tag); n > 0 {
			fmt.Fprintf(os.Stderr, "bench-resume: %d simulator processes outlived the %s run; killed\n", n, frontName)
		}
	}()
	var f front
	switch frontName {
	case "direct":
		f, err = startDirect(ctx, e)
	case "nginx":
		f, err = startNginx(ctx, e)
	case "guard-noresume":
		f, err = startGuard(ctx, e, false)
	case "guard":
		f, err = startGuard(ctx, e, true)
	}
	if err != nil {
		res.Error = err.Error()
		return res
	}
	l := startLoad(f.URL(), clients)
	began := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	for {
		d := f.deaths()
		if len(d) >= sc.deaths && time.Since(d[sc.deaths-1]) >= settle || time.Since(began) >= limit || ctx.Err() != nil {
			break
		}
		<-tick.C
	}
	tick.Stop()
	recs := l.stop()
	deaths := f.deaths()
	res.Readies = f.readies()
	f.Stop()
	res.Seconds = time.Since(began).Round(100 * time.Millisecond).Seconds()
	analyse(&res, recs, deaths, sc.deaths, ref)
	if len(deaths) < sc.deaths {
		res.Error = fmt.Sprintf("vLLM died %d times in %s; the scenario wants %d", len(deaths), limit, sc.deaths)
	}
	return res
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

// command is how this run was asked for, for the report.
func command(args []string) string {
	if c := os.Getenv("BENCH_RESUME_COMMAND"); c != "" {
		return c
	}
	return strings.TrimSpace("go run ./internal/bench/resume " + strings.Join(args, " "))
}

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
			return bins{}, fmt.Errorf("%s is missing: run `make build` first (make bench-resume does): %v", filepath.Join(p.path, p.file), err)
		}
		*p.dst = abs
	}
	if !needNginx {
		return b, nil
	}
	if nginx == "" {
		var err error
		if nginx, err = benchnginx.Find(); err != nil {
			return bins{}, fmt.Errorf("%v, or leave nginx out with -fronts direct,guard-noresume,guard", err)
		}
	} else if _, err := os.Stat(nginx); err != nil {
		return bins{}, fmt.Errorf("-nginx %s: %v", nginx, err)
	}
	b.Nginx = nginx
	return b, nil
}
