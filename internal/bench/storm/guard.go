package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
)

// guardConfig is the guard's vllm-guard.toml for one run: defaults, with
// every duration scaled (restart delays, stall timeout, liveness, GPU
// sampling and prediction); probe and liveness timeouts never below 1 s,
// because a timeout that short measures the CPU race, not vLLM.
func (r *run) guardConfig() string {
	s := r.s
	atLeast := func(d, floor time.Duration) string { return dur(max(s.D(d), floor)) }
	cmd := []string{r.bins.fakevllm, "serve", model}
	cmd = append(cmd, r.sc.Args...)
	var b strings.Builder
	fmt.Fprintf(&b, "[vllm]\ncommand = [")
	for i, a := range cmd {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", a)
	}
	fmt.Fprintf(&b, "]\nhost = \"127.0.0.1\"\nport = %d\nserved_model_name = %q\nstop_timeout = %q\n\n[vllm.env]\n%s = %q\n",
		r.port, model, dur(s.D(30*time.Second)), tagVar, r.tag)
	env := r.sc.simEnv(s, r.gpuDir, filepath.Join(r.dir, "fault-fired"))
	for _, k := range sortedKeys(env) {
		if k == "FAKENVML_STATE" {
			continue // the guard's own environment passes it on
		}
		fmt.Fprintf(&b, "%s = %q\n", k, env[k])
	}
	fmt.Fprintf(&b, "\n[profile]\nmax_num_seqs = %d\ngpu_memory_utilization = %g\n", baseMaxNumSeqs, baseUtil)
	fmt.Fprintf(&b, "\n[readiness]\npoll_interval = %q\nprobe_timeout = \"2s\"\nstall_timeout = %q\n",
		atLeast(250*time.Millisecond, 50*time.Millisecond), dur(s.D(10*time.Minute)))
	fmt.Fprintf(&b, "\n[liveness]\ninterval = %q\ntimeout = %q\nfailures = 3\n", dur(s.D(10*time.Second)), atLeast(5*time.Second, time.Second))
	fmt.Fprintf(&b, "\n[gpu]\nsample_interval = %q\npredict_horizon = %q\nrelease_timeout = %q\n",
		atLeast(time.Second, 20*time.Millisecond), dur(s.D(10*time.Minute)), dur(s.D(time.Minute)))
	fmt.Fprintf(&b, "\n[restart]\ninitial_delay = %q\nmax_delay = %q\nreset_after = %q\ngive_up_window = %q\n",
		dur(s.D(5*time.Second)), dur(s.D(5*time.Minute)), dur(s.D(10*time.Minute)), dur(s.D(time.Hour)))
	fmt.Fprintf(&b, "\n[control]\nsocket = %q\nhttp_listen = \"\"\nstate_dir = %q\n\n[log]\nformat = \"json\"\nlevel = \"info\"\n",
		filepath.Join(r.dir, "guard.sock"), filepath.Join(r.dir, "state"))
	return b.String()
}

// guardRun runs `vllm-guard run` until the scenario ends or the guard exits.
func (r *run) guardRun(ctx context.Context) {
	cfg := filepath.Join(r.dir, "vllm-guard.toml")
	if err := os.WriteFile(cfg, []byte(r.guardConfig()), 0o644); err != nil {
		r.setTerminal("gave up (" + err.Error() + ")")
		return
	}
	// The guard's events (starts, exits with their cause) come as JSON
	// lines on fd 3; its log only for the alerts, which are not events yet.
	cmd := exec.Command(r.bins.guard, "run", "--config", cfg, "--events", "/dev/fd/3")
	cmd.Env = append(os.Environ(), "FAKENVML_STATE="+r.gpuDir, "LD_LIBRARY_PATH="+r.bins.nvmlDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		r.setTerminal("gave up (" + err.Error() + ")")
		return
	}
	er, ew, err := os.Pipe()
	if err != nil {
		pr.Close()
		pw.Close()
		r.setTerminal("gave up (" + err.Error() + ")")
		return
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.ExtraFiles = []*os.File{ew}
	if err := cmd.Start(); err != nil {
		pw.Close()
		pr.Close()
		ew.Close()
		er.Close()
		r.setTerminal("gave up (start the guard: " + err.Error() + ")")
		return
	}
	pw.Close()
	ew.Close()
	r.guardPID.Store(int64(cmd.Process.Pid))
	logf, _ := os.Create(filepath.Join(r.dir, "guard.log"))
	evf, _ := os.Create(filepath.Join(r.dir, "events.jsonl"))
	read := make(chan struct{})
	go func() {
		defer close(read)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.readGuardEvents(er, evf)
		}()
		r.readGuardLog(pr, logf)
		<-done
	}()
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		r.guardPID.Store(0)
		close(exited)
	}()
	select {
	case <-exited:
		<-read // the events say why before the exit code does
		r.setTerminal(fmt.Sprintf("gave up (exit %d)", cmd.ProcessState.ExitCode()))
		return
	case <-ctx.Done():
	}
	// The scenario is over: measured already; stop the guard gracefully.
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(r.s.D(30*time.Second) + 10*time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// guardEvent is one thing the guard did that the benchmark counts.
type guardEvent struct {
	kind       string // launch, ready, failed, gave_up (events); alert (log)
	maxNumSeqs int    // launch: the --max-num-seqs it passed
	cause      string // failed: the verdict's cause ("hang": the guard killed a live vLLM)
	alert      string // alert: its name, when raised
}

// parseGuardEvent reads one line of the guard's event stream (run --events).
func parseGuardEvent(line []byte) (guardEvent, bool) {
	var e events.Event
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
		return guardEvent{}, false
	}
	switch e.Kind {
	case events.KindStarting:
		ev := guardEvent{kind: "launch"}
		for i, a := range e.Argv {
			v, ok := strings.CutPrefix(a, "--max-num-seqs=")
			if !ok && a == "--max-num-seqs" && i+1 < len(e.Argv) {
				v, ok = e.Argv[i+1], true
			}
			if n, err := strconv.Atoi(v); ok && err == nil && n > 0 {
				ev.maxNumSeqs = n
			}
		}
		return ev, true
	case events.KindReady:
		return guardEvent{kind: "ready"}, true
	case events.KindExited:
		if e.Failure == nil {
			return guardEvent{}, false
		}
		return guardEvent{kind: "failed", cause: string(e.Failure.Verdict.Cause)}, true
	case events.KindState:
		if e.State == "failed" { // the guard gave up
			return guardEvent{kind: "gave_up"}, true
		}
	}
	return guardEvent{}, false
}

// parseGuardLine reads one line of the guard's JSON log: only the GPU
// memory alerts, which the guard does not publish as events yet.
func parseGuardLine(line []byte) (guardEvent, bool) {
	var m struct {
		Msg    string `json:"msg"`
		Alert  string `json:"alert"`
		Active *bool  `json:"active"`
	}
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &m) != nil {
		return guardEvent{}, false
	}
	if m.Msg == "GPU memory alert" && m.Active != nil && *m.Active {
		return guardEvent{kind: "alert", alert: m.Alert}, true
	}
	return guardEvent{}, false
}

// readGuardLog keeps the guard's log and records its alerts.
func (r *run) readGuardLog(pr, logf *os.File) { r.readGuard(pr, logf, parseGuardLine) }

// readGuardEvents keeps the guard's event stream and records what it says.
func (r *run) readGuardEvents(pr, evf *os.File) { r.readGuard(pr, evf, parseGuardEvent) }

// readGuard turns lines from the guard into the run's record, keeping a
// copy of each line in keep.
func (r *run) readGuard(pr, keep *os.File, parse func([]byte) (guardEvent, bool)) {
	defer pr.Close()
	if keep != nil {
		defer keep.Close()
	}
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if keep != nil {
			keep.Write(line)
			keep.Write([]byte{'\n'})
		}
		ev, ok := parse(line)
		if !ok {
			continue
		}
		at := r.since()
		r.note(func(rec *record) {
			switch ev.kind {
			case "launch":
				rec.starts = append(rec.starts, at)
				if ev.maxNumSeqs > 0 {
					rec.maxNumSeqs = ev.maxNumSeqs
				}
			case "failed":
				switch ev.cause {
				case "oom":
					rec.ooms = append(rec.ooms, at)
				case "hang": // the guard killed a live vLLM that hung
					rec.kills++
				}
			case "alert":
				if ev.alert == "oom_predicted" {
					rec.alerts = append(rec.alerts, at)
				}
			}
		})
	}
}
