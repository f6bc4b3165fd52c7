package control

import (
	"slices"

	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/redact"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// SummaryNote is the note of the summary the TCP /status serves.
const SummaryNote = "summary: vLLM's log lines, evidence lines and process command lines are served on the control socket only"

// Bounds of the TCP summary: whatever vLLM printed or NVML listed, an
// answer stays well under maxSummaryBytes.
const (
	summaryText       = 512 // bytes of any one text
	summaryDevices    = 16
	summaryProcesses  = 16 // per device
	summaryHistory    = 120
	summaryIncidentMS = 120 // memory samples of the last incident
	summaryAlerts     = 32
	maxSummaryBytes   = 256 << 10
)

// Redacted returns d with every secret in its text masked (internal/redact):
// vLLM's lines and command lines carry its API key. The socket serves it;
// the TCP port serves Summary.
func Redacted(d Doc) Doc {
	d.Guard = redactStatus(d.Guard)
	d.GPU = redactGPU(d.GPU)
	d.VLLM.LastError = redact.String(d.VLLM.LastError)
	d.Alerts = slices.Clone(d.Alerts)
	for i := range d.Alerts {
		d.Alerts[i].Message = redact.String(d.Alerts[i].Message)
	}
	if d.LastIncident != nil {
		inc := state.Redacted(*d.LastIncident)
		d.LastIncident = &inc
	}
	return d
}

func redactStatus(g status.Status) status.Status {
	g.Reason = redact.String(g.Reason)
	g.LastProbe = redact.String(g.LastProbe)
	if g.LastFailure != nil {
		f := *g.LastFailure
		f.Verdict.Summary = redact.String(f.Verdict.Summary)
		f.Verdict.Evidence = slices.Clone(f.Verdict.Evidence)
		for i := range f.Verdict.Evidence {
			f.Verdict.Evidence[i].Text = redact.String(f.Verdict.Evidence[i].Text)
		}
		f.Verdict.Advice = slices.Clone(f.Verdict.Advice)
		for i := range f.Verdict.Advice {
			f.Verdict.Advice[i] = redact.String(f.Verdict.Advice[i])
		}
		f.Decision.Reason = redact.String(f.Decision.Reason)
		f.Lines = nil
		g.LastFailure = &f
	}
	return g
}

func redactGPU(s gpumon.Snapshot) gpumon.Snapshot {
	s.Reason = redact.String(s.Reason)
	s.Devices = slices.Clone(s.Devices)
	for i := range s.Devices {
		procs := slices.Clone(s.Devices[i].Processes)
		for j := range procs {
			procs[j].Command = redact.String(procs[j].Command)
		}
		s.Devices[i].Processes = procs
	}
	s.Active = slices.Clone(s.Active)
	for i := range s.Active {
		s.Active[i].Message = redact.String(s.Active[i].Message)
	}
	return s
}

// Summary is what the unauthenticated TCP /status serves: Redacted(d)
// without vLLM's lines (the last incident's, the evidence) and without
// process command lines (other users' included), every text and list cut
// to a bound. Note says so.
func Summary(d Doc) Doc {
	// What is dropped is dropped before masking (command lines above all).
	d.GPU.Devices = slices.Clone(d.GPU.Devices[:min(len(d.GPU.Devices), summaryDevices)])
	for i := range d.GPU.Devices {
		dev := &d.GPU.Devices[i]
		dev.Processes = slices.Clone(dev.Processes[:min(len(dev.Processes), summaryProcesses)])
		for j := range dev.Processes {
			dev.Processes[j].Command = ""
		}
	}
	if d.LastIncident != nil {
		inc := *d.LastIncident
		inc.LastLines, inc.Evidence = nil, nil
		d.LastIncident = &inc
	}
	d = Redacted(d)
	d.Note = SummaryNote
	g := &d.Guard
	g.Reason, g.LastProbe, g.Cost = cut(g.Reason), cut(g.LastProbe), cut(g.Cost)
	if g.LastFailure != nil {
		f := *g.LastFailure
		f.Verdict.Evidence = nil
		f.Verdict.Summary = cut(f.Verdict.Summary)
		f.Verdict.Advice = nil
		f.Decision.Reason = cut(f.Decision.Reason)
		f.Exit = cut(f.Exit)
		g.LastFailure = &f
	}
	d.GPU.Reason, d.GPU.Attribution, d.GPU.Driver = cut(d.GPU.Reason), cut(d.GPU.Attribution), cut(d.GPU.Driver)
	d.GPU.Devices = d.GPU.Devices[:min(len(d.GPU.Devices), summaryDevices)]
	for i := range d.GPU.Devices {
		dev := &d.GPU.Devices[i]
		dev.Name, dev.UUID, dev.Trend = cut(dev.Name), cut(dev.UUID), cut(dev.Trend)
		dev.History = dev.History[max(0, len(dev.History)-summaryHistory):]
		dev.Processes = dev.Processes[:min(len(dev.Processes), summaryProcesses)]
		for j := range dev.Processes {
			dev.Processes[j].Command = ""
		}
	}
	d.GPU.Active = d.GPU.Active[:min(len(d.GPU.Active), summaryAlerts)]
	for i := range d.GPU.Active {
		d.GPU.Active[i].Message = cut(d.GPU.Active[i].Message)
		d.GPU.Active[i].Name = cut(d.GPU.Active[i].Name)
	}
	d.Alerts = d.Alerts[:min(len(d.Alerts), summaryAlerts)]
	for i := range d.Alerts {
		d.Alerts[i].Message, d.Alerts[i].Name = cut(d.Alerts[i].Message), cut(d.Alerts[i].Name)
	}
	d.VLLM.LastError = cut(d.VLLM.LastError)
	d.Version = cut(d.Version)
	if d.LastIncident != nil {
		inc := *d.LastIncident
		inc.LastLines = nil
		inc.Evidence = nil
		inc.Summary, inc.Reason, inc.ID, inc.MemoryTrend = cut(inc.Summary), cut(inc.Reason), cut(inc.ID), cut(inc.MemoryTrend)
		inc.Confidence, inc.Signal = cut(inc.Confidence), cut(inc.Signal)
		inc.Memory = inc.Memory[max(0, len(inc.Memory)-summaryIncidentMS):]
		d.LastIncident = &inc
	}
	if d.Proxy != nil {
		p := *d.Proxy
		if len(p.RejectedBy) > summaryAlerts {
			p.RejectedBy = nil
		}
		if p.LastSuspect != nil {
			// A client's address is not for the unauthenticated port.
			s := *p.LastSuspect
			s.Client, s.Path = "", cut(s.Path)
			p.LastSuspect = &s
		}
		d.Proxy = &p
	}
	return d
}

// cut bounds one text of the summary.
func cut(s string) string {
	if len(s) <= summaryText {
		return s
	}
	i := summaryText - len("…")
	for i > 0 && s[i]&0xc0 == 0x80 { // not inside a UTF-8 sequence
		i--
	}
	return s[:i] + "…"
}
