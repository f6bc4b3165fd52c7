// Provenance: which part of which line of vLLM's output vLLM (or the
// library that printed it) wrote itself, as opposed to text a client sent.
//
// vLLM quotes its clients in its own lines: a model name in "Error with
// model error=ErrorInfo(message='The model `…` does not exist.'", an
// X-Request-Id in "Added request …", a path in uvicorn's access line, an
// exception message built from a request in the traceback an API handler
// logs. Matching a needle anywhere in a line made each of them a channel
// into the guard's decisions (round 3: access lines; round 4:
// X-Forwarded-For; issue 41: model names and request ids). The guard's live
// classifier therefore reads a line only where its structure is vLLM's own
// (docs/how-it-decides.md, "What counts as evidence"):
//
//   - the exception line of a fatal traceback, and its continuation lines:
//     a traceback Python printed for an exception nobody caught (the
//     process died of it), or one vLLM's logger printed under one of the
//     engine's fatal-error lines ("EngineCore failed to start.",
//     "EngineCore encountered a fatal error.", "WorkerProc hit an
//     exception." …). A traceback an API handler or uvicorn logged for one
//     request ("Exception in ASGI application", "Engine Exception caught.
//     Request id: …") is the request's, never the death's;
//   - a line of vLLM's logger whose message starts with one of the
//     engine's own words (startupFacts): "Free memory on device …",
//     "Available KV cache memory: -…", "Worker proc … died unexpectedly";
//   - a raw line on stderr (no logger header, not uvicorn's, not in a
//     traceback's body) printed by a library: NCCL, PyTorch's c10,
//     faulthandler;
//   - uvicorn's own ERROR lines (its bind refusal).
//
// Where the guard's pump knows what came before each line (Line.Start),
// a line after "\r\n" continues the record above (vLLM's formatter) and
// is never a record's first line, and a line after a lone "\r" is
// nothing; vLLM's logger writes to stdout, so a record's shape on stderr,
// or a header-less line on stdout, is nobody's evidence.
//
// Within such a line the rules read only its own text: the part before the
// first quote (', ", `), where vLLM and the libraries put every value they
// interpolate, except the quoted values that are themselves a runtime's
// word (a worker's re-raised exception, NCCL's CUDA error string).

package cause

import (
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// origin is what provenance says of one line.
type origin struct {
	own   string // the text the rules may read; "" when the line is no evidence
	fatal bool   // in a fatal traceback (its exception line, continuation or body)
	body  bool   // a traceback's header, frame or source line
}

// fatalAnnouncers are the messages vLLM's logger prints just before the
// traceback of an error that ends the engine or a worker (logger.exception:
// the traceback's lines carry the same header). vLLM 0.32.0:
// v1/engine/core.py:1510, 1512, 2663; v1/executor/multiproc_executor.py:953,
// 959, 1063; v1/engine/async_llm.py:906; and the older engines' words.
var fatalAnnouncers = []string{
	"EngineCore failed to start",
	"EngineCore encountered a fatal error",
	"Engine core initialization failed",
	"WorkerProc failed to start",
	"WorkerProc failed",
	"WorkerProc hit an exception",
	"AsyncLLM output_handler failed",
	"Engine background task failed",
	"Error executing method",
	"Exception in worker",
	"Engine loop has died",
	"Engine process failed to start",
}

// handledAnnouncers open a traceback that Python, asyncio or uvicorn print
// for an exception someone caught: the process goes on.
var handledAnnouncers = []string{
	"Exception in ASGI application",
	"Task exception was never retrieved",
	"Exception in callback",
	"Exception ignored in",
	"Exception in thread",
	"--- Logging error ---",
	"Error in atexit._run_exitfuncs",
}

// startupFacts start the messages of vLLM's logger that are evidence by
// themselves: the engine's own words, with nothing of a request in them.
var startupFacts = []string{
	"Free memory on device",
	"Available KV cache memory: -",
	"# GPU blocks: 0,",
	shmStall,
	"Worker proc ",
	"Engine core proc ",
	"Error in memory profiling",
	"Cannot auto-fit max_model_len",
	"Got fatal signal from worker processes",
	"EngineCore failed to start",
	"EngineCore encountered a fatal error",
	"EngineCore encountered an issue",
	"Engine core initialization failed",
	"AsyncLLM output_handler failed",
	"Engine loop has died",
	"Engine process failed to start",
	"MQLLMEngine is already dead",
	"To serve at least one request",
	"No available memory for the cache blocks",
}

// chainers join a traceback to the next one (Python's chained exceptions).
var chainers = []string{
	"The above exception was the direct cause of the following exception:",
	"During handling of the above exception, another exception occurred:",
}

// uvicornLevels start uvicorn's own lines.
var uvicornLevels = []string{"INFO:     ", "WARNING:  ", "ERROR:    ", "DEBUG:    ", "CRITICAL: ", "TRACE:    "}

// tbState is one stream's traceback: per process, and per logger record
// for tracebacks vLLM's logger printed.
type tbState struct {
	in      bool // between the header and the exception line
	exc     bool // after the exception line (its continuation lines)
	fatal   bool
	chained bool // a chainer was seen: the next header inherits fatal
}

// parsed is one line cut into its parts.
type parsed struct {
	proc   string // process prefixes, outermost first
	header string // vLLM's logger header, "" for a raw line
	msg    string
	// misplaced: a logger record's shape on stderr, where vLLM's logger
	// does not write (by default): someone's text, or a logging
	// configuration the guard cannot read provenance from.
	misplaced bool
}

// parseLine cuts a line into its parts. On stderr a logger header is not
// cut: vLLM's logger writes to stdout (VLLM_LOGGING_STREAM's default), so
// a line on stderr that looks like one of its records is raw text, maybe
// a client's inside a traceback's message.
func parseLine(text, stream string) parsed {
	s := strings.TrimRight(vllmlog.StripANSI(text), "\r\n ")
	s, _ = vllmlog.CutWrapper(s)
	var p parsed
	for range 3 { // nested prefixes: "(APIServer pid=1) (EngineCore_DP0 pid=2) "
		r, proc, ok := vllmlog.CutProcess(s)
		if !ok {
			break
		}
		p.proc += "(" + proc + ")"
		s = r
	}
	if stream == "stderr" {
		_, _, p.misplaced = vllmlog.CutLevel(s)
		p.msg = s
		return p
	}
	if r, _, ok := vllmlog.CutLevel(s); ok {
		p.header = s[:len(s)-len(r)]
		s = r
		// The prefix after the level (journal-era lines); after a
		// prefix already cut, what follows the header is the message.
		for range 2 {
			if p.proc != "" {
				break
			}
			r, proc, ok := vllmlog.CutProcess(s)
			if !ok {
				break
			}
			p.proc += "(" + proc + ")"
			s = r
		}
	}
	p.msg = s
	return p
}

// provenance gives each line from start its origin.
//
// A traceback's exception message is printed as it is, newlines and all:
// a request's text in it can write lines that look like anything (a
// traceback header, a logger record, NCCL's words). So a traceback that is
// not fatal quarantines what follows it: a header while its exception
// message may still go on inherits its fatality (Python prints a chained
// traceback only after a chainer line), and after a raw traceback (uvicorn's
// "Exception in ASGI application", printed without vLLM's formatter) no
// raw line of that stream is evidence again in this run: where its message
// ends cannot be told.
func provenance(lines []Line, start int) []origin {
	out := make([]origin, len(lines))
	tbs := map[string]*tbState{}
	prevProc := map[string]string{}  // the last message of each process
	prevRec := map[string]string{}   // the last message of each process and logger header
	quarantined := map[string]bool{} // by stream
	prevRaw := map[string]string{}   // the last raw message of each stream
	recs := map[string]bool{}        // by key, where starts are known: the record's first line announces a fatal error
	for i := start; i < len(lines); i++ {
		p := parseLine(lines[i].Text, lines[i].Stream)
		if p.misplaced || (p.header == "" && lines[i].Stream == "stdout") {
			// On stdout vLLM writes only its logger's records (and
			// uvicorn its access lines): a line there without a header
			// is the rest of a long record another process's write cut
			// in two, maybe a client's text.
			continue
		}
		key := p.proc + "\x00" + p.header
		tb := tbs[key]
		msg := p.msg
		trimmed := strings.TrimLeft(msg, " ")
		last := prevProc[p.proc]
		if p.header != "" {
			last = prevRec[key]
		}
		raw := p.header == ""
		if raw {
			// uvicorn's announcement and Python's traceback are two
			// writes to one stream, the first maybe with a process
			// prefix, the second without.
			if prev := prevRaw[lines[i].Stream]; hasAnyPrefix(prev, handledAnnouncers) {
				last = prev
			}
			prevRaw[lines[i].Stream] = strings.TrimPrefix(strings.TrimLeft(msg, " "), "ERROR:    ")
		}
		prevProc[p.proc], prevRec[key] = msg, msg
		if raw && quarantined[lines[i].Stream] {
			continue
		}
		// What came before the line, where the guard's pump knows it.
		start := lines[i].Start
		if start == vllmlog.StartCR {
			continue // a rewrite, or a "\r" inside someone's text
		}
		known := !raw && start != vllmlog.StartUnknown
		if known && start == vllmlog.StartFresh {
			// A record's first line: its message is what the site's
			// format string starts with.
			recs[key] = hasAnyPrefix(msg, fatalAnnouncers) && engineSite(p.header)
			delete(tbs, key)
			tb = nil
		}
		if known && start == vllmlog.StartCRLF {
			if _, ok := recs[key]; !ok {
				continue // a record whose first line the ring cut
			}
			last = ""
		}
		switch {
		case vllmlog.IsTracebackHeader(trimmed):
			fatal := false
			switch {
			case tb != nil && (tb.chained || tb.exc || tb.in):
				fatal = tb.fatal
			case known:
				// logger.exception: the record's first line announces
				// it, at one of the engine's own sites.
				fatal = start == vllmlog.StartCRLF && recs[key]
			case !raw:
				fatal = hasAnyPrefix(last, fatalAnnouncers) && engineSite(p.header)
			default:
				fatal = !hasAnyPrefix(strings.TrimPrefix(strings.TrimLeft(last, " "), "ERROR:    "), handledAnnouncers)
			}
			tbs[key] = &tbState{in: true, fatal: fatal}
			out[i] = origin{body: true, fatal: fatal}
			continue
		case tb != nil && hasAnyPrefix(trimmed, chainers):
			tb.in, tb.exc, tb.chained = false, false, true
			continue
		case tb != nil && tb.chained && trimmed == "":
			continue
		case tb != nil && tb.in && (isFrame(msg) || strings.HasPrefix(msg, "    ") || trimmed == "" || isCarets(trimmed)):
			out[i] = origin{body: true, fatal: tb.fatal}
			continue
		case tb != nil && tb.in:
			// The first line after the body: the exception line.
			tb.in, tb.exc = false, true
			if tb.fatal {
				out[i] = origin{own: ownText(msg), fatal: true}
			} else if raw {
				quarantined[lines[i].Stream] = true
			}
			continue
		case tb != nil && tb.exc && (!raw || !isUvicorn(msg)):
			// The exception's message going on over more lines (NCCL's
			// "ncclUnhandledCudaError: …" / "Cuda failure 2 'out of
			// memory'", pydantic's field lines), or the same logger
			// record going on.
			if tb.fatal {
				out[i] = origin{own: ownText(msg), fatal: true}
			}
			continue
		}
		if tb != nil && !tb.chained {
			delete(tbs, key)
		}
		if known && start == vllmlog.StartCRLF {
			// A record going on past its traceback, or a message with
			// a newline in it: never a first line of anything.
			continue
		}
		switch {
		case !raw && engineSite(p.header) && isExceptionLine(msg):
			// An exception line of the engine's own logger record whose
			// first lines the excerpt cut: the engine's fatal error.
			tbs[key] = &tbState{exc: true, fatal: true}
			out[i] = origin{own: ownText(msg), fatal: true}
		case !raw:
			// A client's text with a newline in it goes on in a line
			// of its own under the same header (vLLM's formatter
			// repeats it): only the engine's own sites count.
			if hasAnyPrefix(msg, startupFacts) && engineSite(p.header) {
				out[i] = origin{own: msg, fatal: true}
			}
		case isUvicorn(msg):
			// uvicorn's refusal to bind (uvicorn/server.py: "[Errno %d]
			// error while attempting to bind on address %r: %s"): the
			// address is the configuration's, the rest strerror.
			if m := strings.TrimPrefix(msg, "ERROR:    "); len(m) < len(msg) && strings.HasPrefix(m, "[Errno ") &&
				strings.Contains(m, "] error while attempting to bind on address (") {
				out[i] = origin{own: m, fatal: true}
			}
		case isFrame(msg):
			// A traceback whose header the excerpt cut: whose it was
			// cannot be told, so none of it is evidence.
			tbs[key] = &tbState{in: true}
			out[i] = origin{body: true}
		case isExceptionLine(msg):
			// A bare exception line: its continuation lines follow.
			tbs[key] = &tbState{exc: true, fatal: true}
			out[i] = origin{own: ownText(msg), fatal: true}
		default:
			// A line a runtime printed from its start (NCCL, c10,
			// faulthandler): no client writes a line's start.
			out[i] = origin{own: ownText(msg), fatal: true}
		}
	}
	return out
}

func isUvicorn(msg string) bool { return hasAnyPrefix(msg, uvicornLevels) }

// isCarets: Python 3.11's markers under a source line ("    ^^^^^^").
func isCarets(s string) bool {
	return strings.Trim(s, "^~ ") == "" && s != ""
}

func hasAnyPrefix(s string, ps []string) bool {
	for _, p := range ps {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// quotedWords are quoted values that are a runtime's own word, not a
// client's: a worker's exception re-raised by the executor (vLLM 0.32.0
// v1/executor/multiproc_executor.py: "Worker failed with error '%s', please
// check the stack trace above for the root cause"), NCCL's CUDACHECK
// ("Cuda failure %d '%s'", cudaGetErrorString).
var quotedWords = []string{"Worker failed with error '", "Cuda failure "}

// ownText is msg up to its first quote: vLLM, PyTorch and the libraries
// quote every value they put in a message (repr, '%s', `%s`), and a
// client's text reaches a message only as such a value.
func ownText(msg string) string {
	for _, q := range quotedWords {
		if i := strings.Index(msg, q); i >= 0 && ownText(msg[:i]) == msg[:i] {
			j := i + len(q)
			if q == "Cuda failure " {
				k := strings.IndexByte(msg[j:], '\'')
				if k < 0 || k > 6 {
					break
				}
				j += k + 1
				if e := strings.IndexByte(msg[j:], '\''); e >= 0 {
					return msg[:j+e]
				}
				return msg
			}
			return msg[:j] + ownText(msg[j:])
		}
	}
	for i := 0; i < len(msg); i++ {
		switch c := msg[i]; {
		case c == '"' || c == '`':
			return msg[:i]
		case c == '\'' && (i == 0 || !isLetter(msg[i-1])):
			// An opening quote; one after a letter is an apostrophe
			// ("Can't", "the models's max seq len").
			return msg[:i]
		}
	}
	return msg
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func isExceptionLine(msg string) bool {
	_, ok := vllmlog.ExceptionType(msg)
	return ok
}

// engineFiles are the source files of vLLM's engine, its workers and its
// executors, as its logger's header names them ("[core.py:396]"): no
// request handler logs from them (the API server's sites are serving_*.py,
// api_server.py, launcher.py, request_logger.py, async_llm.py and the
// exception handlers; see docs/how-it-decides.md).
var engineFiles = []string{"core.py", "multiproc_executor.py", "gpu_worker.py", "gpu_model_runner.py", "model_runner.py",
	"worker.py", "worker_base.py", "llm_engine.py", "engine.py", "ray_distributed_executor.py", "ray_utils.py",
	"multiproc_worker_utils.py", "cpu_worker.py", "kv_cache_utils.py", "model_runner_base.py", "cuda.py", "parallel_state.py",
	"shm_broadcast.py", "ray_executor_v2.py", "executor_base.py", "gpu_executor.py", "cache_engine.py", "block_manager.py"}

// engineSite reports whether a logger header ("ERROR 06-02 09:39:03
// [core.py:396] ") names one of engineFiles.
func engineSite(header string) bool {
	h := strings.TrimRight(header, " ")
	h = strings.TrimSuffix(h, "]")
	c := strings.LastIndexByte(h, ':')
	if c < 0 {
		return false
	}
	h = h[:c]
	if i := strings.LastIndexAny(h, "[ /"); i >= 0 {
		h = h[i+1:] // the file's name (vLLM may print a path)
	}
	for _, f := range engineFiles {
		if h == f {
			return true
		}
	}
	return false
}
