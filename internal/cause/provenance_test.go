package cause

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// Issue 41: vLLM quotes its clients in its own lines. clientFamilies are
// those lines as vLLM 0.32.0 prints them (docs/how-it-decides.md, "Lines
// that quote a client", names each site), with X where the client's text
// goes; each renders a payload the way its site does: repr'd (a newline
// becomes \n), or raw, where vLLM's formatter repeats the record's header
// on every line of a newline-bearing message, or a traceback's exception
// message that Python prints as it is.
type clientFamily struct {
	name   string
	render func(x string) []chunk
	// startsOnly: a site at one of the engine's own files that prints a
	// client's text raw; only what came before each line (the guard's pump
	// knows it, a saved log does not) tells its continuation lines from
	// a record's first line.
	startsOnly bool
	// stdoutOnly: the family is harmless only while vLLM's logger keeps
	// to stdout (its default).
	stdoutOnly bool
}

// chunk is one write of vLLM's: a stream and its bytes.
type chunk struct{ stream, data string }

const (
	apiProc = "(APIServer pid=41) "
	engProc = "(EngineCore_DP0 pid=77) "
)

// record renders one record of vLLM's logger as it writes it, on stdout:
// a message with newlines goes on after "\r\n" under the same header
// (vllm/logging_utils/formatter.py NewLineFormatter).
func record(proc, header, msg string) []chunk {
	h := proc + header
	return []chunk{{"stdout", h + strings.ReplaceAll(msg, "\n", "\r\n"+h) + "\n"}}
}

// raw renders lines printed without vLLM's formatter, on stderr
// (Python's tracebacks, uvicorn's errors).
func raw(ls ...string) []chunk { return []chunk{{"stderr", strings.Join(ls, "\n") + "\n"}} }

// toLines cuts writes into lines as the guard's pump does, one splitter
// per stream; starts says whether the lines keep what came before them
// (the live guard) or not (a saved log).
func toLines(cs []chunk, starts bool) []Line {
	split := map[string]*vllmlog.Splitter{}
	var out []Line
	for _, c := range cs {
		sp := split[c.stream]
		if sp == nil {
			sp = &vllmlog.Splitter{}
			split[c.stream] = sp
		}
		sp.WriteStart([]byte(c.data), func(b []byte, st vllmlog.LineStart) {
			if strings.TrimSpace(string(b)) == "" {
				return // the pump drops blank lines
			}
			if !starts {
				st = vllmlog.StartUnknown
			}
			out = append(out, Line{N: len(out) + 1, Stream: c.stream, Text: string(b), Start: st})
		})
	}
	return out
}

// pyRepr is Python's repr of a str, enough for the test: quotes and
// escapes of newlines and backslashes.
func pyRepr(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, "\n", `\n`)
	s = strings.ReplaceAll(s, "\r", `\r`)
	s = strings.ReplaceAll(s, "'", `\'`)
	return "'" + s + "'"
}

func oneLine(s string) string { return strings.NewReplacer("\n", " ", "\r", " ").Replace(s) }

var clientFamilies = []clientFamily{
	// entrypoints/openai/chat_completion/serving.py:274 (and responses,
	// batch, render, token_in_token_out): an ErrorResponse's str, its
	// message from entrypoints/serve/engine/serving.py:213.
	{name: "Error with model (model name)", render: func(x string) []chunk {
		return record(apiProc, "ERROR 12-06 07:00:00 [serving.py:274] ",
			"Error with model error=ErrorInfo(message="+pyRepr("The model `"+x+"` does not exist.")+", type='NotFoundError', param='model', code=404)")
	}},
	// v1/engine/async_llm.py:578 with --enable-log-requests: X-Request-Id
	// (a header: no newline), or the body's request_id (raw: newlines).
	{name: "Added request (X-Request-Id)", render: func(x string) []chunk {
		return record(apiProc, "INFO 12-06 07:00:00 [async_llm.py:578] ", "Added request "+oneLine(x)+".")
	}},
	{name: "Added request (the body's request_id)", render: func(x string) []chunk {
		return record(apiProc, "INFO 12-06 07:00:00 [async_llm.py:578] ", "Added request chatcmpl-"+x+".")
	}},
	{name: "Aborted request(s)", render: func(x string) []chunk {
		return record(apiProc, "INFO 12-06 07:00:00 [async_llm.py:922] ", "Aborted request(s) "+x+".")
	}},
	// v1/engine/async_llm.py:795: the request id and an exception's str.
	{name: "Request failed (bad request)", render: func(x string) []chunk {
		return record(apiProc, "INFO 12-06 07:00:00 [async_llm.py:795] ", "Request "+x+" failed (bad request): "+x+".")
	}},
	// entrypoints/serve/utils/request_logger.py:65.
	{name: "Received request", render: func(x string) []chunk {
		return record(apiProc, "INFO 12-06 07:00:00 [request_logger.py:65] ",
			"Received request "+x+": params: SamplingParams(n=1), lora_request: "+pyRepr(x)+".")
	}},
	// uvicorn's access line, on stdout: the client field (X-Forwarded-For
	// behind 127.0.0.1) and the path.
	{name: "uvicorn access line", render: func(x string) []chunk {
		return []chunk{{"stdout", `INFO:     ` + oneLine(x) + `:0 - "GET /` + oneLine(x) + ` HTTP/1.1" 404 Not Found` + "\n"}}
	}},
	// entrypoints/openai/models/serving.py:226, 339: LoRA names and paths.
	{name: "LoRA adapter", render: func(x string) []chunk {
		return append(record(apiProc, "INFO 12-06 07:00:00 [serving.py:226] ", "Loaded new LoRA adapter: name '"+x+"', path '"+x+"'"),
			record(apiProc, "WARNING 12-06 07:00:00 [serving.py:339] ", "Failed to load LoRA '"+x+"' resolved by r: "+x+". Trying next resolver.")...)
	}},
	// renderers/hf.py:839: a template error's str, raw.
	{name: "Chat template rejected", render: func(x string) []chunk {
		return record(apiProc, "WARNING 12-06 07:00:00 [hf.py:839] ", "Chat template rejected the request: "+x)
	}},
	// entrypoints/serve/exception_handling/handlers/vllm_error.py:54:
	// logger.exception, the exception's message built from the request.
	{name: "Engine Exception caught (handled traceback)", render: func(x string) []chunk {
		return record(apiProc, "ERROR 12-06 07:00:00 [vllm_error.py:54] ",
			"Engine Exception caught. Request id: "+x+"\nTraceback (most recent call last):\n"+
				`  File "/usr/lib/python3.12/site-packages/vllm/v1/engine/async_llm.py", line 640, in generate`+"\n    raise ValueError(msg)\nValueError: "+x)
	}},
	// uvicorn's "Exception in ASGI application": the traceback raw on
	// stderr, the message as Python prints it.
	{name: "Exception in ASGI application", render: func(x string) []chunk {
		return raw("ERROR:    Exception in ASGI application", "Traceback (most recent call last):",
			`  File "/usr/lib/python3.12/site-packages/starlette/routing.py", line 74, in app`, "    response = await f(request)",
			"ValueError: "+x)
	}},
	// v1/engine/core.py:2056: the engine's handled error for one request,
	// at one of the engine's own files, the body's request_id raw.
	{name: "Unexpected error pre-processing request", startsOnly: true, render: func(x string) []chunk {
		return record(engProc, "ERROR 12-06 07:00:00 [core.py:2056] ",
			"Unexpected error pre-processing request "+x+"\nTraceback (most recent call last):\n"+
				`  File "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 2050, in preprocess_add_request`+"\n    raise ValueError(x)\nValueError: "+x)
	}},
	// A long record (an X-Request-Id of many KiB) that another process's
	// write cut in two on the shared stdout pipe: its rest is a line of
	// its own, without a header.
	{name: "the rest of a long record, cut", stdoutOnly: true, render: func(x string) []chunk {
		return []chunk{{"stdout", apiProc + "INFO 12-06 07:00:00 [async_llm.py:578] Added request " + strings.Repeat("a", 64)},
			{"stdout", engProc + "INFO 12-06 07:00:00 [loggers.py:257] Engine 000: Avg prompt throughput: 0.0 tokens/s\n"},
			{"stdout", oneLine(x) + ".\n"}}
	}},
	// v1/engine/core.py:2011: the engine's warning, the request id raw.
	{name: "Multi-modal cache miss", startsOnly: true, render: func(x string) []chunk {
		return record(engProc, "WARNING 12-06 07:00:00 [core.py:2011] ",
			"Multi-modal cache miss for request "+x+" (mm_hashes=['"+x+"']): P0/P1 cache drift; returning a retryable response")
	}},
}

// hostilePayloads are every cause's signature words, and whole structured
// lines of each, with and without newlines.
func hostilePayloads() []string {
	out := []string{
		"Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
		"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
		"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
		"[Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
		"OSError: [Errno 98] Address already in use",
		"ValueError: Free memory on device cuda:0 (1.0/80.0 GiB) on startup is less than desired GPU memory utilization (0.9, 72 GiB).",
		"RuntimeError: CUDA error: uncorrectable ECC error encountered",
		"pynvml.NVMLError_GPUIsLost: GPU is lost",
		"ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
		"Watchdog caught collective operation timeout",
		"vllm serve: error: unrecognized arguments: --x",
		"huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. Repository Not Found",
		"No available shared memory broadcast block found in 60 seconds.",
	}
	for _, r := range rules {
		out = append(out, r.needle)
	}
	out = append(out, wrappers...)
	out = append(out, startupFacts...)
	var nl []string
	for _, p := range out {
		nl = append(nl, "x\n"+p, "\n"+p+"\n", "x'\n"+p)
	}
	for _, p := range []string{
		"Traceback (most recent call last):\n  File \"/x/vllm/v1/engine/core.py\", line 1, in run\n    raise\ntorch.OutOfMemoryError: CUDA out of memory.",
		"EngineCore failed to start.\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n    f()\ntorch.OutOfMemoryError: CUDA out of memory.",
		"\nERROR 12-06 07:00:00 [gpu_worker.py:239] Free memory on device cuda:0 (1.0/80.0 GiB) on startup is less than desired GPU memory utilization (0.9, 72 GiB).",
		"\n(EngineCore_DP0 pid=77) ERROR 12-06 07:00:00 [core.py:866] RuntimeError: CUDA error: uncorrectable ECC error encountered",
		"\n(EngineCore_DP0 pid=77) torch.OutOfMemoryError: CUDA out of memory.",
		"\n[rank0]: torch.OutOfMemoryError: CUDA out of memory.",
	} {
		nl = append(nl, p)
	}
	return append(out, nl...)
}

func randomPayload(r *rand.Rand, pool []string) string {
	var b strings.Builder
	for range 1 + r.IntN(4) {
		switch r.IntN(4) {
		case 0:
			b.WriteString(pool[r.IntN(len(pool))])
		case 1:
			b.WriteString("\n")
		case 2:
			for range r.IntN(20) {
				b.WriteByte(byte(32 + r.IntN(95)))
			}
		default:
			b.WriteString([]string{"'", "`", "\"", ": ", "(", ")", "] ", "    "}[r.IntN(8)])
		}
	}
	return b.String()
}

// deaths are deaths whose cause the client's lines must leave as it is.
func deaths() []struct {
	name          string
	exit          Exit
	before, after []chunk
} {
	ready := []chunk{{"stdout", apiProc + "INFO:     Application startup complete.\n"}}
	oomTB := record(engProc, "ERROR 12-06 07:00:01 [core.py:1512] ", "EngineCore encountered a fatal error.\nTraceback (most recent call last):\n"+
		`  File "/x/vllm/v1/worker/gpu_model_runner.py", line 3000, in execute_model`+"\n    return self.model(x)\n"+
		"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
	healthy := &GPUEvidence{Before: []GPUDevice{{Index: 0, UUID: "GPU-1"}}, After: []GPUDevice{{Index: 0, UUID: "GPU-1"}}}
	return []struct {
		name          string
		exit          Exit
		before, after []chunk
	}{
		{"SIGKILL while ready", Exit{Signal: "SIGKILL", ExitCode: -1, Phase: PhaseReady}, ready, nil},
		{"SIGKILL while ready, NVML watching", Exit{Signal: "SIGKILL", ExitCode: -1, Phase: PhaseReady, GPU: healthy, Critical: 0.97, MemFractions: []float64{0.5}}, ready, nil},
		{"exit 1 while ready", Exit{ExitCode: 1, Phase: PhaseReady}, ready, nil},
		{"exit 1 while starting", Exit{ExitCode: 1, Phase: PhaseStarting}, nil, nil},
		{"an engine OOM after the client", Exit{ExitCode: 1, Phase: PhaseReady}, ready, oomTB},
	}
}

func check(t *testing.T, family, payload string, e Exit, want Verdict) {
	t.Helper()
	v := Classify(e)
	if v.Cause != want.Cause {
		t.Fatalf("%s with %q: cause %s, want %s (summary %q, evidence %+v)", family, payload, v.Cause, want.Cause, v.Summary, v.Evidence)
	}
	if (v.GPU != nil && v.GPU.Reset) != (want.GPU != nil && want.GPU.Reset) {
		t.Fatalf("%s with %q: needs-reset %v", family, payload, v.GPU)
	}
}

// withClient puts a family's writes between a death's, each on the
// stream vLLM 0.32.0 writes it to, and cuts them into lines.
func withClient(before []chunk, f clientFamily, x string, after []chunk, starts bool) []Line {
	return withClientOn(before, f, x, after, starts, false)
}

// withClientOn is withClient where vLLM's logger may write to stderr
// (VLLM_LOGGING_STREAM=ext://sys.stderr).
func withClientOn(before []chunk, f clientFamily, x string, after []chunk, starts, allStderr bool) []Line {
	var cs []chunk
	cs = append(cs, before...)
	if f.render != nil {
		cs = append(cs, f.render(x)...)
	}
	cs = append(cs, after...)
	if allStderr {
		cs = slices.Clone(cs)
		for i := range cs {
			cs[i].stream = "stderr"
		}
	}
	return toLines(cs, starts)
}

// TestClientLinesNeverChangeTheCause is issue 41's property at the
// classifier: for every line family that quotes a client, hostile and
// random contents never change the cause of a death from what it is
// without them, read as the live guard reads (what came before each line
// known) and as a saved excerpt is (not known; then the engine's own sites
// that print a client's text raw are left out: only the starts tell their
// continuation lines from a record's first line).
func TestClientLinesNeverChangeTheCause(t *testing.T) {
	pool := hostilePayloads()
	r := rand.New(rand.NewPCG(41, 41))
	payloads := append([]string{}, pool...)
	for range 300 {
		payloads = append(payloads, randomPayload(r, pool))
	}
	for _, mode := range []struct{ starts, allStderr bool }{{true, false}, {false, false}, {true, true}} {
		starts := mode.starts
		for _, d := range deaths() {
			e := d.exit
			e.Lines = withClientOn(d.before, clientFamily{}, "", d.after, starts, mode.allStderr)
			want := Classify(e)
			if d.name == "an engine OOM after the client" && want.Cause != CauseOOM && !mode.allStderr {
				t.Fatalf("the engine's OOM traceback alone: %s, want oom", want.Cause)
			}
			if strings.HasPrefix(d.name, "SIGKILL") && want.Cause != CauseCrash {
				t.Fatalf("%s alone: %s, want crash", d.name, want.Cause)
			}
			for _, f := range clientFamilies {
				if (f.startsOnly && !starts) || (f.stdoutOnly && mode.allStderr) {
					continue
				}
				for _, p := range payloads {
					e.Lines = withClientOn(d.before, f, p, d.after, starts, mode.allStderr)
					check(t, fmt.Sprintf("%s (starts %v, all on stderr %v): %s", d.name, starts, mode.allStderr, f.name), p, e, want)
				}
			}
		}
	}
}

// The issue's own lines, as the review found them on vLLM 0.32.0.
func TestIssue41ModelNameLines(t *testing.T) {
	for _, model := range []string{
		"Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
		"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
		"[Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
	} {
		l := "(APIServer pid=1208) ERROR 12-06 06:40:11 [serving.py:274] Error with model error=ErrorInfo(message='The model `" + model +
			"` does not exist.', type='NotFoundError', param='model', code=404)"
		v := Classify(Exit{Signal: "SIGKILL", ExitCode: -1, Phase: PhaseReady, Lines: lines("(APIServer pid=1208) INFO:     Application startup complete.", l)})
		if v.Cause != CauseCrash {
			t.Errorf("model %q: cause %s, want crash (%s)", model, v.Cause, v.Summary)
		}
	}
}

// FuzzClientLine: whatever a client writes into any family, the SIGKILL
// of a ready vLLM stays a crash.
func FuzzClientLine(f *testing.F) {
	for _, p := range hostilePayloads() {
		f.Add(p, uint8(0))
	}
	f.Fuzz(func(t *testing.T, x string, fam uint8) {
		fm := clientFamilies[int(fam)%len(clientFamilies)]
		e := Exit{Signal: "SIGKILL", ExitCode: -1, Phase: PhaseReady,
			Lines: withClient([]chunk{{"stdout", apiProc + "INFO:     Application startup complete.\n"}}, fm, x, nil, true)}
		check(t, fm.name, x, e, Verdict{Cause: CauseCrash})
	})
}

// A hardware word in the log, with NVML watching a healthy GPU, never
// makes the GPU one that needs a reset.
func TestLogNeverResetsAGPUNVMLSawHealthy(t *testing.T) {
	ls := lines(engProc+"Traceback (most recent call last):",
		engProc+`  File "/x/vllm/v1/worker/gpu_model_runner.py", line 1, in f`,
		engProc+"    f()",
		engProc+"pynvml.NVMLError_GPUIsLost: GPU is lost")
	without := Classify(Exit{ExitCode: 1, Lines: ls})
	if without.Cause != CauseGPUFault || without.GPU == nil || !without.GPU.Reset {
		t.Fatalf("no NVML: %+v, want gpu_fault needing a reset", without)
	}
	healthy := &GPUEvidence{Before: []GPUDevice{{Index: 0, UUID: "GPU-1"}}, After: []GPUDevice{{Index: 0, UUID: "GPU-1"}}}
	with := Classify(Exit{ExitCode: 1, Lines: ls, GPU: healthy})
	if with.GPU != nil && with.GPU.Reset {
		t.Fatalf("NVML saw the GPU healthy, yet: %+v", with)
	}
}

// FuzzProvenance: any lines, any starts and streams: no panic, and the
// text the rules may read is always text of its own line.
func FuzzProvenance(f *testing.F) {
	f.Add("(EngineCore_DP0 pid=7) ERROR 12-06 07:00:00 [core.py:1512] EngineCore encountered a fatal error.\n(EngineCore_DP0 pid=7) ERROR 12-06 07:00:00 [core.py:1512] Traceback (most recent call last):\nTimeoutError", []byte{1, 2, 2})
	f.Add("ERROR:    Exception in ASGI application\nTraceback (most recent call last):\n  File \"x\", line 1, in f\n    f()\nValueError: 'x'\nOSError: [Errno 98]", []byte{1, 1, 1, 1, 1, 3})
	f.Fuzz(func(t *testing.T, text string, starts []byte) {
		ls := SplitLines(text)
		for i := range ls {
			if i < len(starts) {
				ls[i].Start = vllmlog.LineStart(starts[i] % 4)
				if starts[i]&4 != 0 {
					ls[i].Stream = "stderr"
				}
			}
		}
		out := provenance(ls, 0)
		if len(out) != len(ls) {
			t.Fatalf("%d origins for %d lines", len(out), len(ls))
		}
		for i, o := range out {
			if o.own != "" && !strings.Contains(vllmlog.StripANSI(ls[i].Text), o.own) {
				t.Fatalf("line %d %q: own text %q is not on it", i, ls[i].Text, o.own)
			}
		}
		Classify(Exit{Lines: ls, ExitCode: 1})
	})
}

// A saved log (vllm-guard diagnose) is read word by word, but never in the
// lines vLLM prints to quote a client: a healthy log with the issue's
// requests in it stays healthy. (Newlines inside such a message make lines
// only the live guard can place: see TestClientLinesNeverChangeTheCause.)
func TestDiagnoseSkipsClientQuotingLines(t *testing.T) {
	ready := []chunk{{"stdout", apiProc + "INFO:     Application startup complete.\n"}}
	for _, f := range clientFamilies {
		if f.name == "Exception in ASGI application" || f.name == "Engine Exception caught (handled traceback)" || f.name == "Unexpected error pre-processing request" {
			continue // tracebacks: their exception lines are read offline
		}
		if f.stdoutOnly {
			continue // a saved log does not say which stream a line was on
		}
		for _, p := range hostilePayloads() {
			p = oneLine(p)
			var text strings.Builder
			for _, l := range withClient(ready, f, p, nil, false) {
				text.WriteString(l.Text + "\n")
			}
			rep, err := Diagnose(strings.NewReader(text.String()))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Cause != "" {
				t.Fatalf("%s with %q: diagnose says %s (%s)", f.name, p, rep.Cause, rep.Summary)
			}
		}
	}
}
