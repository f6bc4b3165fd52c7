package cause

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// Facts are what a vLLM log says about the run it records (the last run
// when the log holds several). Zero values mean "not in the log".
type Facts struct {
	VLLMVersion          string   `json:"vllm_version,omitempty"`
	Model                string   `json:"model,omitempty"`
	NonDefaultArgs       string   `json:"non_default_args,omitempty"`
	GPUMemoryUtilization float64  `json:"gpu_memory_utilization,omitempty"`
	MaxNumSeqs           int      `json:"max_num_seqs,omitempty"`
	MaxModelLen          int      `json:"max_model_len,omitempty"`
	KVCacheTokens        int      `json:"kv_cache_tokens,omitempty"`
	KVCacheBlocks        int      `json:"kv_cache_gpu_blocks,omitempty"` // V0 "# GPU blocks"
	AvailableKVCacheGiB  *float64 `json:"available_kv_cache_gib,omitempty"`
	MaxConcurrency       string   `json:"max_concurrency,omitempty"`
	ModelLoadGiB         float64  `json:"model_load_gib,omitempty"`
	ModelLoadSeconds     float64  `json:"model_load_seconds,omitempty"`
	InitEngineSeconds    float64  `json:"init_engine_seconds,omitempty"`
	Ready                bool     `json:"ready"`
	ReadyLine            int      `json:"ready_line,omitempty"`
	Runs                 int      `json:"runs"`           // vLLM starts seen in the log
	RunStartLine         int      `json:"run_start_line"` // first line of the run classified
}

// Report is the offline diagnosis of a saved log (vllm-guard diagnose).
// It marshals to JSON for --json; WriteText prints it for a person.
type Report struct {
	Verdict
	Phase     Phase    `json:"phase"`
	Lines     int      `json:"lines"`
	Facts     Facts    `json:"facts"`
	NextSteps []string `json:"next_steps"`
}

// maxLogBytes bounds what Diagnose reads, so a wrong file cannot exhaust memory.
const maxLogBytes = 1 << 30

// Diagnose reads a whole saved vLLM log (plain, journalctl, docker or
// Kubernetes output), numbers its lines from 1, classifies the last run in
// it and extracts its facts. The exit status is unknown offline: a log with
// no failure in it gives Cause "".
func Diagnose(r io.Reader) (Report, error) { return diagnose(r, nil, nil) }

// diagnose is Diagnose with the report's leave-one-group-out switches (see
// scan.off and scan.fired).
func diagnose(r io.Reader, off map[string]bool, fired map[string]Cause) (Report, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxLogBytes+1))
	if err != nil {
		return Report{}, fmt.Errorf("diagnose: reading the log: %w", err)
	}
	if len(data) > maxLogBytes {
		return Report{}, fmt.Errorf("diagnose: the log is larger than %d MiB; pass its last part (e.g. tail -n 100000)", maxLogBytes>>20)
	}
	lines := SplitLines(string(data))
	s := scanWith(lines, true, off, fired, false)
	v := verdictOf(Exit{Lines: lines, Offline: true}, s)
	rep := Report{Verdict: v, Phase: PhaseStarting, Lines: len(lines)}
	rep.Facts = extractFacts(lines, s)
	if rep.Facts.Ready {
		rep.Phase = PhaseReady
	}
	if rep.Evidence == nil {
		rep.Evidence = []Line{}
	}
	rep.NextSteps = nextSteps(rep)
	return rep, nil
}

// SplitLines numbers the lines of a saved log from 1, splitting on "\n" only
// so the numbers match an editor's (a tqdm "\r" stays inside its line).
func SplitLines(text string) []Line {
	n := strings.Count(text, "\n") + 1
	out := make([]Line, 0, n)
	for i := 1; text != ""; i++ {
		j := strings.IndexByte(text, '\n')
		if j < 0 {
			out = append(out, Line{N: i, Text: text})
			break
		}
		out = append(out, Line{N: i, Text: text[:j]})
		text = text[j+1:]
	}
	return out
}

func extractFacts(lines []Line, s *scan) Facts {
	f := Facts{Runs: countBanners(lines)}
	if f.Runs == 0 && len(lines) > 0 {
		f.Runs = 1 // a log cut after the banner still records one start
	}
	if len(lines) > 0 {
		f.RunStartLine = lines[s.start].N
	}
	if s.ready {
		f.Ready = true
		f.ReadyLine = lines[s.readyLine].N
	}
	for i := s.start; i < len(lines); i++ {
		m := vllmlog.Message(lines[i].Text)
		switch {
		case strings.Contains(m, "server version "):
			rest := after(m, "server version ")
			f.VLLMVersion = firstToken(rest, ", ")
			if mod := after(rest, "serving model "); mod != "" {
				f.Model = firstToken(mod, " ,")
			}
		case strings.Contains(m, "LLM engine (v"):
			if f.VLLMVersion == "" {
				f.VLLMVersion = firstToken(after(m, "LLM engine (v"), ")")
			}
			if f.Model == "" {
				f.Model = strings.Trim(firstToken(after(m, "model="), ", "), "'\"")
			}
			if f.MaxModelLen == 0 {
				f.MaxModelLen = int(number(m, "max_seq_len"))
			}
		case strings.Contains(m, "non-default args: "):
			f.NonDefaultArgs = clip(after(m, "non-default args: "), 2000)
			f.GPUMemoryUtilization = numberOr(m, "gpu_memory_utilization", f.GPUMemoryUtilization)
			f.MaxNumSeqs = int(numberOr(m, "max_num_seqs", float64(f.MaxNumSeqs)))
			f.MaxModelLen = int(numberOr(m, "max_model_len", float64(f.MaxModelLen)))
			for _, k := range []string{"'model_tag': '", "'model': '"} {
				if mod := after(m, k); mod != "" {
					f.Model = firstToken(mod, "'")
					break
				}
			}
		case strings.HasPrefix(m, "args: Namespace("): // V0
			f.GPUMemoryUtilization = numberOr(m, "gpu_memory_utilization", f.GPUMemoryUtilization)
			f.MaxNumSeqs = int(numberOr(m, "max_num_seqs", float64(f.MaxNumSeqs)))
			f.MaxModelLen = int(numberOr(m, "max_model_len", float64(f.MaxModelLen)))
			if mod := after(m, "model='"); mod != "" && f.Model == "" {
				f.Model = firstToken(mod, "'")
			}
		case strings.Contains(m, "Using max model len "):
			f.MaxModelLen = int(number(m, "Using max model len"))
		case strings.Contains(m, "GPU KV cache size: "):
			f.KVCacheTokens = int(number(m, "GPU KV cache size:"))
		case strings.Contains(m, "# GPU blocks: "):
			f.KVCacheBlocks = int(number(m, "# GPU blocks:"))
		case strings.Contains(m, "Available KV cache memory: "):
			if v, ok := numberOK(m, "Available KV cache memory:"); ok {
				f.AvailableKVCacheGiB = &v
			}
		case strings.Contains(m, "Maximum concurrency for "):
			f.MaxConcurrency = after(m, "Maximum concurrency for ")
		case strings.Contains(m, "Model loading took "):
			f.ModelLoadGiB = number(m, "Model loading took")
			f.ModelLoadSeconds = number(m, " and")
		case strings.Contains(m, "Loading model weights took "): // V0
			f.ModelLoadGiB = number(m, "Loading model weights took")
		case strings.Contains(m, "init engine") && strings.Contains(m, " took "):
			f.InitEngineSeconds = number(m, ") took")
		}
	}
	return f
}

func countBanners(lines []Line) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l.Text, "vLLM API server version") || strings.Contains(l.Text, "vLLM server version") {
			n++
		}
	}
	return n
}

// after returns what follows the first key in s, or "".
func after(s, key string) string {
	i := strings.Index(s, key)
	if i < 0 {
		return ""
	}
	return s[i+len(key):]
}

func firstToken(s, stops string) string {
	if i := strings.IndexAny(s, stops); i >= 0 {
		return s[:i]
	}
	return s
}

// numberOK reads the number after key, skipping "': ", "=", ":" and spaces,
// ignoring thousands separators ("425,424").
func numberOK(s, key string) (float64, bool) {
	rest := after(s, key)
	rest = strings.TrimLeft(rest, "'\": =")
	j := 0
	for j < len(rest) && (isDigit(rest[j]) || rest[j] == '.' || rest[j] == ',' || (j == 0 && rest[j] == '-')) {
		j++
	}
	num := strings.TrimRight(strings.ReplaceAll(rest[:j], ",", ""), ".")
	v, err := strconv.ParseFloat(num, 64)
	return v, err == nil
}

func number(s, key string) float64 {
	v, _ := numberOK(s, key)
	return v
}

func numberOr(s, key string, old float64) float64 {
	if v, ok := numberOK(s, key); ok {
		return v
	}
	return old
}

// nextSteps follows the postmortem's order: memory trend, the log,
// concurrency and utilization together, probe alignment.
func nextSteps(r Report) []string {
	f := r.Facts
	var out []string

	switch r.Cause {
	case CauseHostOOM:
		out = append(out, "memory trend: look at host (not GPU) memory of the unit or container before the kill (systemd-cgtop, container memory metrics, the kernel's oom-kill line): a climb points at CPU offload, many API server processes or a leak")
	case CauseGPUFault:
		out = append(out, "the GPU's own record: the kernel's Xid lines around the time of the death (dmesg -T | grep -i xid, journalctl -k), nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT, and whether the same GPU failed before (vllm-guard incidents): a repeat on one GPU is the hardware, the same fault on every GPU is more likely the software")
	case CauseOOM, CauseKVInsufficient, CauseGPUBusy:
		out = append(out, "memory trend: look at GPU memory in the minutes before the death (vllm-guard incidents keeps the samples; vllm-guard status shows the trend): a steady climb means growth outside the KV cache (long prefills, fragmentation, a leak), a jump means one burst; memory already high at start means another tenant or an orphan")
	default:
		out = append(out, "memory trend: check GPU memory before the event (vllm-guard incidents, vllm-guard status) to rule memory in or out")
	}

	logStep := fmt.Sprintf("the log: the run classified starts at line %d", f.RunStartLine)
	if len(r.Evidence) > 0 {
		logStep += fmt.Sprintf("; read upward from line %d to the first error of each process (tracebacks of several processes interleave)", r.Evidence[0].N)
	} else if r.Cause != "" {
		logStep += "; no root-cause line was found: rerun with VLLM_LOGGING_LEVEL=DEBUG to capture it"
	}
	if f.Runs > 1 {
		logStep += fmt.Sprintf("; the log holds %d starts, only the last is classified", f.Runs)
	}
	out = append(out, logStep)

	cu := "concurrency and utilization together: max_num_seqs"
	if f.MaxNumSeqs > 0 {
		cu += fmt.Sprintf(" (%d)", f.MaxNumSeqs)
	}
	cu += " sets the activation peak, gpu_memory_utilization"
	if f.GPUMemoryUtilization > 0 {
		cu += fmt.Sprintf(" (%.2f)", f.GPUMemoryUtilization)
	}
	cu += " the KV budget; change them as a pair"
	if f.KVCacheTokens > 0 {
		cu += fmt.Sprintf("; KV cache %d tokens", f.KVCacheTokens)
	}
	if f.MaxConcurrency != "" {
		cu += "; max concurrency " + f.MaxConcurrency
	}
	if f.MaxModelLen > 0 {
		cu += fmt.Sprintf("; max model len %d", f.MaxModelLen)
	}
	out = append(out, cu)

	probe := "probe alignment: readiness must wait for \"Application startup complete.\" and a real answer, never a timer or an open port"
	if f.InitEngineSeconds > 0 {
		probe += fmt.Sprintf("; engine init took %.0f s here, so startup/readiness timeouts (systemd TimeoutStartSec, Kubernetes startupProbe, [readiness] stall_timeout) must exceed load time with margin", f.InitEngineSeconds)
	}
	out = append(out, probe)
	return out
}

// WriteText prints the report for a person: cause, evidence with line
// numbers, facts, advice, then the next steps.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	cause := string(r.Cause)
	if cause == "" {
		cause = "none"
	}
	fmt.Fprintf(&b, "cause:      %s", cause)
	if r.Confidence != "" {
		fmt.Fprintf(&b, " (confidence %s)", r.Confidence)
	}
	fmt.Fprintf(&b, "\nsummary:    %s\n", r.Summary)
	fmt.Fprintf(&b, "phase:      %s (%d lines read)\n", r.Phase, r.Lines)
	if len(r.Evidence) > 0 {
		b.WriteString("evidence:\n")
		for _, l := range r.Evidence {
			fmt.Fprintf(&b, "  %6d | %s\n", l.N, clip(l.Text, 400))
		}
	}
	f := r.Facts
	b.WriteString("facts:\n")
	fact := func(k, v string) { fmt.Fprintf(&b, "  %-24s %s\n", k+":", v) }
	if f.VLLMVersion != "" {
		fact("vLLM version", f.VLLMVersion)
	}
	if f.Model != "" {
		fact("model", f.Model)
	}
	if f.NonDefaultArgs != "" {
		fact("non-default args", clip(f.NonDefaultArgs, 300))
	}
	if f.GPUMemoryUtilization > 0 {
		fact("gpu_memory_utilization", strconv.FormatFloat(f.GPUMemoryUtilization, 'f', -1, 64))
	}
	if f.MaxNumSeqs > 0 {
		fact("max_num_seqs", strconv.Itoa(f.MaxNumSeqs))
	}
	if f.MaxModelLen > 0 {
		fact("max model len", strconv.Itoa(f.MaxModelLen))
	}
	if f.AvailableKVCacheGiB != nil {
		fact("available KV memory", fmt.Sprintf("%.2f GiB", *f.AvailableKVCacheGiB))
	}
	if f.KVCacheTokens > 0 {
		fact("KV cache size", fmt.Sprintf("%d tokens", f.KVCacheTokens))
	}
	if f.KVCacheBlocks > 0 {
		fact("KV cache GPU blocks", strconv.Itoa(f.KVCacheBlocks))
	}
	if f.MaxConcurrency != "" {
		fact("max concurrency", f.MaxConcurrency)
	}
	if f.ModelLoadGiB > 0 || f.ModelLoadSeconds > 0 {
		fact("model load", fmt.Sprintf("%.2f GiB, %.2f s", f.ModelLoadGiB, f.ModelLoadSeconds))
	}
	if f.InitEngineSeconds > 0 {
		fact("engine init", fmt.Sprintf("%.2f s", f.InitEngineSeconds))
	}
	ready := "no"
	if f.Ready {
		ready = fmt.Sprintf("yes (line %d)", f.ReadyLine)
	}
	fact("became ready", ready)
	fact("starts in log", fmt.Sprintf("%d (classified the one from line %d)", f.Runs, f.RunStartLine))
	if len(r.Advice) > 0 {
		b.WriteString("advice:\n")
		for _, a := range r.Advice {
			fmt.Fprintf(&b, "  - %s\n", a)
		}
	}
	b.WriteString("next steps:\n")
	for i, s := range r.NextSteps {
		fmt.Fprintf(&b, "  %d. %s\n", i+1, s)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
