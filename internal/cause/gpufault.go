// gpu_fault: the GPU itself failed. Decided from the GPU's own word (NVML:
// XID events, uncorrected ECC counts, remapped rows, a lost device) first
// and from vLLM's log second, and split by what a restart can do: a fault
// that needs a GPU reset or the node drained is never restarted into; a
// survivable one restarts on the same rung once, and a second within
// give_up_window is treated as needing a reset.

package cause

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// XIDInfo is what NVIDIA's XID catalogue says of one XID, in short.
type XIDInfo struct {
	Meaning string
	// Reset: the GPU needs a reset (or the node a reboot) before it can be
	// trusted again; a restart of vLLM on it would fail or corrupt.
	Reset bool
	// App: usually the application's own fault (a bad kernel, an illegal
	// address): evidence, not a reason to stop vLLM while it still runs.
	App bool
	// Ends: the driver tore down the contexts on the GPU (vLLM's included):
	// the run is over even if vLLM has not noticed yet.
	Ends bool
}

// xids is a small table written from NVIDIA's XID catalogue (the "Xid
// Errors" guide and its catalogue of resolutions): the XIDs an inference
// server meets, what they mean and whether a reset is needed.
var xids = map[int]XIDInfo{
	13: {Meaning: "graphics engine exception (usually the application: an illegal instruction or address)", App: true},
	31: {Meaning: "GPU memory page fault (usually the application: an illegal address)", App: true},
	43: {Meaning: "GPU stopped processing (the application's context hit a fault)", App: true},
	// 45 is also what the driver logs for the channels of any process
	// killed while it used the GPU (an OOM kill, the guard's own stop):
	// evidence, never a reason to stop vLLM by itself.
	45:  {Meaning: "preemptive cleanup after an earlier error or a killed process (its contexts on the GPU were torn down)"},
	48:  {Meaning: "double-bit (uncorrectable) ECC error", Reset: true, Ends: true},
	61:  {Meaning: "internal micro-controller breakpoint/warning", Reset: true, Ends: true},
	62:  {Meaning: "internal micro-controller halt", Reset: true, Ends: true},
	63:  {Meaning: "ECC page retirement or row remapping recorded (takes effect at the next GPU reset)"},
	64:  {Meaning: "ECC page retirement or row remapper recording failure"},
	74:  {Meaning: "NVLink error", Reset: true, Ends: true},
	79:  {Meaning: "GPU has fallen off the bus", Reset: true, Ends: true},
	92:  {Meaning: "high single-bit ECC error rate"},
	94:  {Meaning: "contained ECC error (the affected application was stopped; the GPU serves on)", Ends: true},
	95:  {Meaning: "uncontained ECC error", Reset: true, Ends: true},
	119: {Meaning: "GSP RPC timeout", Reset: true, Ends: true},
	120: {Meaning: "GSP error", Reset: true, Ends: true},
}

// xid92Threshold: XID 92 (a high single-bit ECC rate) this many times in
// one run means the memory is going: treated as needing a reset.
const xid92Threshold = 3

// XIDMeaning returns the catalogue's words for xid ("XID n: see NVIDIA's
// XID catalogue" for one not in the table).
func XIDMeaning(xid int) string {
	if x, ok := xids[xid]; ok {
		return x.Meaning
	}
	return "not in vllm-guard's table: see NVIDIA's XID catalogue"
}

// GPUEvidence is what NVML said of the run's GPUs: at its start (Before)
// and now (After, with the XIDs since the start).
type GPUEvidence struct {
	Before []GPUDevice
	After  []GPUDevice
	// Unkillable: vLLM's processes still alive after every kill round
	// (stuck in the kernel: on a GPU host, in the driver). No restart
	// goes well beside them; the GPU needs a reset or the node a reboot.
	Unkillable []int
}

// GPUDevice is one GPU's hardware state at one moment.
type GPUDevice struct {
	Index         int
	UUID          string
	XIDs          []int // XID events of the run, oldest first (After only)
	DoubleBitECC  int   // double-bit ECC events of the run (After only)
	Lost          bool
	ResetRequired bool
	ECCKnown      bool
	ECCVolatile   uint64 // uncorrected, since the driver loaded
	RemapKnown    bool
	RemapPending  bool
	RemapFailure  bool
	RetiredKnown  bool
	RetiredPend   bool
}

// GPUFault is the evidence and the verdict of a gpu_fault.
type GPUFault struct {
	Device    int    `json:"device"` // NVML index, -1 when the log does not say
	UUID      string `json:"uuid,omitempty"`
	XID       int    `json:"xid,omitempty"`
	Meaning   string `json:"meaning"`
	ECCBefore uint64 `json:"ecc_uncorrected_before,omitempty"`
	ECCAfter  uint64 `json:"ecc_uncorrected_after,omitempty"`
	// Reset: needs a GPU reset or the node drained; not restarted into.
	Reset bool `json:"needs_reset"`
	// Source: "nvml" or "log".
	Source string `json:"source"`
}

// What says which GPU and what to do, in the operator's words.
func (g *GPUFault) What() string {
	gpu := "the GPU"
	reset := "nvidia-smi -r -i <index>"
	if g.Device >= 0 {
		gpu = fmt.Sprintf("GPU %d", g.Device)
		if g.UUID != "" {
			gpu += " (" + g.UUID + ")"
		}
		reset = fmt.Sprintf("nvidia-smi -r -i %d", g.Device)
	}
	what := g.Meaning
	if g.XID > 0 {
		what = fmt.Sprintf("XID %d, %s", g.XID, g.Meaning)
	}
	if g.ECCAfter > g.ECCBefore {
		what += fmt.Sprintf("; uncorrected ECC errors %d→%d", g.ECCBefore, g.ECCAfter)
	}
	s := gpu + ": " + what
	if g.Reset {
		s += "; reset the GPU (" + reset + ") or drain the node and reboot it before vLLM runs on it again"
	}
	return s
}

// fault is one device's worst finding.
type fault struct {
	g    GPUFault
	rank int // 3: needs reset, 2: ends the run, 1: evidence only
}

// gpuFaults reads the evidence device by device; the worst first.
func gpuFaults(ev *GPUEvidence) []fault {
	if ev == nil {
		return nil
	}
	var out []fault
	for _, a := range ev.After {
		var b *GPUDevice
		for i := range ev.Before {
			if ev.Before[i].UUID == a.UUID {
				b = &ev.Before[i]
			}
		}
		base := GPUFault{Device: a.Index, UUID: a.UUID, Source: "nvml"}
		if b != nil && b.ECCKnown && a.ECCKnown {
			base.ECCBefore, base.ECCAfter = b.ECCVolatile, a.ECCVolatile
		}
		best := fault{rank: 0}
		take := func(f fault) {
			if f.rank > best.rank {
				best = f
			}
		}
		n92 := 0
		for _, x := range a.XIDs {
			info := xids[x]
			g := base
			g.XID, g.Meaning = x, XIDMeaning(x)
			if x == 92 {
				n92++
				if n92 >= xid92Threshold {
					g.Reset = true
					g.Meaning += fmt.Sprintf(" (%d times in this run)", n92)
					take(fault{g, 3})
					continue
				}
			}
			if x == 64 && a.RemapKnown && a.RemapFailure {
				g.Reset = true
				g.Meaning += " with a row-remap failure"
				take(fault{g, 3})
				continue
			}
			switch {
			case info.Reset:
				g.Reset = true
				take(fault{g, 3})
			case info.Ends:
				take(fault{g, 2})
			default: // the application's, a record, or not in the table: evidence
				take(fault{g, 1})
			}
		}
		if a.Lost {
			g := base
			g.Meaning, g.Reset = "GPU is lost (NVML: fallen off the bus)", true
			take(fault{g, 3})
		}
		if a.ResetRequired {
			g := base
			g.Meaning, g.Reset = "NVML says the GPU requires a reset", true
			take(fault{g, 3})
		}
		if a.RemapKnown && a.RemapFailure {
			g := base
			g.Meaning, g.Reset = "row remapping failed (no spare rows left)", true
			take(fault{g, 3})
		}
		if a.DoubleBitECC > 0 {
			g := base
			g.Meaning, g.Reset = "double-bit (uncorrectable) ECC error event", true
			take(fault{g, 3})
		}
		if best.rank == 0 && base.ECCAfter > base.ECCBefore {
			g := base
			g.Meaning = "uncorrected ECC errors counted during the run"
			if a.RemapKnown && a.RemapPending {
				g.Meaning += " and a row remap pending (applied at the next GPU reset)"
				g.Reset = true
				take(fault{g, 3})
			} else {
				take(fault{g, 1})
			}
		}
		if best.rank > 0 {
			out = append(out, best)
		}
	}
	if len(out) == 0 && len(ev.Unkillable) > 0 {
		out = append(out, fault{GPUFault{Device: -1, Source: "nvml", Reset: true,
			Meaning: fmt.Sprintf("vLLM's processes %v did not die after every kill round (stuck in the kernel, in the GPU driver on this host)", ev.Unkillable)}, 3})
	}
	slices.SortStableFunc(out, func(x, y fault) int { return y.rank - x.rank })
	return out
}

// gpuVerdict decides gpu_fault from NVML, before the log. A finding that
// is only evidence (an XID usually the application's, a record, new ECC
// counts alone) decides only when nothing else explains the death: a log
// that names another cause (an OOM, a bad argument), the kernel's OOM
// killer or a hang kill comes first.
func gpuVerdict(e Exit, s *scan) (Verdict, bool) {
	fs := gpuFaults(e.GPU)
	if len(fs) == 0 {
		return Verdict{}, false
	}
	if fs[0].rank < 2 {
		phase := e.Phase
		if phase == "" {
			phase = PhaseStarting
		}
		if c, h := s.best(phase, scoreDied); h != nil && c != CauseCrash && c != CauseGPUFault {
			return Verdict{}, false
		}
		if e.HostOOMKill || e.Hang != "" {
			return Verdict{}, false
		}
	}
	g := fs[0].g
	var ev []Line
	if h := s.byCause[CauseGPUFault]; h != nil {
		ev = s.evidence(e.Lines, h)
	} else if h := s.byCause[CauseCrash]; h != nil {
		ev = s.evidence(e.Lines, h)
	}
	return Verdict{Cause: CauseGPUFault, Confidence: "high", Evidence: ev, GPU: &g,
		Summary: "the GPU failed: " + g.What()}, true
}

// xidLine is the kernel's report of an XID: "NVRM: Xid (PCI:0000:3b:00):
// 79, pid=…, GPU has fallen off the bus."
var xidLine = regexp.MustCompile(`Xid \(PCI:[0-9a-fA-F:.]+\): (\d+)`)

// gpuFromLog fills the GPU fault a log-decided gpu_fault names.
func gpuFromLog(ev []Line) *GPUFault {
	g := &GPUFault{Device: -1, Source: "log"}
	for _, l := range ev { // the first XID, or the first that needs a reset
		if m := xidLine.FindStringSubmatch(l.Text); m != nil {
			x, _ := strconv.Atoi(m[1])
			if g.XID == 0 || (xids[x].Reset && !g.Reset) {
				g.XID, g.Meaning, g.Reset = x, XIDMeaning(x), xids[x].Reset
			}
		}
	}
	if g.XID > 0 {
		return g
	}
	for _, l := range ev {
		switch t := l.Text; {
		case strings.Contains(t, "GPU is lost") || strings.Contains(t, "fallen off the bus"):
			g.Meaning, g.Reset = "GPU is lost (fallen off the bus)", true
			return g
		case strings.Contains(t, "uncorrectable NVLink error"):
			g.Meaning, g.Reset = "uncorrectable NVLink error", true
			return g
		case strings.Contains(t, "uncorrectable ECC error") || strings.Contains(t, "ECC_UNCORRECTABLE"):
			g.Meaning = "uncorrectable ECC error (CUDA)"
			return g
		case strings.Contains(t, "unspecified launch failure"):
			g.Meaning = "unspecified launch failure (CUDA: a kernel died on the GPU)"
			return g
		}
	}
	g.Meaning = "a GPU hardware error in vLLM's log"
	return g
}

// StartBlock says why vLLM must not be started on these GPUs now ("" when
// it may): a GPU lost, one whose driver asks for a reset, a row remap
// pending or failed (applied at the next reset; until then the bad rows
// are still in use).
func StartBlock(devs []GPUDevice) string {
	var why []string
	for _, d := range devs {
		reset := fmt.Sprintf("reset it (nvidia-smi -r -i %d) or drain the node and reboot it", d.Index)
		switch {
		case d.Lost && d.UUID == "": // lost before NVML could list it: no UUID
			why = append(why, fmt.Sprintf("GPU %d is lost (fallen off the bus): %s", d.Index, reset))
		case d.Lost:
			why = append(why, fmt.Sprintf("GPU %d (%s) is lost (fallen off the bus): %s", d.Index, d.UUID, reset))
		case d.ResetRequired:
			why = append(why, fmt.Sprintf("GPU %d (%s) requires a reset: %s", d.Index, d.UUID, reset))
		case d.RemapKnown && d.RemapFailure:
			why = append(why, fmt.Sprintf("GPU %d (%s) had a row-remap failure (no spare rows): drain the node and have the GPU checked", d.Index, d.UUID))
		case d.RemapKnown && d.RemapPending:
			why = append(why, fmt.Sprintf("GPU %d (%s) has a row remap pending (applied at the next GPU reset): %s", d.Index, d.UUID, reset))
		}
	}
	return strings.Join(why, "; ")
}

// LiveFault says whether the GPU's word during a run ends it now: an XID
// after which the driver tore the contexts down or the GPU needs a reset,
// a lost GPU. The run is then stopped by the guard and classified from the
// same evidence; an XID that is usually the application's own fault only
// waits for vLLM's own exit.
func LiveFault(ev GPUEvidence) (string, bool) {
	for _, f := range gpuFaults(&ev) {
		if f.rank >= 2 {
			return f.g.What(), true
		}
	}
	return "", false
}

// gpuAdvice: what to do about a GPU fault.
func gpuAdvice(v Verdict) []string {
	g := v.GPU
	if g == nil {
		g = &GPUFault{Device: -1}
	}
	idx := "<index>"
	if g.Device >= 0 {
		idx = strconv.Itoa(g.Device)
	}
	a := []string{
		"look at the GPU's own record: nvidia-smi -q -i " + idx + " -d ECC,ROW_REMAPPER,PAGE_RETIREMENT and the kernel's Xid lines (dmesg | grep -i xid)",
	}
	if g.Reset {
		a = append(a, "reset the GPU (nvidia-smi -r -i "+idx+", with nothing running on it) or drain the node and reboot it; the guard does not restart vLLM onto it")
	} else {
		a = append(a, "a restart usually survives this; a second fault within give_up_window is treated as needing a reset (nvidia-smi -r -i "+idx+", or drain and reboot)")
	}
	return a
}
