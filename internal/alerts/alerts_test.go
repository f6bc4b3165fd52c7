package alerts

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const wait = 10 * time.Second

// start runs d until the test ends.
func start(t *testing.T, d *Dispatcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func flush(t *testing.T, d *Dispatcher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := d.Flush(ctx); err != nil {
		t.Fatalf("alerts not delivered within %s: %v", wait, err)
	}
}

func observed(level zapcore.Level) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(level)
	return zap.New(core), logs
}

func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hook.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

var warn = Event{Alert: GPUMemoryWarn, Active: true, GPU: 0, Fraction: 0.93, SecondsToCritical: 120, Message: "GPU 0 memory at 93%",
	Rung: policy.Rung{Index: 1, MaxNumSeqs: 128, GPUMemoryUtilization: 0.8}}

func TestCommandGetsJSONOnStdin(t *testing.T) {
	dir := t.TempDir()
	out, env := filepath.Join(dir, "alert.json"), filepath.Join(dir, "env")
	hook := script(t, `cat > "$1"; echo "$VLLM_GUARD_ALERT $VLLM_GUARD_ALERT_ACTIVE $VLLM_GUARD_ALERT_SEVERITY ${NOTIFY_SOCKET:-none}" > "$2"`)
	t.Setenv("NOTIFY_SOCKET", "/run/systemd/notify") // the guard's own: not for its children
	log, logs := observed(zapcore.DebugLevel)
	d := New(config.Alerts{Command: []string{hook, out, env}}, log)
	start(t, d)
	d.Send(warn)
	flush(t, d)

	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("the command did not write its stdin: %v; logs %v", err, logs.All())
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("stdin is not JSON: %v\n%s", err, raw)
	}
	for k, want := range map[string]any{"alert": "gpu_memory_warn", "active": true, "severity": "warning", "gpu": 0.0,
		"fraction": 0.93, "seconds_to_critical": 120.0, "message": "GPU 0 memory at 93%", "cause": ""} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v (JSON %s)", k, got[k], want, raw)
		}
	}
	if rung, _ := got["rung"].(map[string]any); rung["max_num_seqs"] != 128.0 || rung["index"] != 1.0 {
		t.Errorf("rung = %v, want index 1, max_num_seqs 128", got["rung"])
	}
	if h, _ := got["host"].(string); h == "" {
		t.Error("host is empty")
	}
	if ts, _ := got["time"].(string); ts == "" {
		t.Error("time is empty")
	}
	if b, _ := os.ReadFile(env); strings.TrimSpace(string(b)) != "gpu_memory_warn true warning none" {
		t.Errorf("command environment: %q, want alert, active, severity and no NOTIFY_SOCKET", b)
	}
}

func TestCommandTimeoutKillsGroup(t *testing.T) {
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pid")
	hook := script(t, `sleep 60 & echo $! > "$1"; echo "about to hang" >&2; wait`)
	log, logs := observed(zapcore.InfoLevel)
	d := New(config.Alerts{Command: []string{hook, pidfile}}, log)
	// Long enough for a loaded CI machine to run the script up to its wait.
	d.commandTimeout = 2 * time.Second
	start(t, d)
	began := time.Now()
	d.Send(Event{Alert: OOM, Message: "vLLM died"})
	flush(t, d)
	if took := time.Since(began); took > 8*time.Second {
		t.Errorf("a 2s limit took %s to enforce", took)
	}
	entries := logs.FilterMessageSnippet("alert command timed out").All()
	if len(entries) != 1 {
		t.Fatalf("want one timeout log, got %v", logs.All())
	}
	if s := entries[0].ContextMap()["stderr"]; s != "about to hang" {
		t.Errorf("timeout log stderr = %q, want the command's stderr", s)
	}
	b, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if !testkit.Poll(wait, func() bool { return !alive(pid) }) {
		t.Fatalf("the command's child %d outlived the timeout", pid)
	}
}

// alive is false for a process that is gone or a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestCommandFailureLogged(t *testing.T) {
	hook := script(t, `cat >/dev/null; echo "boom: no route to pager" >&2; exit 3`)
	log, logs := observed(zapcore.InfoLevel)
	d := New(config.Alerts{Command: []string{hook}}, log)
	start(t, d)
	d.Send(Event{Alert: GaveUp, Message: "gave up"})
	flush(t, d)
	entries := logs.FilterMessage("alert command failed").All()
	if len(entries) != 1 {
		t.Fatalf("want one failure log, got %v", logs.All())
	}
	m := entries[0].ContextMap()
	if m["exit"] != "exit code 3" || m["stderr"] != "boom: no route to pager" || entries[0].Level != zapcore.ErrorLevel {
		t.Errorf("failure log %v at %s: want exit code 3, the stderr, level error", m, entries[0].Level)
	}

	d2 := New(config.Alerts{Command: []string{filepath.Join(t.TempDir(), "missing")}}, log)
	start(t, d2)
	d2.Send(Event{Alert: OOM})
	flush(t, d2)
	if logs.FilterMessageSnippet("alert command could not start").Len() != 1 {
		t.Errorf("a missing command was not logged: %v", logs.All())
	}
}

// receiver is a webhook that answers with the codes given, then 200.
type receiver struct {
	srv    *httptest.Server
	hits   atomic.Int32
	bodies chan []byte
}

func newReceiver(t *testing.T, codes ...int) *receiver {
	r := &receiver{bodies: make(chan []byte, 100)}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		n := int(r.hits.Add(1))
		b, _ := io.ReadAll(req.Body)
		if req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "want a JSON POST", http.StatusBadRequest)
			return
		}
		r.bodies <- b
		if n <= len(codes) {
			if codes[n-1] < 0 { // hang until the client gives up
				<-req.Context().Done()
				return
			}
			http.Error(w, "nope", codes[n-1])
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func fastWebhook(d *Dispatcher) {
	d.retryInitial = 10 * time.Millisecond
	d.webhookTimeout = 2 * time.Second
}

func TestWebhookRetriesThenSucceeds(t *testing.T) {
	r := newReceiver(t, 500, 503)
	log, logs := observed(zapcore.InfoLevel)
	d := New(config.Alerts{Webhook: r.srv.URL + "/hook?token=s3cret"}, log)
	fastWebhook(d)
	start(t, d)
	d.Send(warn)
	flush(t, d)
	if n := r.hits.Load(); n != 3 {
		t.Fatalf("%d POSTs, want 3 (two 5xx then success)", n)
	}
	if logs.FilterMessageSnippet("alert webhook failed").Len() != 0 {
		t.Errorf("success logged as failure: %v", logs.All())
	}
	if logs.FilterMessageSnippet("retrying").Len() != 2 {
		t.Errorf("want two retry logs: %v", logs.All())
	}
	for _, e := range logs.All() {
		for _, v := range e.ContextMap() {
			if s, ok := v.(string); ok && strings.Contains(s, "s3cret") {
				t.Errorf("the webhook's token reached the log: %v", e)
			}
		}
	}
	var got Event
	if err := json.Unmarshal(<-r.bodies, &got); err != nil || got.Alert != GPUMemoryWarn || !got.Active || got.GPU != 0 {
		t.Errorf("body %+v (%v), want the warn event", got, err)
	}
}

func TestWebhookGivesUpAfterThreeTries(t *testing.T) {
	r := newReceiver(t, 500, 500, 500, 500, 500)
	log, logs := observed(zapcore.InfoLevel)
	d := New(config.Alerts{Webhook: r.srv.URL}, log)
	fastWebhook(d)
	start(t, d)
	d.Send(Event{Alert: OOM})
	flush(t, d)
	if n := r.hits.Load(); n != 3 {
		t.Errorf("%d POSTs, want 3", n)
	}
	entries := logs.FilterMessageSnippet("alert webhook failed").All()
	if len(entries) != 1 || entries[0].ContextMap()["tries"] != int64(3) {
		t.Errorf("want one failure log after 3 tries, got %v", logs.All())
	}
}

func TestWebhookClientErrorIsFinal(t *testing.T) {
	r := newReceiver(t, 404)
	log, logs := observed(zapcore.InfoLevel)
	d := New(config.Alerts{Webhook: r.srv.URL}, log)
	fastWebhook(d)
	start(t, d)
	d.Send(Event{Alert: OOM})
	flush(t, d)
	if n := r.hits.Load(); n != 1 || logs.FilterMessageSnippet("alert webhook failed").Len() != 1 {
		t.Errorf("%d POSTs for a 404, want 1 and a failure log: %v", n, logs.All())
	}
}

func TestWebhookTimeoutPerTry(t *testing.T) {
	r := newReceiver(t, -1, -1, -1)
	log, logs := observed(zapcore.InfoLevel)
	d := New(config.Alerts{Webhook: r.srv.URL}, log)
	fastWebhook(d)
	d.webhookTimeout = 100 * time.Millisecond
	start(t, d)
	d.Send(Event{Alert: OOM})
	flush(t, d)
	if n := r.hits.Load(); n != 3 || logs.FilterMessageSnippet("alert webhook failed").Len() != 1 {
		t.Errorf("%d POSTs to a hanging webhook, want 3 then a failure log: %v", n, logs.All())
	}
}

// TestSendNeverBlocks: with nothing delivering, a flood of events fills the
// queue; Send keeps returning at once, drops, counts, and logs the burst once.
func TestSendNeverBlocks(t *testing.T) {
	log, logs := observed(zapcore.InfoLevel)
	d := New(config.Alerts{Command: []string{"true"}}, log) // Run never started
	const n = 10 * QueueSize
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			d.Send(Event{Alert: OOM, Message: strconv.Itoa(i)})
		}
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("Send blocked on a full queue")
	}
	if got := d.Dropped(); got != n-QueueSize {
		t.Errorf("dropped %d, want %d", got, n-QueueSize)
	}
	if got := logs.FilterMessageSnippet("alert queue full").Len(); got != 1 {
		t.Errorf("queue-full logged %d times, want once per burst", got)
	}
	if got := logs.FilterMessage("alert").Len(); got != n {
		t.Errorf("%d events logged, want every one of %d (dropped ones too)", got, n)
	}
}

func TestOncePerEpisode(t *testing.T) {
	r := newReceiver(t)
	log, logs := observed(zapcore.InfoLevel)
	d := New(config.Alerts{Webhook: r.srv.URL}, log)
	fastWebhook(d)
	start(t, d)

	crit := Event{Alert: GPUMemoryCritical, Active: true, GPU: 1, Fraction: 0.98}
	d.Send(warn)
	d.Send(warn) // same episode
	d.Send(crit)
	if got := d.Active(); len(got) != 2 || got[0].Alert != GPUMemoryWarn || got[1].Alert != GPUMemoryCritical || got[1].Severity != Critical {
		t.Fatalf("Active() = %+v, want warn then critical", got)
	}
	cleared := warn
	cleared.Active = false
	d.Send(cleared)
	d.Send(cleared) // not active any more
	d.Send(warn)    // a new episode
	d.Send(Event{Alert: OOM, Active: false})
	d.Send(Event{Alert: OOM})
	flush(t, d)

	if n := r.hits.Load(); n != 6 {
		t.Errorf("%d deliveries, want 6 (warn, critical, clear, warn again, two OOMs)", n)
	}
	for _, e := range d.Active() {
		if e.Alert == OOM {
			t.Errorf("oom is an event; it must not stay active: %+v", d.Active())
		}
	}
	if logs.FilterMessage("alert cleared").Len() != 1 || logs.FilterMessage("alert").Len() != 5 {
		t.Errorf("want 5 raise logs and 1 clear log: %v", logs.All())
	}
	for _, e := range logs.FilterMessage("alert").All() {
		want := zapcore.WarnLevel
		if e.ContextMap()["severity"] == Critical {
			want = zapcore.ErrorLevel
		}
		if e.Level != want {
			t.Errorf("%v logged at %s, want %s", e.ContextMap()["alert"], e.Level, want)
		}
	}
}

func TestNoSinksLogsOnly(t *testing.T) {
	log, logs := observed(zapcore.InfoLevel)
	d := New(config.Alerts{Webhook: "ftp://example.invalid/x"}, log)
	if logs.FilterMessageSnippet("not an http(s) URL").Len() != 1 {
		t.Errorf("a bad webhook was not logged: %v", logs.All())
	}
	d.Send(Event{Alert: OOM, Time: time.Now()})
	flush(t, d) // nothing queued: returns at once without Run
	if logs.FilterMessage("alert").Len() != 1 {
		t.Errorf("the event was not logged: %v", logs.All())
	}
}

func TestJSONSafeNumbers(t *testing.T) {
	r := newReceiver(t)
	d := New(config.Alerts{Webhook: r.srv.URL}, nil)
	start(t, d)
	inf := 1.0
	for range 2000 {
		inf *= 10 // overflows to +Inf
	}
	d.Send(Event{Alert: OOMPredicted, Active: true, GPU: 0, SecondsToCritical: inf, Fraction: inf - inf,
		Details: map[string]any{"bad": func() {}}})
	flush(t, d)
	if n := r.hits.Load(); n != 1 {
		t.Fatalf("an event with NaN, Inf and unencodable details was not delivered (%d POSTs)", n)
	}
	var got Event
	if err := json.Unmarshal(<-r.bodies, &got); err != nil || got.SecondsToCritical != -1 || got.Fraction != 0 {
		t.Errorf("got %+v (%v), want seconds_to_critical -1 and fraction 0", got, err)
	}
}

func TestFromGPUAndFailure(t *testing.T) {
	rung := policy.Rung{Index: 2, MaxNumSeqs: 64, GPUMemoryUtilization: 0.75}
	e := FromGPU(gpumon.Alert{Name: gpumon.AlertPredicted, Device: 3, Active: true, Fraction: 0.91, SecondsToCritical: 240,
		Message: "climbing"}, rung)
	if e.Alert != OOMPredicted || e.GPU != 3 || e.Severity != Warning || e.Rung != rung || e.SecondsToCritical != 240 {
		t.Errorf("FromGPU = %+v", e)
	}

	f := status.Failure{Exit: "exit code 1", MemFractions: []float64{0.9, 0.99, 0.5}, RungBefore: rung,
		Verdict:  cause.Verdict{Cause: cause.CauseOOM, Evidence: []cause.Line{{N: 812, Text: "torch.OutOfMemoryError: CUDA out of memory."}}},
		Decision: policy.Decision{Action: policy.ActionRestart, Rung: policy.Rung{Index: 3, MaxNumSeqs: 32, GPUMemoryUtilization: 0.7}}}
	evs := FromFailure(f)
	if len(evs) != 1 || evs[0].Alert != OOM || evs[0].Fraction != 0.99 || evs[0].Details["evidence_line"] != 812 ||
		evs[0].Severity != Critical || evs[0].GPU != -1 || !strings.Contains(evs[0].Message, "restarting on rung 3") {
		t.Errorf("FromFailure(oom) = %+v", evs)
	}

	f.Decision = policy.Decision{Action: policy.ActionGiveUp, ExitCode: 1, Reason: "10 failed starts within 1h"}
	if evs := FromFailure(f); len(evs) != 2 || evs[0].Alert != OOM || evs[1].Alert != GaveUp || evs[1].Details["exit_code"] != 1 {
		t.Errorf("FromFailure(oom, give up) = %+v, want oom then gave_up", evs)
	}
	f.Verdict.Cause = cause.CauseCrash
	f.Decision.Action = policy.ActionRestart
	if evs := FromFailure(f); len(evs) != 0 {
		t.Errorf("FromFailure(crash, restart) = %+v, want none", evs)
	}
}

func TestTheDispatcherOwnsWhatIsInForce(t *testing.T) {
	d := New(config.Alerts{}, nil)
	var published []events.Event
	d.Publish(func(e events.Event) { published = append(published, e) })
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	d.Send(Event{Alert: GPUMemoryWarn, Active: true, GPU: 0, Time: t0, Message: "warn"})
	d.Send(Event{Alert: GPUMemoryWarn, Active: true, GPU: 0, Time: t0.Add(time.Second)}) // the same episode
	d.Send(Event{Alert: OOM, Active: true, GPU: -1, Time: t0.Add(2 * time.Second), Message: "oom"})
	got := d.InForce()
	if len(got) != 2 || got[0].Alert != GPUMemoryWarn || got[1].Alert != OOM {
		t.Fatalf("in force %+v: want warn then oom", got)
	}
	// vLLM ready again: oom ends; the memory episode stays until cleared.
	d.Clear(OOM)
	d.Send(Event{Alert: GPUMemoryWarn, Active: false, GPU: 0, Time: t0.Add(3 * time.Second)})
	if got := d.InForce(); len(got) != 0 {
		t.Fatalf("in force after the clears: %+v", got)
	}
	d.Send(Event{Alert: GaveUp, Active: true, GPU: -1, Time: t0.Add(4 * time.Second)})
	if got := d.InForce(); len(got) != 1 || got[0].Alert != GaveUp {
		t.Fatalf("after giving up: %+v", got)
	}
	var kinds []string
	for _, e := range published {
		if e.Kind != events.KindAlert {
			t.Fatalf("published %+v", e)
		}
		kinds = append(kinds, fmt.Sprintf("%s:%v", e.Alert.Name, e.Alert.Active))
	}
	want := "[gpu_memory_warn:true oom:true oom:false gpu_memory_warn:false gave_up:true]"
	if fmt.Sprint(kinds) != want {
		t.Fatalf("published %v, want %s", kinds, want)
	}
}

// A webhook that answers with a redirect is not followed: the alert is not
// re-POSTed elsewhere (an https→http downgrade, another host), and the
// delivery is logged as failed, saying why, without the URL's secrets.
func TestWebhookRedirectIsRefused(t *testing.T) {
	var elsewhere atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
	}))
	defer target.Close()
	for _, code := range []int{301, 302, 307, 308} {
		var hits atomic.Int32
		redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			http.Redirect(w, r, target.URL+"/stolen?token=redirsecret", code)
		}))
		log, logs := observed(zapcore.InfoLevel)
		u := strings.Replace(redirector.URL, "http://", "http://user:hooksecret@", 1) + "/hook"
		d := New(config.Alerts{Webhook: u}, log)
		fastWebhook(d)
		start(t, d)
		d.Send(Event{Alert: OOM})
		flush(t, d)
		redirector.Close()
		failed := logs.FilterMessageSnippet("alert webhook failed").All()
		if hits.Load() != 1 || len(failed) != 1 {
			t.Errorf("%d: %d POSTs, %d failure logs; want 1 and 1: %v", code, hits.Load(), len(failed), logs.All())
			continue
		}
		text := fmt.Sprint(failed[0].ContextMap())
		if !strings.Contains(text, "redirect") || !strings.Contains(text, "refused") {
			t.Errorf("%d: the failure does not say the redirect was refused: %s", code, text)
		}
		if strings.Contains(text, "hooksecret") || strings.Contains(text, "redirsecret") {
			t.Errorf("%d: a secret reached the log: %s", code, text)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect was followed: %d POSTs reached its target", n)
	}
}

// TestFromFailureGPUFault: a gpu_fault raises gpu_fault naming the GPU, the
// XID and what to do; when the policy gave up, gave_up follows.
func TestFromFailureGPUFault(t *testing.T) {
	g := &cause.GPUFault{Device: 0, UUID: "GPU-aaaa", XID: 79, Meaning: cause.XIDMeaning(79), Reset: true, Source: "nvml"}
	f := status.Failure{Exit: "signal SIGKILL", Verdict: cause.Verdict{Cause: cause.CauseGPUFault, GPU: g},
		Decision: policy.Decision{Action: policy.ActionGiveUp, ExitCode: exitcode.GPUFault, Reason: "GPU fault, not restarted into: " + g.What()}}
	evs := FromFailure(f)
	if len(evs) != 2 || evs[0].Alert != GPUFault || evs[1].Alert != GaveUp || evs[1].Details["exit_code"] != exitcode.GPUFault {
		t.Fatalf("FromFailure(gpu_fault, give up) = %+v", evs)
	}
	e := evs[0]
	for _, want := range []string{"GPU 0", "XID 79", "fallen off the bus", "nvidia-smi -r -i 0", "not restarted"} {
		if !strings.Contains(e.Message, want) {
			t.Errorf("message %q lacks %q", e.Message, want)
		}
	}
	if e.GPU != 0 || e.Severity != Critical || e.Details["xid"] != 79 || e.Details["needs_reset"] != true {
		t.Errorf("event %+v", e)
	}
}
