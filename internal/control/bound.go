package control

import (
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"

	"github.com/vllm-guard/vllm-guard/internal/state"
)

// Bounds of the socket's status document: whatever vLLM printed (and a
// client made it quote), what vLLM's output puts in the document stays
// within a few KiB. The full lines are in the incident record
// (`vllm-guard incidents --json`) and the guard's log.
const (
	docText      = 512     // bytes of any one text from another process
	docLines     = 4 << 10 // the last incident's lines together, escaped as JSON
	docEvidence  = 4       // evidence lines (the first says why)
	docAdvice    = 8
	docSuspects  = 4
	docProcesses = 64 // per GPU
	docAlerts    = 32
	docVersion   = 64
)

// Bound returns d with every text from another process cut to docText
// and the last incident's lines to the newest that fit docLines (the
// others counted in last_lines_omitted). The socket serves Bound(Redacted(d)).
func Bound(d Doc) Doc {
	d.Version = state.Cut(d.Version, docVersion)
	g := &d.Guard
	g.Reason, g.LastProbe, g.Probe, g.Cost = cutDoc(g.Reason), cutDoc(g.LastProbe), cutDoc(g.Probe), cutDoc(g.Cost)
	g.Phase = cutDoc(g.Phase)
	if g.LastFailure != nil {
		f := *g.LastFailure
		f.Verdict.Summary = cutDoc(f.Verdict.Summary)
		f.Verdict.Evidence = slices.Clone(f.Verdict.Evidence[:min(len(f.Verdict.Evidence), docEvidence)])
		for i := range f.Verdict.Evidence {
			f.Verdict.Evidence[i].Text = cutDoc(f.Verdict.Evidence[i].Text)
		}
		f.Verdict.Advice = slices.Clone(f.Verdict.Advice[:min(len(f.Verdict.Advice), docAdvice)])
		for i := range f.Verdict.Advice {
			f.Verdict.Advice[i] = cutDoc(f.Verdict.Advice[i])
		}
		f.Decision.Reason = cutDoc(f.Decision.Reason)
		f.Exit = cutDoc(f.Exit)
		f.Lines = nil
		g.LastFailure = &f
	}
	d.GPU.Reason, d.GPU.Attribution, d.GPU.Driver = cutDoc(d.GPU.Reason), cutDoc(d.GPU.Attribution), cutDoc(d.GPU.Driver)
	d.GPU.Devices = slices.Clone(d.GPU.Devices)
	for i := range d.GPU.Devices {
		dev := &d.GPU.Devices[i]
		dev.Name, dev.UUID, dev.Trend = cutDoc(dev.Name), cutDoc(dev.UUID), cutDoc(dev.Trend)
		dev.Processes = slices.Clone(dev.Processes[:min(len(dev.Processes), docProcesses)])
		for j := range dev.Processes {
			dev.Processes[j].Command = cutDoc(dev.Processes[j].Command)
		}
	}
	d.GPU.Active = slices.Clone(d.GPU.Active[:min(len(d.GPU.Active), docAlerts)])
	for i := range d.GPU.Active {
		d.GPU.Active[i].Message, d.GPU.Active[i].Name = cutDoc(d.GPU.Active[i].Message), cutDoc(d.GPU.Active[i].Name)
	}
	d.Alerts = slices.Clone(d.Alerts[:min(len(d.Alerts), docAlerts)])
	for i := range d.Alerts {
		d.Alerts[i].Message, d.Alerts[i].Name = cutDoc(d.Alerts[i].Message), cutDoc(d.Alerts[i].Name)
	}
	d.VLLM.LastError = cutDoc(d.VLLM.LastError)
	if d.LastIncident != nil {
		inc := *d.LastIncident
		inc.Summary, inc.Reason, inc.ID, inc.MemoryTrend = cutDoc(inc.Summary), cutDoc(inc.Reason), cutDoc(inc.ID), cutDoc(inc.MemoryTrend)
		inc.Confidence, inc.Signal = cutDoc(inc.Confidence), cutDoc(inc.Signal)
		inc.Evidence = slices.Clone(inc.Evidence[:min(len(inc.Evidence), docEvidence)])
		for i := range inc.Evidence {
			inc.Evidence[i].Text = cutDoc(inc.Evidence[i].Text)
		}
		var omitted int
		inc.LastLines, omitted = state.NewestLines(inc.LastLines, docText, docLines)
		inc.LastLinesOmitted += omitted
		inc.Suspects = slices.Clone(inc.Suspects[:min(len(inc.Suspects), docSuspects)])
		for i := range inc.Suspects {
			inc.Suspects[i].Path, inc.Suspects[i].Client = cutDoc(inc.Suspects[i].Path), cutDoc(inc.Suspects[i].Client)
		}
		d.LastIncident = &inc
	}
	if d.Proxy != nil {
		p := *d.Proxy
		p.Bound, p.Why = cutDoc(p.Bound), cutDoc(p.Why)
		if p.LastSuspect != nil {
			s := *p.LastSuspect
			s.Path, s.Client = cutDoc(s.Path), cutDoc(s.Client)
			p.LastSuspect = &s
		}
		d.Proxy = &p
	}
	if d.Saved != nil {
		sv := *d.Saved
		sv.Error = cutDoc(sv.Error)
		d.Saved = &sv
	}
	return d
}

// cutDoc bounds a text as it is written: docText bytes of JSON.
func cutDoc(s string) string { return state.CutJSON(s, docText) }

// terminalSafeJSON escapes, in JSON text, the characters encoding/json
// writes raw that a terminal may act on or that change how a line reads:
// C1 controls (U+0080–U+009F; U+009B is CSI) and format characters such
// as bidirectional overrides. Outside strings JSON has none of them, so
// the text means the same.
func terminalSafeJSON(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		r, w := utf8.DecodeRune(b[i:])
		if r >= 0x80 && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r)) {
			if out == nil {
				out = append(make([]byte, 0, len(b)+16), b[:i]...)
			}
			out = fmt.Appendf(out, `\u%04x`, r)
		} else if out != nil {
			out = append(out, b[i:i+w]...)
		}
		i += w
	}
	if out == nil {
		return b
	}
	return out
}
