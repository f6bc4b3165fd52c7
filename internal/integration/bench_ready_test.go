package integration

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// standIn is the http.server stand-in for vLLM (testdata/httpserver_vllm.py).
func standIn(b *testing.B) string {
	p, err := filepath.Abs(filepath.Join("testdata", "httpserver_vllm.py"))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// standInTimes reads the stand-in's STANDIN_LISTEN_FILE: when each start
// listened, and when it wrote its first completion.
func standInTimes(b *testing.B, path string) (listens, answers []time.Time) {
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		what, at, _ := strings.Cut(line, " ")
		s, err := strconv.ParseFloat(at, 64)
		if err != nil {
			b.Fatalf("listen file %s: %q", path, line)
		}
		t := time.Unix(0, int64(s*1e9))
		switch what {
		case "listen":
			listens = append(listens, t)
		case "answered":
			answers = append(answers, t)
		}
	}
	return listens, answers
}

// lastBefore is the last of ts at or before t (zero when none).
func lastBefore(ts []time.Time, t time.Time) time.Time {
	var last time.Time
	for _, x := range ts {
		if !x.After(t) {
			last = x
		}
	}
	return last
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// slowFsync wraps the guard in strace so that each of its fsyncs takes us
// microseconds longer: a slow or network disk, as some hosts have.
func slowFsync(b *testing.B, guard, us string) string {
	if _, err := exec.LookPath("strace"); err != nil {
		b.Fatal("BENCH_FSYNC_DELAY_US needs strace: ", err)
	}
	w := filepath.Join(b.TempDir(), "guard-slow-fsync")
	script := fmt.Sprintf("#!/bin/sh\nexec strace -f -qq --seccomp-bpf -e trace=fsync,fdatasync -e inject=fsync,fdatasync:delay_exit=%s -o /dev/null %q \"$@\"\n", us, guard)
	if err := os.WriteFile(w, []byte(script), 0o755); err != nil {
		b.Fatal(err)
	}
	return w
}

// BenchmarkReadinessLikeAPlainClient: on a vLLM stand-in served by
// Python's http.server (uvicorn's three startup lines in one write to
// stderr, then it listens; HTTP/1.0, headers and body in separate writes;
// /health, /v1/models and a 1-token completion take about 17 ms
// together), how long after it listens a plain client polling a completion
// every 1 ms gets its first answer, and how long until the guard says
// ready (its default "auto" probe: health, models, a 1-token completion),
// over 10 starts each, and how long after the stand-in wrote the probe's
// completion the guard published ready. Goal: the guard within a few ms of
// the plain client (its chain asks two more questions first).
// BENCH_FSYNC_DELAY_US=40000 makes each of the guard's fsyncs 40 ms slower
// (through strace): READY must not wait on the state file.
func BenchmarkReadinessLikeAPlainClient(b *testing.B) {
	if _, err := exec.LookPath("python3"); err != nil {
		b.Fatal("python3 runs the stand-in: ", err)
	}
	script := standIn(b)
	const starts = 10

	// The plain client: a fresh connection per try, as a script would.
	plain := make([]float64, 0, starts)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	for i := range starts {
		port := testkit.FreePort(b)
		lf := filepath.Join(b.TempDir(), "listen")
		cmd := exec.Command("python3", script, "serve", "test-model", "--port", strconv.Itoa(port))
		cmd.Env = append(os.Environ(), "STANDIN_LISTEN_FILE="+lf)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		url := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", port)
		deadline := time.Now().Add(30 * time.Second)
		var got time.Time
		for time.Now().Before(deadline) {
			resp, err := client.Post(url, "application/json", strings.NewReader(`{"model":"test-model","prompt":"hi","max_tokens":1}`))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					got = time.Now()
					break
				}
			}
			time.Sleep(time.Millisecond) // not a wait: the measured client's polling cadence (a client polling every ms)
		}
		cmd.Process.Kill()
		cmd.Wait()
		if got.IsZero() {
			b.Fatalf("start %d: no completion in 30 s", i)
		}
		listens, _ := standInTimes(b, lf)
		plain = append(plain, float64(got.Sub(listens[0]))/float64(time.Millisecond))
	}

	// The guard, over the same stand-in (it exits 300 ms after its first
	// completion, and the guard starts it again).
	s := plainScene(b)
	if us := os.Getenv("BENCH_FSYNC_DELAY_US"); us != "" {
		s.guardBin = slowFsync(b, s.guardBin, us)
	}
	lf := filepath.Join(s.dir, "listen")
	s.command = fmt.Sprintf("[\"python3\", %q, \"serve\", \"test-model\"]", script)
	s.env = map[string]string{"STANDIN_LISTEN_FILE": lf, "STANDIN_EXIT_AFTER": "0.3"}
	s.extra = "\n[restart]\ninitial_delay = \"50ms\"\nmax_delay = \"50ms\"\ngive_up_after = 100"
	s.start()
	s.WaitEvent("10 readies", starts, 120*time.Second, isReady)
	listens, answers := standInTimes(b, lf)
	var guard, after []float64
	for _, e := range s.Events() {
		if !isReady(e) {
			continue
		}
		l := lastBefore(listens, e.Time)
		if !l.IsZero() {
			guard = append(guard, float64(e.Time.Sub(l))/float64(time.Millisecond))
		}
		// This start's answer: the first after its listen (its line may
		// be written after the guard's ready).
		if i := slices.IndexFunc(answers, func(a time.Time) bool { return a.After(l) }); !l.IsZero() && i >= 0 {
			after = append(after, float64(e.Time.Sub(answers[i]))/float64(time.Millisecond))
		}
	}
	if len(guard) == 0 {
		b.Fatal("no listen paired with a ready event")
	}
	b.ReportMetric(median(plain), "ms-plain-median")
	b.ReportMetric(slices.Max(plain), "ms-plain-max")
	b.ReportMetric(median(guard), "ms-guard-median")
	b.ReportMetric(slices.Max(guard), "ms-guard-max")
	b.ReportMetric(median(after), "ms-ready-after-answer-median")
}
