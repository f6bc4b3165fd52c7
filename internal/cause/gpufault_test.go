package cause

import (
	"bytes"
	"strings"
	"testing"
)

const gpu0 = "GPU-aaaa1111-2222-3333-4444-555555555555"

func dev(xids ...int) GPUDevice {
	return GPUDevice{Index: 0, UUID: gpu0, XIDs: xids, ECCKnown: true, RemapKnown: true}
}

// TestGPUVerdictFromNVML: the GPU's own word decides before the log, with
// the GPU, the XID, its meaning and the ECC counts in the verdict.
func TestGPUVerdictFromNVML(t *testing.T) {
	crash := []Line{{N: 1, Text: "RuntimeError: CUDA error: an illegal memory access was encountered"}}
	before := dev()
	before.ECCVolatile = 1
	after := dev(79)
	after.ECCVolatile = 3
	v := Classify(Exit{Lines: crash, ExitCode: 1, Phase: PhaseReady, GPU: &GPUEvidence{Before: []GPUDevice{before}, After: []GPUDevice{after}}})
	if v.Cause != CauseGPUFault || v.GPU == nil || v.GPU.XID != 79 || !v.GPU.Reset || v.GPU.Device != 0 || v.GPU.UUID != gpu0 ||
		v.GPU.ECCBefore != 1 || v.GPU.ECCAfter != 3 || v.GPU.Source != "nvml" {
		t.Fatalf("verdict %+v gpu %+v", v, v.GPU)
	}
	for _, want := range []string{"GPU 0", "XID 79", "fallen off the bus", "nvidia-smi -r -i 0", "1→3"} {
		if !strings.Contains(v.Summary, want) {
			t.Errorf("summary %q lacks %q", v.Summary, want)
		}
	}
	if len(v.Evidence) != 1 || len(v.Advice) == 0 {
		t.Errorf("evidence %v advice %v", v.Evidence, v.Advice)
	}

	// Nothing from NVML: the crash stays a crash.
	v = Classify(Exit{Lines: crash, ExitCode: 1, Phase: PhaseReady, GPU: &GPUEvidence{Before: []GPUDevice{dev()}, After: []GPUDevice{dev()}}})
	if v.Cause != CauseCrash {
		t.Fatalf("no hardware sign: %s, want crash", v.Cause)
	}

	// The kill of a vLLM the guard stopped for the fault is still the GPU's.
	v = Classify(Exit{Lines: nil, ExitCode: -1, Signal: "SIGKILL", SignalByGuard: true, Phase: PhaseReady,
		GPU: &GPUEvidence{After: []GPUDevice{{Index: 0, UUID: gpu0, Lost: true}}}})
	if v.Cause != CauseGPUFault || !v.GPU.Reset {
		t.Fatalf("lost GPU: %+v", v)
	}
}

func TestGPUFaultClasses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		d     GPUDevice
		reset bool
		ends  bool
	}{
		{"xid 48", dev(48), true, true},
		{"xid 79", dev(79), true, true},
		{"xid 95", dev(95), true, true},
		{"xid 119", dev(119), true, true},
		{"xid 94", dev(94), false, true},
		{"xid 13", dev(13), false, false},
		{"xid 31", dev(31), false, false},
		{"xid 43", dev(43), false, false},
		{"xid 64", dev(64), false, false},
		{"xid 64 remap failure", func() GPUDevice { d := dev(64); d.RemapFailure = true; return d }(), true, true},
		{"xid 92 twice", dev(92, 92), false, false},
		{"xid 92 thrice", dev(92, 92, 92), true, true},
		{"lost", GPUDevice{Index: 0, UUID: gpu0, Lost: true}, true, true},
	} {
		fs := gpuFaults(&GPUEvidence{After: []GPUDevice{tc.d}})
		if len(fs) == 0 {
			t.Errorf("%s: no fault", tc.name)
			continue
		}
		if fs[0].g.Reset != tc.reset {
			t.Errorf("%s: reset %v, want %v (%+v)", tc.name, fs[0].g.Reset, tc.reset, fs[0].g)
		}
		if _, ends := LiveFault(GPUEvidence{After: []GPUDevice{tc.d}}); ends != tc.ends {
			t.Errorf("%s: ends the run %v, want %v", tc.name, ends, tc.ends)
		}
	}
}

func TestStartBlock(t *testing.T) {
	ok := dev()
	if why := StartBlock([]GPUDevice{ok}); why != "" {
		t.Fatalf("healthy GPU blocked: %q", why)
	}
	pend := dev()
	pend.RemapPending = true
	why := StartBlock([]GPUDevice{ok, pend})
	if !strings.Contains(why, "row remap pending") || !strings.Contains(why, "nvidia-smi -r -i 0") {
		t.Fatalf("pending remap: %q", why)
	}
	if why := StartBlock([]GPUDevice{{Index: 1, UUID: "GPU-x", Lost: true}}); !strings.Contains(why, "GPU 1") || !strings.Contains(why, "lost") {
		t.Fatalf("lost: %q", why)
	}
}

// TestDiagnoseGPUFaultLogs: what `vllm-guard diagnose` says of the issue's
// two logs.
func TestDiagnoseGPUFaultLogs(t *testing.T) {
	ecc := "INFO 08-14 02:00:01 [api_server.py:1000] vLLM API server version 0.10.1\n" +
		"ERROR 08-14 02:10:00 [core.py:700] RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
	rep, err := Diagnose(bytes.NewReader([]byte(ecc)))
	if err != nil || rep.Cause != CauseGPUFault || rep.GPU == nil || rep.GPU.Source != "log" {
		t.Fatalf("ECC log: %v %+v", err, rep.Verdict)
	}
	ima := "INFO 08-14 02:00:01 [api_server.py:1000] vLLM API server version 0.10.1\n" +
		"ERROR 08-14 02:10:00 [core.py:700] RuntimeError: CUDA error: an illegal memory access was encountered\n"
	if rep, _ := Diagnose(bytes.NewReader([]byte(ima))); rep.Cause != CauseCrash {
		t.Fatalf("illegal memory access, no hardware sign: %s", rep.Cause)
	}
	xid := ima + "[Thu Aug 14 02:10:00 2025] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
	rep, _ = Diagnose(bytes.NewReader([]byte(xid)))
	if rep.Cause != CauseGPUFault || rep.GPU == nil || rep.GPU.XID != 79 || !rep.GPU.Reset {
		t.Fatalf("with an Xid line: %+v gpu %+v", rep.Verdict, rep.GPU)
	}
}

// TestGPUEvidenceOnlyDoesNotOverrideTheLog: an XID that is only evidence
// (45 after a killed process, 13 of the application) does not turn an OOM
// into a GPU fault; with a plain crash it names the GPU.
func TestGPUEvidenceOnlyDoesNotOverrideTheLog(t *testing.T) {
	oom := []Line{{N: 1, Text: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."}}
	v := Classify(Exit{Lines: oom, ExitCode: 1, Phase: PhaseReady, GPU: &GPUEvidence{After: []GPUDevice{dev(45)}}})
	if v.Cause != CauseOOM {
		t.Fatalf("OOM with an XID 45: %s, want oom", v.Cause)
	}
	crash := []Line{{N: 1, Text: "RuntimeError: CUDA error: an illegal memory access was encountered"}}
	v = Classify(Exit{Lines: crash, ExitCode: 1, Phase: PhaseReady, GPU: &GPUEvidence{After: []GPUDevice{dev(13)}}})
	if v.Cause != CauseGPUFault || v.GPU.XID != 13 || v.GPU.Reset {
		t.Fatalf("illegal address with an XID 13: %+v", v)
	}
	// A reset-class XID decides whatever the log says.
	v = Classify(Exit{Lines: oom, ExitCode: 1, Phase: PhaseReady, GPU: &GPUEvidence{After: []GPUDevice{dev(79)}}})
	if v.Cause != CauseGPUFault {
		t.Fatalf("OOM line with an XID 79: %s", v.Cause)
	}
	if _, ends := LiveFault(GPUEvidence{After: []GPUDevice{dev(45)}}); ends {
		t.Fatal("an XID 45 ended the run")
	}
}

// TestGPUFromLogPrefersTheResetXID: of several Xid lines, the one that
// needs a reset names the fault.
func TestGPUFromLogPrefersTheResetXID(t *testing.T) {
	g := gpuFromLog([]Line{
		{N: 1, Text: "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception"},
		{N: 2, Text: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."},
	})
	if g.XID != 79 || !g.Reset {
		t.Fatalf("%+v", g)
	}
}
