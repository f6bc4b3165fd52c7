package control

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// With a warm standby the human view names both vLLMs, their ports and
// roles, which one serves, whether the standby is ready and the last
// failover; without one it says nothing of a standby.
func TestWriteStatusNamesBothVLLMs(t *testing.T) {
	d := fixtureDoc()
	var without bytes.Buffer
	WriteStatus(&without, d)
	if strings.Contains(without.String(), "Standby") {
		t.Fatalf("a standby line without a standby:\n%s", without.String())
	}
	at := d.Now.Add(-90 * time.Second)
	d.Standby = &Standby{Mode: "process", Serving: "b", StandbyReady: true, AdmittedMaxNumSeqs: 128, Failovers: 1,
		LastFailover: &events.Failover{From: "a", To: "b", Left: at, At: at, Seconds: 0.02},
		VLLMs: []StandbyVLLM{{Name: "a", Role: "standby", Port: 8000, State: status.StateReady, PID: 4100, Rung: 1, MaxNumSeqs: 128},
			{Name: "b", Role: "serving", Port: 8001, State: status.StateReady, PID: 4200, Rung: 0, MaxNumSeqs: 256, Reason: "vLLM answered\x1b[2J the probe"}}}
	var b bytes.Buffer
	WriteStatus(&b, d)
	out := b.String()
	for _, want := range []string{"Standby (process): vLLM b serves (admitted for max_num_seqs 128); standby ready; 1 failover, last a → b",
		"vLLM a  standby  port 8000", "pid 4100", "rung 1 (max_num_seqs 128)", "vLLM b  serving  port 8001", "pid 4200"} {
		if !strings.Contains(out, want) {
			t.Errorf("the view has no %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Error("the view holds an escape sequence from a vLLM's reason")
	}
}
