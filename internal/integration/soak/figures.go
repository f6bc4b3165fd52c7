// How the soak fails vLLM and what it measures: each failure injected, the
// figures at start and end (orphans, goroutines, open fds, RSS), what the
// guard made of the failures, and the report.

package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/procmark"
)

type figures struct {
	goroutines, fds, rss float64
	fdKinds              map[string]int // what the guard's fds point at, by kind
}

type report struct {
	failures, warmup      int
	failed, incidents     int
	incidentFiles         int
	kinds, causes         map[string]int
	rungMismatches        []string
	orphans               []string
	start, end            figures
	exitCode              int
	completions, clientEr int64
	restarts              int   // planned restarts through the proxy
	restartOK, restartErr int64 // client requests through the proxy meanwhile
	elapsed               time.Duration
}

func (r *report) print(w io.Writer) int {
	growth := (r.end.rss - r.start.rss) / r.start.rss * 100
	fmt.Fprintf(w, "soak: %d failures injected in %s (start figures after %d)\n", r.failures, r.elapsed.Round(time.Second), r.warmup)
	fmt.Fprintf(w, "  kinds injected:    %v\n", r.kinds)
	fmt.Fprintf(w, "  kind→cause:        %v\n", r.causes)
	fmt.Fprintf(w, "  client load:       %d completions answered, %d refused or cut (restarts)\n", r.completions, r.clientEr)
	fmt.Fprintf(w, "  planned restarts:  %d under load through the proxy: %d requests answered, %d errors\n", r.restarts, r.restartOK, r.restartErr)
	fmt.Fprintf(w, "  exit events:       %d\n", r.failed)
	fmt.Fprintf(w, "  incidents:         %d recorded, %d files\n", r.incidents, r.incidentFiles)
	fmt.Fprintf(w, "  rung mismatches:   %d\n", len(r.rungMismatches))
	fmt.Fprintf(w, "  orphans:           %d\n", len(r.orphans))
	fmt.Fprintf(w, "  goroutines:        %.0f → %.0f\n", r.start.goroutines, r.end.goroutines)
	fmt.Fprintf(w, "  open fds:          %.0f → %.0f (%v → %v)\n", r.start.fds, r.end.fds, r.start.fdKinds, r.end.fdKinds)
	fmt.Fprintf(w, "  RSS:               %.1f MB → %.1f MB (%+.1f %%)\n", r.start.rss/1e6, r.end.rss/1e6, growth)
	fmt.Fprintf(w, "  guard exit code:   %d\n", r.exitCode)
	var missed []string
	check := func(ok bool, what string) {
		if !ok {
			missed = append(missed, what)
		}
	}
	check(len(r.orphans) == 0, fmt.Sprintf("orphans left: %v", r.orphans))
	check(r.end.goroutines <= r.start.goroutines, "goroutines grew")
	check(r.end.fds <= r.start.fds, "open fds grew")
	check(growth <= 10, "RSS grew more than 10 %")
	check(r.failed == r.failures, fmt.Sprintf("%d exit events for %d injected failures", r.failed, r.failures))
	check(r.incidents == r.failures, fmt.Sprintf("%d incidents recorded for %d failures", r.incidents, r.failures))
	check(r.incidentFiles == min(r.failures, 200), fmt.Sprintf("%d incident files (at most 200 are kept)", r.incidentFiles))
	check(len(r.rungMismatches) == 0, "launches off the chosen rung: "+strings.Join(r.rungMismatches, "; "))
	check(r.exitCode == 0, "the guard did not exit 0 on SIGTERM")
	check(r.completions > 0, "the client load got no answer at all")
	check(r.restartErr == 0, fmt.Sprintf("%d client errors through the proxy during planned restarts", r.restartErr))
	check(r.restarts == 0 || r.restartOK > 0, "no client request answered through the proxy during planned restarts")
	if len(missed) > 0 {
		fmt.Fprintf(w, "verdict: FAIL\n  - %s\n", strings.Join(missed, "\n  - "))
		return 1
	}
	fmt.Fprintln(w, "verdict: PASS")
	return 0
}

// rungMismatches pairs each exit event with the next starting event.
func rungMismatches(g *guard) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	want := -1
	n := 0
	for _, e := range g.evs {
		switch e.Kind {
		case events.KindExited:
			n++
			want = e.Failure.Decision.Rung.Index
		case events.KindStarting:
			if want >= 0 && (e.Rung == nil || e.Rung.Index != want) {
				got := -1
				if e.Rung != nil {
					got = e.Rung.Index
				}
				out = append(out, fmt.Sprintf("failure %d chose rung %d, launched on %d", n, want, got))
			}
			want = -1
		}
	}
	return out
}

// sample reads goroutines, open fds and RSS from the guard's /metrics, the
// least of five scrapes 100 ms apart (a scrape in flight adds goroutines).
func sample(url string) (figures, error) {
	best := figures{goroutines: -1}
	for range 5 {
		resp, err := http.Get(url)
		if err != nil {
			return best, fmt.Errorf("scrape %s: %w", url, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return best, err
		}
		f := figures{goroutines: metric(b, "go_goroutines"), fds: metric(b, "process_open_fds"), rss: metric(b, "process_resident_memory_bytes")}
		if f.goroutines < 0 || f.fds < 0 || f.rss < 0 {
			return best, fmt.Errorf("%s lacks go_goroutines, process_open_fds or process_resident_memory_bytes", url)
		}
		if best.goroutines < 0 {
			best = f
		}
		best = figures{goroutines: min(best.goroutines, f.goroutines), fds: min(best.fds, f.fds), rss: min(best.rss, f.rss)}
		time.Sleep(100 * time.Millisecond)
	}
	return best, nil
}

// fdKinds counts the guard's open fds by what they point at ("socket",
// "pipe", "anon_inode", a path's folder), to tell a leak's source.
func fdKinds(pid int) map[string]int {
	out := map[string]int{}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		kind, _, _ := strings.Cut(target, ":")
		if kind == "anon_inode" {
			kind = target
		}
		if strings.HasPrefix(target, "/") {
			kind = filepath.Dir(target)
		}
		out[kind]++
	}
	return out
}

func metric(scrape []byte, name string) float64 {
	for _, l := range strings.Split(string(scrape), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// ours lists the live (not zombie) processes of this soak's vLLM trees.
func ours(testID string) []int {
	out := procmark.Live("FAKEVLLM_TEST_ID=" + testID)
	slices.Sort(out)
	return out
}

// role finds the API server ("serve") or EngineCore of the running tree.
func role(testID, which string) (int, error) {
	for _, p := range ours(testID) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		args := strings.Split(string(b), "\x00")
		engine := strings.HasPrefix(args[0], "VLLM::EngineCore")
		// The guard's keeper carries vLLM's environment and argv too.
		api := filepath.Base(args[0]) == "fakevllm" && len(args) > 1 && args[1] == "serve"
		if (which == "engine" && engine) || (which == "api" && api) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no %s process among %v", which, ours(testID))
}

func inject(kind, testID string, port int) error {
	switch kind {
	case "sigkill", "segv", "sigstop":
		pid, err := role(testID, "api")
		if err != nil {
			return err
		}
		sig := map[string]syscall.Signal{"sigkill": syscall.SIGKILL, "segv": syscall.SIGSEGV, "sigstop": syscall.SIGSTOP}[kind]
		return syscall.Kill(pid, sig)
	case "engine_kill":
		pid, err := role(testID, "engine")
		if err != nil {
			return err
		}
		return syscall.Kill(pid, syscall.SIGKILL)
	case "oom":
		// One prompt of ~30000 tokens (4 characters each) admitted at once.
		body := fmt.Sprintf(`{"model":"soak-model","prompt":%q,"max_tokens":1}`, strings.Repeat("abcd", 30000))
		go func() {
			hc := &http.Client{Timeout: 10 * time.Second}
			resp, err := hc.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/completions", port), "application/json", strings.NewReader(body))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		return nil
	}
	return fmt.Errorf("unknown failure kind %q", kind)
}
