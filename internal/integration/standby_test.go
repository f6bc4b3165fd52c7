package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// standbyScene is a guard with [standby] mode = "process" over two
// simulators: vLLM a on GPU 0 (the one the guard's monitor watches), the
// standby b on GPU 1, both reached by clients through the proxy only.
func standbyScene(t *testing.T) (s *scene, proxyURL string, standbyPort int) {
	s = quick(newScene(t))
	s.env["FAKEVLLM_ERA"] = "v1"
	s.env["FAKEVLLM_TOKEN_INTERVAL"] = "60ms" // 48 tokens: about 3 s a stream, well past the kill
	s.env["CUDA_VISIBLE_DEVICES"] = "0"
	s.writeDevices("GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3",
		"GPU-5e1f0000-0000-4000-8000-000000000002 85899345920 536870912 NVIDIA H100 80GB HBM3")
	proxyPort, standbyPort := testkit.FreePort(t), testkit.FreePort(t)
	s.httpListen = fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	s.extra = fmt.Sprintf(`
[restart]
initial_delay = "100ms"

[proxy]
listen = "127.0.0.1:%d"

[standby]
mode = "process"
port = %d
env = { CUDA_VISIBLE_DEVICES = "1" }
`, proxyPort, standbyPort)
	return s, fmt.Sprintf("http://127.0.0.1:%d", proxyPort), standbyPort
}

// of matches events about vLLM name ("a" or "b") in role.
func of(name, role string, match func(events.Event) bool) func(events.Event) bool {
	return func(e events.Event) bool { return e.VLLM == name && e.Role == role && match(e) }
}

// standbyDoc is `vllm-guard status --json`'s standby part.
type standbyDoc struct {
	Serving      string `json:"serving"`
	StandbyReady bool   `json:"standby_ready"`
	Failovers    int    `json:"failovers"`
	// AdmittedMaxNumSeqs is what the proxy admits for.
	AdmittedMaxNumSeqs int `json:"admitted_max_num_seqs"`
	VLLMs              []struct {
		Name  string `json:"name"`
		Role  string `json:"role"`
		Port  int    `json:"port"`
		State string `json:"state"`
		PID   int    `json:"pid"`
		Rung  int    `json:"rung"`
	} `json:"vllms"`
	LastFailover *events.Failover `json:"last_failover"`
}

func (s *scene) standbyStatus() standbyDoc {
	d, _ := s.standbyAndResumed()
	return d
}

// standbyAndResumed is the status's standby part and the streams the
// proxy has resumed so far.
func (s *scene) standbyAndResumed() (standbyDoc, uint64) {
	s.t.Helper()
	out, err := exec.Command(bins.guard, "status", "--json", "--socket", filepath.Join(s.dir, "guard.sock")).Output()
	var doc struct {
		Standby *standbyDoc `json:"standby"`
		Proxy   *struct {
			Resumed uint64 `json:"resumed"`
		} `json:"proxy"`
	}
	if err != nil || json.Unmarshal(out, &doc) != nil || doc.Standby == nil || doc.Proxy == nil {
		s.t.Fatalf("status --json (%v): %s; want a standby part and the proxy's", err, out)
	}
	return *doc.Standby, doc.Proxy.Resumed
}

// guardMetrics is the guard's /metrics: each series (name with labels) to
// its value.
func (s *scene) guardMetrics() map[string]string {
	s.t.Helper()
	resp, err := http.Get("http://" + s.httpListen + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && !strings.HasPrefix(l, "#") {
			m[f[0]] = f[1]
		}
	}
	return m
}

// engineOf is the EngineCore of the API server apiPID (its one child).
func engineOf(t *testing.T, apiPID int) int {
	t.Helper()
	kids := childrenOf(apiPID)
	if len(kids) != 1 {
		t.Fatalf("API server %d has children %v; want its EngineCore alone", apiPID, describe(kids))
	}
	return kids[0]
}

// Issue 42 item 1 through the running guard: with a standby, a SIGKILL of
// the serving vLLM's EngineCore mid-stream costs the clients nothing: every
// greedy stream through the proxy ends [DONE], with no error, its text and
// token ids those of vLLM's own uninterrupted answer, continued on the
// standby; the dead vLLM comes back as the new standby; status and the
// metrics name both and count the failover. Then a kill of the standby
// touches nothing of the serving vLLM: its pid and readiness stay, a
// stream in flight is not cut.
func TestStandbyTakesOverCutStreams(t *testing.T) {
	t.Parallel()
	s, proxyURL, standbyPort := standbyScene(t)
	s.start()
	readyA := s.WaitEvent("vLLM a ready (serving)", 1, 60*time.Second, of("a", events.RoleServing, isReady))
	readyB := s.WaitEvent("vLLM b ready (standby)", 1, 60*time.Second, of("b", events.RoleStandby, isReady))

	const n = 4
	var bodies []string
	for i := range n {
		bodies = append(bodies, greedyBody(i, 48))
	}
	body := func(i int) string { return bodies[i] }
	// The oracle: vLLM's own uninterrupted answers (from the standby: it
	// serves no client, and both run the same model).
	want := ownAnswers(t, fmt.Sprintf("http://127.0.0.1:%d", standbyPort), bodies, 48)

	// n streams through the proxy; once each has its first chunks, the
	// serving vLLM's EngineCore is SIGKILLed.
	wait := streamsInFlight(t, proxyURL, bodies)
	if err := syscall.Kill(engineOf(t, readyA.PID), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	fo := s.WaitEvent("the failover to b", 1, 60*time.Second, kind(events.KindFailover))
	got := wait()
	if fo.Failover == nil || fo.Failover.From != "a" || fo.Failover.To != "b" || fo.Failover.Swap {
		t.Fatalf("failover event %+v; want a → b", fo.Failover)
	}
	for i := range n {
		if g := got[i]; g.errors != 0 || g.done != 1 || g.text != want[i].text || !slices.Equal(g.ids, want[i].ids) || len(g.finishes) != 1 {
			t.Errorf("stream %d through the kill: %q ids %v, %d errors, %d [DONE], finishes %v\nwant %q ids %v", i, g.text, g.ids, g.errors, g.done,
				g.finishes, want[i].text, want[i].ids)
		}
	}
	// The streams were cut and continued (not finished before the kill).
	died := s.WaitEvent("vLLM a's exit, serving, taken over", 1, 60*time.Second, of("a", events.RoleServing, isExited))
	if died.Failover == nil || died.Failover.To != "b" {
		t.Fatalf("a's exit event %+v; want it to say b took over", died)
	}
	if s.CountEvents(of("b", events.RoleServing, kind(events.KindState))) != 0 {
		t.Fatal("vLLM b changed state while it took over; want it ready throughout")
	}
	s.WaitEvent("vLLM a ready again, as the standby", 1, 60*time.Second, of("a", events.RoleStandby, isReady))
	st, resumed := s.standbyAndResumed()
	if resumed < n {
		t.Fatalf("the proxy resumed %d streams; want the %d cut by the kill", resumed, n)
	}
	if st.LastFailover == nil || st.LastFailover.FirstTokenSeconds <= 0 || st.LastFailover.FirstTokenSeconds < st.LastFailover.Seconds {
		t.Fatalf("the last failover %+v; want the time to the first continued token, after the switch", st.LastFailover)
	}
	if st.Serving != "b" || !st.StandbyReady || st.Failovers != 1 || len(st.VLLMs) != 2 || st.LastFailover == nil ||
		st.VLLMs[0].Role != "standby" || st.VLLMs[1].Role != "serving" || st.VLLMs[1].Port != standbyPort || st.VLLMs[1].PID != readyB.PID {
		t.Fatalf("status after the failover: %+v; want b (pid %d, port %d) serving, a a ready standby, 1 failover", st, readyB.PID, standbyPort)
	}
	m := s.guardMetrics()
	if m["vllm_guard_failovers_total"] != "1" || m["vllm_guard_standby_ready"] != "1" || m[`vllm_guard_serving_vllm{vllm="b"}`] != "1" ||
		m["vllm_guard_failover_seconds_count"] != "1" || m["vllm_guard_failover_first_token_seconds_count"] != "1" || m["vllm_guard_state"+`{state="ready"}`] != "1" ||
		m[`vllm_guard_pair_exits_total{cause="crash",role="serving",vllm="a"}`] != "1" {
		t.Fatalf("metrics after the failover: failovers %q standby_ready %q serving b %q failover_seconds_count %q ready %q",
			m["vllm_guard_failovers_total"], m["vllm_guard_standby_ready"], m[`vllm_guard_serving_vllm{vllm="b"}`],
			m["vllm_guard_failover_seconds_count"], m[`vllm_guard_state{state="ready"}`])
	}

	// A kill of the standby (a) mid-stream: the stream on b is not cut, b
	// keeps its pid and never leaves ready, and a comes back as standby.
	aAgain := s.WaitEvent("a ready as standby", 1, time.Second, of("a", events.RoleStandby, isReady))
	states := s.CountEvents(of("b", events.RoleServing, kind(events.KindState)))
	var one streamAnswer
	var killed sync.WaitGroup
	killed.Add(1)
	go func() {
		defer killed.Done()
		one = readStream(t, proxyURL, body(0), 2, func() {
			if err := syscall.Kill(aAgain.PID, syscall.SIGKILL); err != nil {
				t.Error(err)
			}
		})
	}()
	killed.Wait()
	s.WaitEvent("the standby's exit", 1, 60*time.Second, of("a", events.RoleStandby, isExited))
	if one.errors != 0 || one.done != 1 || one.text != want[0].text || !slices.Equal(one.ids, want[0].ids) {
		t.Fatalf("a stream on b while the standby was killed: %q, %d errors, %d [DONE]; want %q", one.text, one.errors, one.done, want[0].text)
	}
	s.WaitEvent("a ready again as the standby", 2, 60*time.Second, of("a", events.RoleStandby, isReady))
	if n := s.CountEvents(of("b", events.RoleServing, kind(events.KindState))); n != states {
		t.Fatalf("vLLM b changed state %d times while the standby died", n-states)
	}
	if s.CountEvents(kind(events.KindFailover)) != 1 {
		t.Fatal("a failover at the standby's death")
	}
	if st, r := s.standbyAndResumed(); st.Serving != "b" || st.VLLMs[1].PID != readyB.PID || st.VLLMs[1].State != "ready" || r != resumed {
		t.Fatalf("after the standby's death: %+v, %d streams resumed (%d before); want b still serving with pid %d, no stream cut", st, r, resumed, readyB.PID)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// Issue 42 item 1 after an OOM: another tenant takes GPU 0 from under the
// serving vLLM a, whose engine runs out of memory; the standby b (GPU 1)
// serves at once, still on rung 0's flags, and the proxy admits for the
// ladder's new rung 1 (max_num_seqs 128, not b's 256) while a cannot
// restart (GPU 0 held). Once the memory is free a restarts on rung 1 as
// the standby; when ready it serves (a swap) and b is restarted on
// purpose, not as a failure, and comes back on rung 1 as the standby.
func TestStandbyAfterAnOOM(t *testing.T) {
	t.Parallel()
	s, proxyURL, _ := standbyScene(t)
	s.extra += "\n[gpu]\nsample_interval = \"100ms\"\n"
	s.start()
	s.WaitEvent("vLLM a ready (serving)", 1, 60*time.Second, of("a", events.RoleServing, isReady))
	s.WaitEvent("vLLM b ready (standby)", 1, 60*time.Second, of("b", events.RoleStandby, isReady))

	holder := holdGPU(t, s, 40<<30)
	// A request makes a's engine step into the memory it no longer has.
	answer := make(chan string, 1)
	go func() {
		resp, err := http.Post(proxyURL+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"test-model","prompt":"hello there","max_tokens":4}`))
		if err != nil {
			answer <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answer <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	oom := s.WaitEvent("a's OOM", 1, 60*time.Second, of("a", events.RoleServing, exitedWith("oom")))
	if oom.Failover == nil || oom.Failover.To != "b" || oom.Failover.Swap {
		t.Fatalf("a's OOM: %+v; want b to have taken over", oom.Failover)
	}
	if got := <-answer; !strings.HasPrefix(got, "200 ") || !strings.Contains(got, `"choices"`) {
		t.Fatalf("the request through the OOM: %s; want one 200", got)
	}
	rec := s.WaitEvent("the OOM's incident record", 1, 60*time.Second, kind(events.KindIncident))
	var inc state.Incident
	if b, err := os.ReadFile(rec.Reason); err != nil || json.Unmarshal(b, &inc) != nil {
		t.Fatalf("incident record %s: %v", rec.Reason, err)
	}
	if inc.Cause != "oom" || inc.VLLM != "a" || inc.Role != "serving" || inc.TakenOverBy != "b" {
		t.Fatalf("the OOM's record: cause %s vllm %q role %q taken over by %q; want a, serving, b", inc.Cause, inc.VLLM, inc.Role, inc.TakenOverBy)
	}
	s.WaitEvent("a waits for GPU 0's memory", 1, 60*time.Second, of("a", events.RoleStandby, inState("waiting_gpu")))
	st := s.standbyStatus()
	if st.Serving != "b" || st.AdmittedMaxNumSeqs != 128 || st.VLLMs[1].Rung != 0 {
		t.Fatalf("b promoted after the OOM: %+v; want b serving on rung 0's flags, admitted for rung 1's max_num_seqs 128", st)
	}
	holder.Process.Kill()
	holder.Wait()
	swap := s.WaitEvent("the swap to a on rung 1", 2, 60*time.Second, kind(events.KindFailover))
	if swap.Failover == nil || !swap.Failover.Swap || swap.Failover.To != "a" {
		t.Fatalf("after a's restart on rung 1: %+v; want a swap to a", swap.Failover)
	}
	back := s.WaitEvent("b back on rung 1 as the standby", 2, 60*time.Second, of("b", events.RoleStandby, isReady))
	if rungOf(back) != 1 {
		t.Fatalf("b came back on rung %d; want 1", rungOf(back))
	}
	if n := s.CountEvents(func(e events.Event) bool { return e.VLLM == "b" && isExited(e) }); n != 0 {
		t.Fatalf("b's planned restart counted as %d failures", n)
	}
	if st := s.standbyStatus(); st.Serving != "a" || !st.StandbyReady || st.AdmittedMaxNumSeqs != 128 || st.VLLMs[0].Rung != 1 || st.VLLMs[1].Rung != 1 {
		t.Fatalf("after the swap: %+v; want a serving and b a ready standby, both on rung 1", st)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// Issue 42 item 1: a standby that cannot start (its every start crashes)
// is reported, and the guard serves without one: vLLM a keeps serving,
// its pid and readiness unchanged, status says no standby is ready.
func TestAStandbyThatCannotStartIsReported(t *testing.T) {
	t.Parallel()
	s, proxyURL, _ := standbyScene(t)
	s.extra = strings.Replace(s.extra, `env = { CUDA_VISIBLE_DEVICES = "1" }`, `env = { CUDA_VISIBLE_DEVICES = "1", FAKEVLLM_FAULT = "crash_on_start" }`, 1)
	s.extra = strings.Replace(s.extra, "[restart]\n", "[restart]\ngive_up_after = 2\n", 1)
	s.start()
	readyA := s.WaitEvent("vLLM a ready (serving)", 1, 60*time.Second, of("a", events.RoleServing, isReady))
	s.WaitLog("the standby reported gone", 1, 60*time.Second, msgContains("the guard serves without a standby"))
	if n := s.CountEvents(func(e events.Event) bool { return e.VLLM == "b" && isExited(e) }); n < 1 {
		t.Fatal("no failed start of the standby")
	}
	st := s.standbyStatus()
	if st.Serving != "a" || st.StandbyReady || st.VLLMs[0].PID != readyA.PID || st.VLLMs[0].State != "ready" || st.VLLMs[1].State != "failed" {
		t.Fatalf("status: %+v; want a (pid %d) serving and ready, b failed, no standby ready", st, readyA.PID)
	}
	gaveUp := s.WaitEvent("the standby's gave_up alert", 1, 30*time.Second, func(e events.Event) bool {
		return e.Kind == events.KindAlert && e.Alert.Name == "gave_up" && e.Alert.Active
	})
	if !strings.Contains(gaveUp.Alert.Message, "the standby vLLM b") || !strings.Contains(gaveUp.Alert.Message, "serves without a standby") {
		t.Fatalf("the alert %q does not say the standby gave up and the guard serves without one", gaveUp.Alert.Message)
	}
	if s.CountEvents(of("a", events.RoleServing, kind(events.KindState))) != 1 || s.CountEvents(kind(events.KindFailover)) != 0 {
		t.Fatal("vLLM a changed state, or a failover, while the standby failed")
	}
	resp, err := http.Post(proxyURL+"/v1/completions", "application/json", strings.NewReader(`{"model":"test-model","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a request through the proxy: %s; want 200 from vLLM a", resp.Status)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// Issue 42 item 1, mode = "sleep", on the simulator's GPU: the standby b
// starts first on the same GPU and is put to sleep, then vLLM a starts.
// a's engine runs out of memory mid-stream: once a's tree is gone and its
// memory released, b is woken, answers, and serves: the stream cut by the
// OOM ends whole on b. The wake does not wait for a's restart backoff
// (here 4 minutes: the test would time out), and a never starts into b's
// memory.
func TestSleepingStandbyWakesAfterAnOOM(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	s.env["FAKEVLLM_ERA"] = "v1"
	s.env["FAKEVLLM_TOKEN_INTERVAL"] = "60ms"
	s.env["FAKEVLLM_FAULT"] = "nccl_oom_after=1s"
	s.env["FAKEVLLM_FAULT_MARKER"] = filepath.Join(s.dir, "oom-fired")
	proxyPort, standbyPort := testkit.FreePort(t), testkit.FreePort(t)
	proxyURL := fmt.Sprintf("http://127.0.0.1:%d", proxyPort)
	s.extra = fmt.Sprintf(`
[restart]
initial_delay = "4m"

[gpu]
sample_interval = "100ms"

[proxy]
listen = "127.0.0.1:%d"

[standby]
mode = "sleep"
port = %d
env = { FAKEVLLM_FAULT = "" }
`, proxyPort, standbyPort)
	s.start()
	s.WaitEvent("b ready (standby)", 1, 60*time.Second, of("b", events.RoleStandby, isReady))
	asleep := s.WaitEvent("b asleep", 1, 60*time.Second, of("b", events.RoleStandby, decided("standby_asleep")))
	startA := s.WaitEvent("a launched", 1, 60*time.Second, of("a", events.RoleServing, isStarting))
	if startA.Seq < asleep.Seq {
		t.Fatal("vLLM a launched before the standby slept")
	}
	s.WaitEvent("a ready (serving)", 1, 60*time.Second, of("a", events.RoleServing, isReady))

	body := `{"model":"test-model","prompt":"hello there friend","max_tokens":48,"stream":true,"stream_interval":2,` +
		`"return_token_ids":true,"stream_options":{"include_usage":true},"temperature":0}`
	got := readStream(t, proxyURL, body, -1, nil)
	oom := s.WaitEvent("a's OOM", 1, 60*time.Second, of("a", events.RoleServing, exitedWith("oom")))
	woken := s.WaitEvent("b woken", 1, 60*time.Second, of("b", events.RoleStandby, decided("standby_woken")))
	fo := s.WaitEvent("the failover to b", 1, 60*time.Second, kind(events.KindFailover))
	if !(oom.Seq < woken.Seq && woken.Seq < fo.Seq) || fo.Failover.From != "a" || fo.Failover.To != "b" {
		t.Fatalf("events: OOM %d, wake %d, failover %d %+v; want the OOM, then the wake, then a → b", oom.Seq, woken.Seq, fo.Seq, fo.Failover)
	}
	if n := s.CountEvents(func(e events.Event) bool { return e.VLLM == "a" && isStarting(e) }); n != 1 {
		t.Fatalf("vLLM a launched %d times; want once (never into the woken standby's memory)", n)
	}
	// The oracle: the same request once more, now on b (both run the same model).
	want := readStream(t, fmt.Sprintf("http://127.0.0.1:%d", standbyPort), body, -1, nil)
	if got.errors != 0 || got.done != 1 || got.text != want.text || !slices.Equal(got.ids, want.ids) || len(want.ids) != 48 {
		t.Fatalf("the stream through the OOM: %q ids %v, %d errors, %d [DONE]; want %q ids %v", got.text, got.ids, got.errors, got.done, want.text, want.ids)
	}
	if st := s.standbyStatus(); st.Serving != "b" || st.VLLMs[1].State != "ready" || st.VLLMs[0].State != "backoff" || st.VLLMs[0].PID != 0 {
		t.Fatalf("after the wake: %+v; want b serving, a in its backoff with no process", st)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}

// An operator's restart with a standby ready is a failover: b serves at
// once, a restarts (not as a failure) and comes back as the standby; the
// guard never stops being ready.
func TestRestartWithAStandbyIsAFailover(t *testing.T) {
	t.Parallel()
	s, proxyURL, _ := standbyScene(t)
	s.start()
	s.WaitEvent("vLLM a ready (serving)", 1, 60*time.Second, of("a", events.RoleServing, isReady))
	s.WaitEvent("vLLM b ready (standby)", 1, 60*time.Second, of("b", events.RoleStandby, isReady))
	c := control.NewClient(s.socket())
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	fo := s.WaitEvent("the failover to b", 1, 60*time.Second, kind(events.KindFailover))
	if fo.Failover.From != "a" || fo.Failover.To != "b" {
		t.Fatalf("failover %+v; want a → b", fo.Failover)
	}
	s.WaitEvent("a back as the standby", 1, 60*time.Second, of("a", events.RoleStandby, isReady))
	if n := s.CountEvents(isExited); n != 0 {
		t.Fatalf("%d failures: a restart is not one", n)
	}
	// The guard's own state never left ready: READY's state events are the
	// serving vLLM's, and b's never changed.
	if n := s.CountEvents(of("b", events.RoleServing, kind(events.KindState))); n != 0 {
		t.Fatalf("b changed state %d times while it took over", n)
	}
	resp, err := http.Post(proxyURL+"/v1/completions", "application/json", strings.NewReader(`{"model":"test-model","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a request after the restart: %s", resp.Status)
	}
	s.stopCleanly(30*time.Second, 10*time.Second)
}
