// Command storm is the restart-storm benchmark (`make bench-storm`): the
// same failing vLLM (the simulator, over the stand-in NVML library) under
// vllm-guard and under faithful small re-creations of systemd, the kubelet
// and supervisord, time-scaled, concurrently, each run in its own port,
// GPU state folder and process tag. It owns the scenario definitions, the
// baselines' restart semantics, the measurements and the report: a
// Markdown table on stdout and results.json.
package main

import (
	"context"
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

	"github.com/vllm-guard/vllm-guard/internal/testbin"
)

func main() { os.Exit(realMain(os.Args[1:])) }

func realMain(args []string) int {
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	scale := fs.Float64("scale", 0.05, "scenario time × scale = real time (0.05: 20 scenario minutes run in 1)")
	conc := fs.Int("concurrency", 6, "runs at a time")
	out := fs.String("json", "internal/bench/storm/results.json", "where to write the JSON results")
	guard := fs.String("guard", "", "vllm-guard binary (default: build it)")
	sim := fs.String("fakevllm", "", "vLLM simulator binary (default: build it)")
	lib := fs.String("nvml-lib", "", "folder holding the stand-in libnvidia-ml.so.1 (default: build it)")
	only := fs.String("scenarios", "", "comma-separated scenario names (default: all)")
	sups := fs.String("supervisors", "", "comma-separated supervisors (default: all: "+strings.Join(supervisors, ",")+")")
	keep := fs.Bool("keep", false, "keep the scratch folder (logs of every run)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *scale <= 0 || *scale > 1 || *conc < 1 {
		fmt.Fprintln(os.Stderr, "storm: -scale must be in (0, 1] and -concurrency at least 1")
		return 2
	}
	s := Scale(*scale)
	b, cleanup, err := binaries(*guard, *sim, *lib)
	defer cleanup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	scs, err := pick(scenarios(), *only)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	who := supervisors
	if *sups != "" {
		who = strings.Split(*sups, ",")
		for _, w := range who {
			if !slices.Contains(supervisors, w) {
				fmt.Fprintf(os.Stderr, "storm: unknown supervisor %q; choose from %s\n", w, strings.Join(supervisors, ","))
				return 2
			}
		}
	}
	scratch, err := os.MkdirTemp("", "vllm-guard-storm-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "storm: scratch folder:", err)
		return 1
	}
	if *keep {
		fmt.Fprintln(os.Stderr, "storm: run folders (logs) kept in", scratch)
	} else {
		defer os.RemoveAll(scratch)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	began := time.Now()
	fmt.Fprintf(os.Stderr, "storm: %d runs, %d at a time, scale %g (1 scenario minute = %s real)\n",
		len(scs)*len(who), *conc, *scale, s.D(time.Minute))
	results, err := matrix(ctx, scs, who, s, b, scratch, *conc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	order(results, scs)
	rep := Report{Date: began.UTC().Format("2006-01-02 15:04 MST"), Command: command(args), Scale: *scale,
		Scenarios: scs, Results: results, Goals: goals(results), WallS: time.Since(began).Round(time.Second).Seconds()}
	rep.markdown(os.Stdout)
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fmt.Fprintf(os.Stderr, "storm: write the JSON results to %s: %v\n", *out, err)
			return 1
		}
		defer f.Close()
		if err := rep.json(f); err != nil {
			fmt.Fprintf(os.Stderr, "storm: write the JSON results to %s: %v\n", *out, err)
			return 1
		}
	}
	if ctx.Err() != nil {
		return 130
	}
	return 0
}

// command is how the benchmark was invoked, for the report.
func command(args []string) string {
	if c := os.Getenv("STORM_COMMAND"); c != "" {
		return c // scripts/bench-storm.sh says `make bench-storm`
	}
	return strings.TrimSpace("go run ./internal/bench/storm " + strings.Join(args, " "))
}

// binaries takes the given paths or builds the real binaries.
func binaries(guard, sim, lib string) (bins, func(), error) {
	cleanup := func() {}
	var err error
	if guard == "" || sim == "" || lib == "" {
		cleanup = testbin.Cleanup
	}
	if guard == "" {
		if guard, err = testbin.GuardPlain(); err != nil {
			return bins{}, cleanup, err
		}
	}
	if sim == "" {
		if sim, err = testbin.FakeVLLM(); err != nil {
			return bins{}, cleanup, err
		}
	}
	if lib == "" {
		if lib, err = testbin.FakeNVML(); err != nil {
			return bins{}, cleanup, err
		}
	}
	b := bins{}
	for _, p := range []struct {
		dst  *string
		path string
	}{{&b.guard, guard}, {&b.fakevllm, sim}, {&b.nvmlDir, lib}} {
		abs, err := filepath.Abs(p.path)
		if err != nil {
			return bins{}, cleanup, err
		}
		if _, err := os.Stat(abs); err != nil {
			return bins{}, cleanup, fmt.Errorf("storm: %s: %w (run `make build` or leave the flag out to build it)", abs, err)
		}
		*p.dst = abs
	}
	if _, err := os.Stat(filepath.Join(b.nvmlDir, "libnvidia-ml.so.1")); err != nil {
		return bins{}, cleanup, fmt.Errorf("storm: no libnvidia-ml.so.1 in %s: point -nvml-lib at build/lib after `make build`", b.nvmlDir)
	}
	return b, cleanup, nil
}

func pick(all []Scenario, only string) ([]Scenario, error) {
	if only == "" {
		return all, nil
	}
	var out []Scenario
	for name := range strings.SplitSeq(only, ",") {
		i := slices.IndexFunc(all, func(sc Scenario) bool { return sc.Name == name })
		if i < 0 {
			var names []string
			for _, sc := range all {
				names = append(names, sc.Name)
			}
			return nil, fmt.Errorf("storm: unknown scenario %q; choose from %s", name, strings.Join(names, ","))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// matrix runs every (scenario × supervisor), conc at a time.
func matrix(ctx context.Context, scs []Scenario, who []string, s Scale, b bins, scratch string, conc int) ([]Result, error) {
	scan := newScanner()
	var runs []*run
	for _, sc := range scs {
		for _, sup := range who {
			r, err := newRun(sc, sup, s, b, scan, scratch)
			if err != nil {
				return nil, err
			}
			runs = append(runs, r)
		}
	}
	results := make([]Result, len(runs))
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			if ctx.Err() != nil {
				return
			}
			began := time.Now()
			results[i] = r.execute(ctx)
			fmt.Fprintf(os.Stderr, "storm: %-16s %-14s done in %4.0fs: %s\n", r.sc.Name, r.sup,
				time.Since(began).Seconds(), results[i].FinalState)
		})
	}
	wg.Wait()
	var done []Result
	for _, res := range results {
		if res.Scenario != "" {
			done = append(done, res)
		}
	}
	return done, nil
}
