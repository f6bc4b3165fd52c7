// Reading a log: each line matched against the rules, tracebacks followed
// per process, load progress and the start of a shutdown noted.

package cause

import (
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

type lineKind uint8

const (
	kindNone lineKind = iota
	kindRoot
	kindWrapper
)

// Ids of the checks that are not needle rules (see rule.id).
const (
	ruleGPURuntimeOOM    = "CUDA/HIP/NCCL: out of memory"
	ruleRayMemoryMonitor = "Ray's memory monitor killed a worker"
	ruleErrorsStarting   = "errors while starting, no cause named"
	ruleArgparse         = "argparse: a usage error (\"prog: error: …\")"
	ruleValueError       = "exception: ValueError/ValidationError (not about memory)"
	ruleBrokenInstall    = "exception: ModuleNotFoundError/ImportError"
	rulePermission       = "exception: PermissionError"
	ruleAddressFamily    = "sandbox: " + addressFamilyRefused
	ruleException        = "exception: any other"
	ruleStalledStats     = "stats: requests running at 0 tokens/s"
	ruleWaitingEngine    = "starting: waiting for the engine core, over and over"
	ruleShutdown         = "shutdown: begun, never finished"
	ruleRPCTimeout       = "vLLM executor: RPC call timed out"
)

// matchLine classifies one message (prefixes already stripped); off, when
// not nil, switches rules off by id (the report's leave-one-group-out pass).
// id names the rule that decided the line.
func matchLine(msg string, off map[string]bool) (kind lineKind, cause Cause, score int, id string) {
	// Traceback source lines ("    raise ValueError(\"No available memory…")
	// and frame lines repeat text of the exception below them: they are
	// matched against the rules only (an excerpt may end before the
	// exception), never read as an exception or a wrapper themselves.
	if strings.HasPrefix(msg, "    ") {
		if !mayMatch(msg) {
			return kindNone, "", 0, ""
		}
		return matchRules(msg, off)
	}
	if isFrame(msg) || !mayMatch(msg) || isGuessList(msg) {
		return kindNone, "", 0, ""
	}
	for _, w := range wrappers {
		if strings.Contains(msg, w) && !off[w] {
			return kindWrapper, "", 0, w
		}
	}
	if k, c, sc, id := matchRules(msg, off); k != kindNone {
		return k, c, sc, id
	}
	on := func(id string) bool { return !off[id] }
	if strings.Contains(msg, addressFamilyRefused) && !isTorchWarning(msg) && !strings.Contains(msg, "NCCL INFO") &&
		!strings.Contains(msg, "NCCL WARN") && on(ruleAddressFamily) {
		return kindRoot, CauseConfigError, scoreConfig, ruleAddressFamily
	}
	if isArgparseError(msg) && on(ruleArgparse) {
		return kindRoot, CauseConfigError, scoreConfig, ruleArgparse
	}
	typ, isExc := vllmlog.ExceptionType(msg)
	if (isExc && (strings.HasSuffix(typ, "ValueError") || strings.HasSuffix(typ, "ValidationError"))) ||
		strings.HasPrefix(strings.TrimLeft(msg, " "), "Value error, ") {
		if !memoryish(msg) && on(ruleValueError) {
			return kindRoot, CauseConfigError, scoreValueErr, ruleValueError
		}
	}
	// A broken install (vllm or one of its modules cannot be imported) does
	// not heal on a restart.
	if (typ == "ModuleNotFoundError" || typ == "ImportError") && on(ruleBrokenInstall) {
		return kindRoot, CauseConfigError, scoreValueErr, ruleBrokenInstall
	}
	// EPERM/EACCES at startup: a sandbox (systemd's SystemCallFilter=,
	// ProtectSystem=, ReadOnlyPaths=; a container's seccomp profile) or file
	// modes refuse what vLLM needs. Python raises PermissionError for both
	// errnos; a restart meets the same refusal. Only the exception counts,
	// never the bare words "Operation not permitted", which NCCL and others
	// print in warnings they recover from.
	if typ == "PermissionError" && on(rulePermission) {
		return kindRoot, CauseConfigError, scoreValueErr, rulePermission
	}
	if isExc && on(ruleException) {
		return kindRoot, CauseCrash, scoreException, ruleException
	}
	return kindNone, "", 0, ""
}

// isGuessList recognises Ray's explanation of a dead worker, which lists
// what might have killed it ("There are some potential root causes. (1) The
// process is killed by SIGKILL by OOM killer … (3) … SIGSEGV …", newer "Some
// common causes include: (1) the process was killed by the OOM killer …"):
// the guesses name causes without evidence for any of them.
func isGuessList(msg string) bool {
	return strings.Contains(msg, "potential root causes") || strings.Contains(msg, "common causes include")
}

func matchRules(msg string, off map[string]bool) (lineKind, Cause, int, string) {
	for i := range rules {
		if strings.Contains(msg, rules[i].needle) && (ruleConds[i] == nil || ruleConds[i](msg)) && !off[ruleIDs[i]] {
			return kindRoot, rules[i].cause, rules[i].score, ruleIDs[i]
		}
	}
	return kindNone, "", 0, ""
}

// isFrame recognises a traceback frame line, `File "x.py", line 12, in f`
// (or faulthandler's `File "x.py", line 12 in f`), however indented.
func isFrame(msg string) bool {
	t := strings.TrimLeft(msg, " ")
	return strings.HasPrefix(t, `File "`) && strings.Contains(t, `", line `)
}

// holdsFrame recognises a frame behind a prefix the guard does not strip
// (CI timestamps, compose service names, "[rank0]:") or inside a paste
// that lost its newlines: the line is a traceback, and may hold more.
func holdsFrame(msg string) bool {
	i := strings.Index(msg, `  File "`)
	return i > 0 && strings.Contains(msg[i:], `", line `)
}

// frameCause is what the raise printed under the frame fn says, if
// anything; id is "frame: " + fn.
func frameCause(frame, src string, off map[string]bool) (Cause, int, string, bool) {
	src = strings.TrimLeft(src, " ")
	if !strings.HasPrefix(src, "raise ") {
		return "", 0, "", false
	}
	for _, r := range frameRules {
		if strings.HasPrefix(src, r.raise) && strings.Contains(frame, r.fn) && !off["frame: "+r.fn] {
			return r.cause, r.score, "frame: " + r.fn, true
		}
	}
	return "", 0, "", false
}

const maxHits = 16

// hits are the matched lines of one cause at its best score so far.
type hits struct {
	score int
	idx   []int
}

func (h *hits) add(i, score int) {
	switch {
	case score > h.score:
		h.score = score
		h.idx = append(h.idx[:0], i)
	case score == h.score && len(h.idx) < maxHits:
		h.idx = append(h.idx, i)
	case score == h.score && score == scoreException:
		// Generic exceptions: the latest are closest to the death.
		copy(h.idx, h.idx[1:])
		h.idx[len(h.idx)-1] = i
	}
}

// scan is what one pass over the lines found.
type scan struct {
	byCause   map[Cause]*hits
	ready     bool // "Application startup complete." seen
	readyLine int
	wrapper   int // index of the first wrapper line, -1 if none
	traceback bool
	lastTB    int // index of the last traceback line (header or frame), -1 if none
	lastFrame int // index of the last traceback frame line, -1 if none
	waiting   int // "Waiting for … core engine proc(s) to start." lines
	start     int // index of the first line of the last run

	// Stall signs (see stallVerdict).
	shm         []int // vLLM's shared-memory broadcast warnings since the last progress
	shmServing  bool  // the first of them came while vLLM served (ready, or answering requests)
	serving     bool  // ready, or uvicorn's access log seen
	stalled     []int // stats lines with requests running at 0 tokens/s since the last progress
	shutdown    int   // index of the start of a shutdown that never finished, -1 if none
	shutdownEnd bool
	errLines    []int // lines vLLM logged at level ERROR or CRITICAL (at most maxHits)
	pydantic    pydanticError
	bindFailed  bool // vLLM could not bind its port ("Address already in use", errno 98)

	// off and fired serve the report's leave-one-group-out pass (see
	// real_test.go): off switches rules off by id, fired records the id and
	// cause of every rule that decided a line. Both are nil in production.
	off   map[string]bool
	fired map[string]Cause

	// strict: the live guard's reading (see provenance.go): only text
	// vLLM's structure owns is evidence, and an OOM stands only on a
	// fatal traceback (or, in classify, on NVML's memory).
	strict bool
}

// isBindFailure recognises a failed bind of vLLM's port: Python's
// "OSError: [Errno 98] Address already in use" and uvicorn's "[Errno 98]
// error while attempting to bind on address (…): address already in use".
func isBindFailure(msg string) bool {
	return strings.Contains(msg, "ddress already in use") || strings.Contains(msg, "[Errno 98]")
}

// pydanticError is pydantic's exception line ("1 validation error for
// ModelConfig"), matched as a root at index at (-1: none pending), whose
// field and message lines below it are evidence of the same weight.
type pydanticError struct {
	at    int
	cause Cause
	score int
	id    string
}

// shutdownStarts open a shutdown: uvicorn's (uvicorn/server.py, "Shutting
// down", "Waiting for connections to close. (CTRL+C to force quit)",
// "Waiting for background tasks to complete. (CTRL+C to force quit)",
// uvicorn/lifespan/on.py "Waiting for application shutdown.") and vLLM's
// own (vllm/entrypoints/launcher.py "Shutting down FastAPI HTTP server.").
// shutdownEnds close one: uvicorn's "Application shutdown complete." and
// "Finished server process [N]".
var (
	shutdownStarts = []string{"INFO:     Shutting down", "Shutting down FastAPI HTTP server", "Waiting for application shutdown",
		"Waiting for connections to close", "Waiting for background tasks to complete"}
	shutdownEnds = []string{"Application shutdown complete", "Finished server process"}
)

func (s *scan) root(i int, c Cause, score int, id string) {
	h := s.byCause[c]
	if h == nil {
		h = &hits{}
		s.byCause[c] = h
	}
	h.add(i, score)
	if s.fired != nil {
		s.fired[id] = c
	}
}

// progress: the engine moved (a stats line with tokens, readiness); stall
// signs before it are history, not a hang.
func (s *scan) progress() {
	s.shm = s.shm[:0]
	s.stalled = s.stalled[:0]
	s.shmServing = false
}

// text is line l as evidence shows it: ANSI stripped, no trailing CR/space.
func text(l Line) string { return strings.TrimRight(vllmlog.StripANSI(l.Text), "\r\n ") }

// runMarkers open a run of vLLM; a saved log may hold several runs and only
// the last one is classified. The guard's own lines are always one run: its
// stdout and stderr interleave, so a traceback on stderr can come before a
// banner line on stdout of the same run, and must not be cut away.
var runMarkers = []string{"vLLM API server version", "vLLM server version", "non-default args:"}

// scanLines reads a death's lines; offline (a saved log a person
// diagnoses) it reads several runs and every line's text, live (the
// guard's own decision) only what provenance gives.
func scanLines(lines []Line, offline bool) *scan {
	s := scanWith(lines, offline, nil, nil, !offline)
	return s
}

func scanWith(lines []Line, severalRuns bool, off map[string]bool, fired map[string]Cause, strict bool) *scan {
	s := &scan{byCause: make(map[Cause]*hits, 4), wrapper: -1, readyLine: -1, lastFrame: -1, lastTB: -1, shutdown: -1, off: off, fired: fired, pydantic: pydanticError{at: -1}, strict: strict}
	for i := range lines {
		if !severalRuns {
			break
		}
		t := lines[i].Text
		if strings.Contains(t, "erver version") || strings.Contains(t, "non-default args:") {
			for _, m := range runMarkers {
				if strings.Contains(t, m) {
					s.start = i
				}
			}
		}
	}
	var orig []origin
	if strict {
		orig = provenance(lines, s.start)
	}
	for i := s.start; i < len(lines); i++ {
		// A client's text (an access line's path and query, a logged
		// prompt) is never evidence: one GET /v1/models?OutOfMemoryError
		// must not make the next crash an OOM.
		if vllmlog.IsClientText(lines[i].Text) {
			// That uvicorn logged an access at all is the server's own
			// fact (it serves); only the line's content is the client's.
			if vllmlog.IsAccessShape(lines[i].Text) {
				s.serving = true
			}
			continue
		}
		msg := vllmlog.Message(lines[i].Text)
		if vllmlog.IsStartupComplete(msg) {
			s.ready = true
			s.serving = true
			s.readyLine = i
			s.progress()
			continue
		}
		if strings.Contains(msg, "core engine proc(s) to start") {
			s.waiting++
			continue
		}
		if vllmlog.IsTracebackHeader(msg) {
			s.traceback = true
			s.lastTB = i
			continue
		}
		if isFrame(msg) {
			// Excerpts often start inside a traceback: frames are a
			// traceback even without its first line.
			s.traceback = true
			s.lastFrame, s.lastTB = i, i
			continue
		}
		if len(s.errLines) < maxHits && isErrorLevel(lines[i].Text) {
			s.errLines = append(s.errLines, i)
		}
		if strings.Contains(msg, "tokens/s") {
			if st, ok := vllmlog.ParseStats(msg); ok {
				switch {
				case st.Prompt > 0 || st.Generation > 0:
					s.progress()
				case st.Running > 0:
					s.stalled = append(s.stalled, i)
				}
				continue
			}
		}
		if strings.HasPrefix(msg, vllmlog.UvicornPrefix) {
			if _, ok := vllmlog.ParseAccess(msg); ok {
				s.serving = true
				continue
			}
			s.shutdownLine(i, msg)
		} else if strings.Contains(msg, "hutting down") || strings.Contains(msg, "Waiting for") {
			s.shutdownLine(i, msg)
		}
		if holdsFrame(msg) {
			s.traceback = true
			s.lastFrame, s.lastTB = i, i
		}
		var kind lineKind
		var cause Cause
		var score int
		var id string
		switch {
		case !strict:
			kind, cause, score, id = matchLine(msg, off)
		case orig[i].own != "":
			kind, cause, score, id = matchLine(orig[i].own, off)
			if kind == kindRoot && kernelRules[id] {
				// The kernel's lines never reach vLLM's output: a
				// line of it there is a quote.
				kind = kindNone
			}
			if kind == kindRoot && cause == CauseOOM && !orig[i].fatal {
				// Not a fatal traceback's: a crash unless NVML
				// saw the memory full (classify).
				cause, score = CauseCrash, scoreCrash
			}
		}
		if fired != nil && kind != kindNone {
			recordAll(msg, fired)
		}
		if kind == kindRoot && cause == CauseConfigError && ((!strict && isBindFailure(msg)) || (strict && isBindFailure(orig[i].own))) {
			s.bindFailed = true
		}
		if kind == kindRoot {
			if _, ok := pydanticHeader(msg); ok {
				s.pydantic = pydanticError{at: i, cause: cause, score: score, id: id}
			}
		} else if p := s.pydantic; kind == kindNone && p.at >= 0 && i-p.at <= 2 && !off[p.id] && (!strict || orig[i].fatal) {
			// Pydantic's exception line says only that a validation
			// failed; the error's field and message are on the next lines.
			if _, ok := pydanticDetail(msg); ok {
				if i-p.at == 2 {
					s.root(i-1, p.cause, p.score, p.id)
				}
				s.root(i, p.cause, p.score, p.id)
				s.pydantic.at = -1
			}
		}
		if kind == kindNone && s.lastFrame >= 0 && s.lastFrame == i-1 && (!strict || orig[i].fatal) {
			// The source line under a frame: a raise in a known check.
			if c, sc, fid, ok := frameCause(vllmlog.Message(lines[i-1].Text), msg, off); ok {
				kind, cause, score, id = kindRoot, c, sc, fid
			}
		}
		switch kind {
		case kindWrapper:
			if s.wrapper < 0 {
				s.wrapper = i
			}
			if fired != nil {
				fired[id] = CauseCrash
			}
		case kindRoot:
			if id == shmStall {
				// A sign, weighed at the end (stallVerdict), not a hit.
				if len(s.shm) == 0 {
					s.shmServing = s.serving
				}
				s.shm = append(s.shm, i)
				if fired != nil {
					fired[id] = CauseHang
				}
				continue
			}
			s.root(i, cause, score, id)
		}
	}
	return s
}

// isErrorLevel reports whether vLLM's logger wrote line at level ERROR or
// CRITICAL (its level prefix, behind the wrappers and the process prefix).
func isErrorLevel(line string) bool {
	if !strings.Contains(line, "ERROR ") && !strings.Contains(line, "CRITICAL ") {
		return false
	}
	t, _ := vllmlog.CutWrapper(vllmlog.StripANSI(line))
	for range 2 { // the process prefix may precede or follow the level
		t, _, _ = vllmlog.CutProcess(t)
		if _, lvl, ok := vllmlog.CutLevel(t); ok {
			return lvl == "ERROR" || lvl == "CRITICAL"
		}
	}
	return false
}

// shutdownLine notes the start or the end of a shutdown.
func (s *scan) shutdownLine(i int, msg string) {
	for _, m := range shutdownEnds {
		if strings.Contains(msg, m) {
			s.shutdownEnd = true
			return
		}
	}
	for _, m := range shutdownStarts {
		if strings.Contains(msg, m) {
			if s.shutdown < 0 || s.shutdownEnd {
				s.shutdown, s.shutdownEnd = i, false
			}
			return
		}
	}
}
