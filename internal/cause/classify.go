package cause

import (
	"fmt"
	"strings"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// best returns the winning cause among the log's hits, ignoring config
// errors when vLLM had become ready (request errors are not fatal) and
// scores below min.
func (s *scan) best(phase Phase, min int) (Cause, *hits) {
	var bc Cause
	var bh *hits
	for _, c := range Causes {
		h := s.byCause[c]
		// After ready, a configuration error is no longer the cause: the
		// configuration served. A failed bind is the exception: a vLLM that
		// could not take its port never served, whatever answered the
		// probes (another instance's vLLM on the same port).
		if h == nil || h.score < min || (c == CauseConfigError && phase == PhaseReady && !s.bindFailed) {
			continue
		}
		if bh == nil || h.score > bh.score {
			bc, bh = c, h
		}
	}
	return bc, bh
}

// evidence turns hit indices into lines, one per distinct message (four TP
// workers printing the same OOM make one line of evidence), at most four.
func (s *scan) evidence(lines []Line, h *hits) []Line {
	if h == nil {
		return nil
	}
	out := make([]Line, 0, 4)
	seen := make(map[string]bool, 4)
	for _, i := range h.idx {
		m := vllmlog.Message(lines[i].Text)
		if seen[m] {
			continue
		}
		seen[m] = true
		out = append(out, Line{N: lines[i].N, Stream: lines[i].Stream, Text: text(lines[i])})
		if len(out) == 4 {
			break
		}
	}
	return out
}

// Classify gives one cause, with its evidence, for one death of vLLM (or,
// with e.Offline, for a saved log, where "" means no failure was found).
// It is a pure function of e.
func Classify(e Exit) Verdict { return verdictOf(e, scanLines(e.Lines, e.Offline)) }

func verdictOf(e Exit, s *scan) Verdict {
	phase := e.Phase
	if phase == "" {
		phase = PhaseStarting
		if s.ready {
			phase = PhaseReady
		}
	}
	v := classify(e, s, phase)
	v.bindFailed = v.Cause == CauseConfigError && s.bindFailed
	if v.Cause == CauseGPUFault && v.GPU == nil {
		v.GPU = gpuFromLog(v.Evidence)
		if e.GPU != nil && v.GPU.Reset {
			// NVML watched the GPU and saw no fault: the log's words
			// alone never take a GPU out of service (issue 41).
			v.GPU.Reset = false
			v.Summary += "; NVML watched the GPU and saw no fault, so it is not taken for one that needs a reset"
		}
		if v.GPU.XID > 0 {
			v.Summary += fmt.Sprintf(" (XID %d: %s)", v.GPU.XID, v.GPU.Meaning)
		}
		if v.GPU.Reset {
			v.Summary += "; the GPU needs a reset (nvidia-smi -r -i <index>) or the node a drain and reboot"
		}
	}
	if v.Cause != "" {
		v.Advice = adviceFor(v)
	}
	return v
}

func classify(e Exit, s *scan, phase Phase) Verdict {
	// The guard's own failure to start vLLM (EMFILE, EAGAIN, ENOMEM, its
	// keeper) says nothing about vLLM's configuration. It is a crash of the
	// start, not a new cause: it backs off and counts toward the crash loop
	// like one, and the summary names it.
	if e.GuardFailure != "" {
		return Verdict{Cause: CauseCrash, Confidence: "high", guardStart: true,
			Summary: "the guard could not start vLLM: " + e.GuardFailure + " (its own error, not vLLM's configuration)"}
	}
	if e.StartFailure != "" {
		return Verdict{Cause: CauseConfigError, Confidence: "high",
			Summary: "vLLM could not be started: " + e.StartFailure}
	}
	// The GPU's own word first: a run that ended with an XID, a lost GPU
	// or new uncorrected ECC errors ended on the GPU, whatever the log
	// says after (a crash, a hang, a kill by the guard).
	if v, ok := gpuVerdict(e, s); ok {
		return v
	}
	if e.Hang != "" {
		// A dead engine also fails liveness; if the log names a memory cause,
		// that is the root cause the ladder must react to.
		if c, h := s.best(phase, scoreKV); h != nil {
			ev := s.evidence(e.Lines, h)
			return Verdict{Cause: c, Confidence: "high", Evidence: ev,
				Summary: summaryFor(c, ev) + " (then killed as hung: " + e.Hang + ")"}
		}
		if g := e.Group; g != nil {
			return Verdict{Cause: CauseGroup, Confidence: "high", Group: g,
				Summary: fmt.Sprintf("the group's epoch %d ended on another host: %s; this host's vLLM was killed with it", g.Epoch, g.Why)}
		}
		return Verdict{Cause: CauseHang, Confidence: "high", Summary: "vLLM hung: " + e.Hang}
	}
	if e.HostOOMKill && e.Signal == "SIGKILL" && !e.SignalByGuard {
		ev := s.evidence(e.Lines, s.byCause[CauseHostOOM])
		return Verdict{Cause: CauseHostOOM, Confidence: "high", Evidence: ev,
			Summary: "killed by the kernel OOM killer (SIGKILL, cgroup oom_kill count went up): host memory ran out, not GPU memory"}
	}

	c, h := s.best(phase, scoreDied)
	// The OOM killer mostly takes the biggest process of the tree, the
	// EngineCore or a worker; the API server then reports a dead engine and
	// exits by itself. Unless the log names a cause of its own, that death
	// is the host's memory.
	if e.HostOOMKill && !e.SignalByGuard && (h == nil || c == CauseCrash || c == CauseHostOOM) {
		var ev []Line
		if h != nil {
			ev = s.evidence(e.Lines, h)
		}
		return Verdict{Cause: CauseHostOOM, Confidence: "high", Evidence: ev,
			Summary: "the kernel OOM killer killed a process of vLLM's tree (cgroup oom_kill count went up), then vLLM ended: host memory ran out, not GPU memory"}
	}
	if h != nil && c != CauseCrash {
		ev := s.evidence(e.Lines, h)
		return Verdict{Cause: c, Confidence: "high", Evidence: ev, Summary: summaryFor(c, ev)}
	}
	// A crash with no OOM line but the GPU at the ceiling is most likely an
	// OOM that died before it could say so (NCCL, a killed worker).
	if !e.Offline && e.Critical > 0 {
		peak := 0.0
		for _, f := range e.MemFractions {
			peak = max(peak, f)
		}
		if peak >= e.Critical {
			var ev []Line
			if h != nil {
				ev = s.evidence(e.Lines, h)
			}
			return Verdict{Cause: CauseOOM, Confidence: "low", Evidence: ev,
				Summary: fmt.Sprintf("GPU out of memory, inferred from memory: no OOM line in the log, but GPU memory reached %.1f%% (critical %.1f%%) just before vLLM died",
					peak*100, e.Critical*100)}
		}
	}
	if h != nil {
		ev := s.evidence(e.Lines, h)
		return Verdict{Cause: CauseCrash, Confidence: "high", Evidence: ev, Summary: summaryFor(CauseCrash, ev)}
	}

	if e.Offline {
		return classifyOffline(e, s, phase)
	}
	// Any exit the guard did not ask for is a failure, whatever its code.
	ev := s.evidence(e.Lines, s.byCause[CauseCrash])
	return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: ev, Summary: exitWords(e, s, ev)}
}

// classifyOffline finishes a saved log with no decisive root-cause line: a
// failure is reported only when the log shows one, and a log that shows
// signs but cannot decide says CauseUnknown with what it saw.
func classifyOffline(e Exit, s *scan, phase Phase) Verdict {
	excs := s.evidence(e.Lines, s.byCause[CauseCrash])
	if s.wrapper >= 0 {
		return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: excs,
			Summary: fmt.Sprintf("vLLM's engine died (line %d: %s) and the log holds no root-cause line above it",
				e.Lines[s.wrapper].N, clip(vllmlog.Message(e.Lines[s.wrapper].Text), 120))}
	}
	if v, ok := s.stallVerdict(e.Lines); ok {
		return v
	}
	if phase == PhaseStarting && s.waiting >= 3 && !s.traceback && !s.off[ruleWaitingEngine] {
		s.fire(ruleWaitingEngine, CauseHang)
		return Verdict{Cause: CauseHang, Confidence: "low",
			Summary: fmt.Sprintf("vLLM stalled while starting: the engine core never came up (%d \"Waiting for … core engine proc(s) to start\" lines)", s.waiting)}
	}
	if phase == PhaseStarting && s.traceback {
		if len(excs) > 0 {
			return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: excs, Summary: summaryFor(CauseCrash, excs)}
		}
		// The excerpt ends inside a traceback: still a failure.
		var ev []Line
		if s.lastFrame >= 0 {
			l := e.Lines[s.lastFrame]
			ev = []Line{{N: l.N, Stream: l.Stream, Text: text(l)}}
		}
		sum := "vLLM crashed: the log holds a traceback but no exception line"
		if len(ev) > 0 {
			sum += fmt.Sprintf(" (its last frame, line %d: %s)", ev[0].N, clip(strings.TrimSpace(vllmlog.Message(ev[0].Text)), 160))
		}
		return Verdict{Cause: CauseCrash, Confidence: "low", Evidence: ev, Summary: sum}
	}
	if s.shutdown >= 0 && !s.shutdownEnd && s.lastTB < s.shutdown && !s.off[ruleShutdown] {
		// No sign of a stuck engine after it: a drain still running, a
		// shutdown that hung, or a log cut short. The text cannot say.
		s.fire(ruleShutdown, CauseUnknown)
		l := e.Lines[s.shutdown]
		return Verdict{Cause: CauseUnknown, Confidence: "low", Evidence: []Line{{N: l.N, Stream: l.Stream, Text: text(l)}},
			Summary: fmt.Sprintf("unknown: vLLM began shutting down at line %d and the log ends before the shutdown finished (no \"Application shutdown complete.\"): a shutdown that hung, or a log cut during the drain",
				l.N)}
	}
	if phase == PhaseReady {
		return Verdict{Summary: "no failure found: vLLM became ready"}
	}
	if len(s.errLines) > 0 && !s.off[ruleErrorsStarting] {
		// vLLM said something went wrong and never became ready, but
		// named nothing a rule knows: not "no failure", not a guess.
		s.fire(ruleErrorsStarting, CauseUnknown)
		var ev []Line
		for _, i := range []int{s.errLines[0], s.errLines[len(s.errLines)-1]} {
			if len(ev) == 0 || ev[0].N != e.Lines[i].N {
				ev = append(ev, Line{N: e.Lines[i].N, Stream: e.Lines[i].Stream, Text: text(e.Lines[i])})
			}
		}
		return Verdict{Cause: CauseUnknown, Confidence: "low", Evidence: ev,
			Summary: fmt.Sprintf("unknown: vLLM logged %d error line(s) while starting (first at line %d: %s) and the log ends before it became ready, naming no cause",
				len(s.errLines), ev[0].N, clip(vllmlog.Message(ev[0].Text), 160))}
	}
	return Verdict{Summary: "no failure found: the log ends while vLLM was still starting"}
}

// recordAll records in fired every rule that matches msg, not only the
// first: a rule shadowed by another on the same line is borne out by that
// line too (the report's support must not miss it, or a rule written from a
// log would pass for one supported by no log at all).
func recordAll(msg string, fired map[string]Cause) {
	for i := range rules {
		if strings.Contains(msg, rules[i].needle) && (ruleConds[i] == nil || ruleConds[i](msg)) {
			fired[ruleIDs[i]] = rules[i].cause
		}
	}
	for _, w := range wrappers {
		if strings.Contains(msg, w) {
			fired[w] = CauseCrash
		}
	}
	off := map[string]bool{}
	for range 8 { // the structural checks, each in turn
		k, c, _, id := matchLine(msg, off)
		if k == kindNone || off[id] {
			return
		}
		if k == kindRoot {
			fired[id] = c
		}
		off[id] = true
	}
}

func (s *scan) fire(id string, c Cause) {
	if s.fired != nil {
		s.fired[id] = c
	}
}

// How long requests must sit at 0 tokens/s before the log calls it a hang,
// and how many stats lines stand for that when the lines carry no time
// (vLLM logs stats every 10 s by default: VLLM_LOG_STATS_INTERVAL).
const (
	stalledFor      = 2 * time.Minute
	stalledLines    = 12
	stalledLinesMin = 3 // fewer say nothing, even as unknown
)

// stallVerdict weighs the signs of a stuck engine that the log ends on (no
// progress after them, no traceback after them): vLLM's shared-memory
// broadcast warnings and stats lines with requests running at 0 tokens/s.
//
// vLLM prints its broadcast warning when a worker has not read for 60 s,
// "hanging or doing some time-consuming work (e.g. compilation, weight/kv
// cache quantization)". Twice in a row, or once while it serves (compiling
// is over by then), is a hang; once while starting may be a long
// compilation: unknown. A stats line with running requests and no tokens is
// an engine that no longer steps while /health still answers 200; for
// stalledFor it is a hang, shorter it is unknown (a very long prefill is
// counted only when it completes). Signs that begin after a shutdown began
// are a shutdown that itself hung.
func (s *scan) stallVerdict(lines []Line) (Verdict, bool) {
	shm, stalled := s.shm, s.stalled
	if s.off[shmStall] {
		shm = nil
	}
	if s.off[ruleStalledStats] {
		stalled = nil
	}
	if len(shm) == 0 && len(stalled) < stalledLinesMin {
		return Verdict{}, false
	}
	first := -1
	if len(shm) > 0 {
		first = shm[0]
	}
	if len(stalled) >= stalledLinesMin && (first < 0 || stalled[0] < first) {
		first = stalled[0]
	}
	if s.lastTB > first {
		return Verdict{}, false // something failed after the signs: not a stall
	}
	stuckStats, span := false, ""
	if len(stalled) >= stalledLinesMin {
		t0, ok0 := vllmlog.Stamp(lines[stalled[0]].Text)
		t1, ok1 := vllmlog.Stamp(lines[stalled[len(stalled)-1]].Text)
		if d := t1.Sub(t0); ok0 && ok1 && d >= 0 {
			stuckStats = d >= stalledFor
			span = fmt.Sprintf(" over %s", d)
		} else {
			stuckStats = len(stalled) >= stalledLines
		}
	}
	shmHang := len(shm) >= 2 || (len(shm) == 1 && s.shmServing)

	var ev []Line
	add := func(idx []int) {
		if len(idx) == 0 {
			return
		}
		for _, i := range []int{idx[0], idx[len(idx)-1]} {
			if len(ev) > 0 && ev[len(ev)-1].N == lines[i].N {
				continue
			}
			ev = append(ev, Line{N: lines[i].N, Stream: lines[i].Stream, Text: text(lines[i])})
		}
	}
	var what []string
	if len(shm) > 0 {
		add(shm)
		what = append(what, fmt.Sprintf("%d shared-memory broadcast warning(s) (\"%s\", line %d)", len(shm), shmStall, lines[shm[0]].N))
	}
	if len(stalled) >= stalledLinesMin {
		add(stalled)
		what = append(what, fmt.Sprintf("%d stats lines with requests running at 0 tokens/s%s (lines %d–%d)",
			len(stalled), span, lines[stalled[0]].N, lines[stalled[len(stalled)-1]].N))
	}
	seen := strings.Join(what, " and ")
	if len(shm) > 0 {
		s.fire(shmStall, CauseHang)
	}
	if len(stalled) >= stalledLinesMin {
		s.fire(ruleStalledStats, CauseHang)
	}
	if shmHang || stuckStats {
		sum := "vLLM hung: the log ends on " + seen + ", with no progress and no error after them"
		if s.shutdown >= 0 && !s.shutdownEnd && s.shutdown < first {
			sum = fmt.Sprintf("vLLM hung while shutting down (the shutdown began at line %d and never finished): %s", lines[s.shutdown].N, seen)
		}
		return Verdict{Cause: CauseHang, Confidence: "low", Evidence: ev, Summary: sum}, true
	}
	return Verdict{Cause: CauseUnknown, Confidence: "low", Evidence: ev,
		Summary: "unknown: the log ends on " + seen + "; too little to call a hang (vLLM prints the broadcast warning during long compilations too), and no failure after it"}, true
}
