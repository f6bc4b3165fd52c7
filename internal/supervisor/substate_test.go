package supervisor

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// The machine as a table: each row is one cell (sub-state × event) that
// does something, and says the sub-state the event leads to. A cell not
// listed is an event the sub-state ignores. Each row reaches its sub-state
// through the machine's own events (over the fakes of machine_test.go, in
// fake time), fires the one event, and checks the first sub-state the
// machine entered after it.
type row struct {
	from  subState
	event string
	to    subState
	edit  func(c *config.Config) // the configuration (nil: the scenario's)
	setup func(s *scenario)      // before Run starts
	reach func(s *scenario)      // after Run started: bring the machine to from
	fire  func(s *scenario)      // the event
	// effects: what the event did to vLLM, checked when not nil:
	// "SIGTERM", "SIGKILL" (to the run there was), "launch" (a new run).
	effects []string
}

// effectsSince says what happened to vLLM since n launches and the last
// run's stops and kills were as given.
func effectsSince(s *scenario, n int, last *fakeVLLM, stops, kills int32) []string {
	out := []string{}
	if last != nil && last.stops.Load() > stops {
		out = append(out, "SIGTERM")
	}
	if last != nil && last.kills.Load() > kills {
		out = append(out, "SIGKILL")
	}
	if s.l.n() > n {
		out = append(out, "launch")
	}
	return out
}

const shutdown20 = "--shutdown-timeout"

func withDrain(c *config.Config) { c.VLLM.Command = []string{"vllm", "serve", "m", shutdown20, "20"} }

// stuckLeftovers: processes of the last run outlive its keeper and take a
// minute to die (stuck in the kernel), so the machine is seen cleaning.
func stuckLeftovers(s *scenario) {
	p := s.l.last()
	p.survivors, p.stuckFor = []int{4242}, time.Minute
}

// crash ends the last run's vLLM by itself, exit 1.
func crash(s *scenario) { s.l.last().end(exitInfo{Code: 1}) }

func badFlag(s *scenario) {
	s.l.last().print("stderr:vllm serve: error: unrecognized arguments: --bogus")
	s.l.last().end(exitInfo{Code: 2})
}

func restart(s *scenario) {
	if err := s.sup.Restart(context.Background(), "uid 0"); err != nil {
		s.t.Fatal(err)
	}
}

// slowPort makes every trial bind of vLLM's port take a minute, with no
// NVML view, so the machine can be seen while the check is on its way.
func slowPort(s *scenario) { s.noGPU, s.slowPort = true, time.Minute }

// slowNVML makes every NVML read take a minute, so the machine can be
// seen while a read is on its way.
func slowNVML(s *scenario) { s.gpu.slow = time.Minute }

// slowHealth is a GPU health view whose first read takes a minute.
type slowHealth struct {
	GPUHealth
	slowed *atomic.Bool
}

func (h slowHealth) GPUs(since time.Time, fresh bool) []policy.GPUDevice {
	if h.slowed.CompareAndSwap(false, true) {
		time.Sleep(time.Minute)
	}
	return h.GPUHealth.GPUs(since, fresh)
}

var rows = []row{
	{from: subIdle, event: "Run begins (NVML)", to: subCheckGPU},
	{from: subIdle, event: "Run begins (no NVML)", to: subCheckPort, effects: []string{"launch"}, setup: func(s *scenario) { s.noGPU = true }},
	{from: subCheckGPU, event: "NVML read: room", to: subCheckPort, effects: []string{"launch"}, setup: slowNVML,
		fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCheckGPU, event: "NVML read: no room", to: subWaitGPU, effects: []string{},
		setup: func(s *scenario) { slowNVML(s); s.gpu.free = false },
		fire:  func(s *scenario) { s.advance(time.Minute); s.gpu.set(func(g *fakeGPU) { g.slow = 0 }) }},
	{from: subCheckGPU, event: "NVML read: a GPU needs a reset", to: subWaitGPU, effects: []string{},
		setup: func(s *scenario) {
			h := newFakeHealth()
			h.dev.Lost = true
			s.health = slowHealth{h, new(atomic.Bool)}
		}, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCheckGPU, event: "stop", to: subStopped, setup: slowNVML, fire: func(s *scenario) { s.cancel() }},
	{from: subWaitGPU, event: "sample timer, NVML read: room", to: subCheckPort, effects: []string{"launch"},
		setup: func(s *scenario) { s.gpu.free = false },
		fire: func(s *scenario) {
			s.gpu.set(func(g *fakeGPU) { g.free = true })
			s.advance(s.cfg.GPU.SampleInterval.Duration)
		}},
	{from: subWaitGPU, event: "stop", to: subStopped, setup: func(s *scenario) { s.gpu.free = false }, fire: func(s *scenario) { s.cancel() }},
	{from: subCheckPort, event: "trial bind: free", to: subStarting, effects: []string{"launch"}, setup: slowPort,
		fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCheckPort, event: "trial bind: held", to: subWaitPort, effects: []string{},
		setup: func(s *scenario) { slowPort(s); s.holder = squatter }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCheckPort, event: "stop", to: subStopped, setup: slowPort, fire: func(s *scenario) { s.cancel() }},
	{from: subWaitPort, event: "retry timer, trial bind: free", to: subStarting, effects: []string{"launch"},
		setup: func(s *scenario) { s.noGPU, s.holder = true, squatter },
		fire:  func(s *scenario) { s.setHolder(""); s.advance(portRetryFirst) }},
	{from: subWaitPort, event: "retry timer past port_wait at the first start: held", to: subStarting, effects: []string{},
		edit:  func(c *config.Config) { c.VLLM.PortWait = config.Duration{Duration: time.Second} },
		setup: func(s *scenario) { s.noGPU, s.holder = true, squatter }, fire: func(s *scenario) { s.advance(time.Second) }},
	{from: subWaitPort, event: "stop", to: subStopped, setup: func(s *scenario) { s.noGPU, s.holder = true, squatter },
		fire: func(s *scenario) { s.cancel() }},
	{from: subStarting, event: "readiness probe answered", to: subReady, effects: []string{}, fire: func(s *scenario) { s.ready() }},
	{from: subStarting, event: "vLLM's API server exits", to: subStopTerm, effects: []string{}, fire: crash},
	{from: subStarting, event: "stall timer: no output, no I/O", to: subStopKill, effects: []string{"SIGKILL"},
		edit: func(c *config.Config) { c.Readiness.StallTimeout = config.Duration{Duration: time.Minute} },
		fire: func(s *scenario) { s.advance(time.Minute + time.Second) }},
	{from: subStarting, event: "stop", to: subStopTerm, fire: func(s *scenario) { s.cancel() }},
	{from: subReady, event: "stop (no proxy)", to: subStopTerm, effects: []string{"SIGTERM"}, reach: func(s *scenario) { s.ready() }, fire: func(s *scenario) { s.cancel() }},
	{from: subReady, event: "stop (requests in flight through the proxy)", to: subDraining, effects: []string{}, edit: withDrain,
		setup: func(s *scenario) { s.inFlight = func() int { return 1 } }, reach: func(s *scenario) { s.ready() }, fire: func(s *scenario) { s.cancel() }},
	{from: subReady, event: "operator restart", to: subStopTerm, effects: []string{"SIGTERM", "launch"}, reach: func(s *scenario) { s.ready() }, fire: restart},
	{from: subReady, event: "liveness failures", to: subStopKill, reach: func(s *scenario) { s.ready() },
		fire: func(s *scenario) {
			s.pr.setHealth(func() probeResult { return probeResult{step: "health", err: "timeout"} })
			s.advance(time.Duration(s.cfg.Liveness.Failures+1) * s.cfg.Liveness.Interval.Duration)
		}},
	{from: subReady, event: "exit timer: the server finished, its process did not exit", to: subStopKill, effects: []string{"SIGKILL"}, reach: func(s *scenario) { s.ready() },
		fire: func(s *scenario) {
			p := s.l.last()
			p.print(fmt.Sprintf("stderr:INFO:     Finished server process [%d]", p.apiPID))
			s.pr.setHealth(func() probeResult { return probeResult{step: "health", err: "connection refused"} })
			s.advance(s.cfg.Liveness.Interval.Duration + s.cfg.VLLM.StopTimeout.Duration + time.Second)
		}},
	{from: subReady, event: "heartbeat: XID 79", to: subStopKill, effects: []string{"SIGKILL"},
		setup: func(s *scenario) { s.health = newFakeHealth() }, reach: func(s *scenario) { s.ready() },
		fire: func(s *scenario) { s.health.(*fakeHealth).xid(79); s.advance(time.Second) }},
	{from: subReady, event: "heartbeat: restore due", to: subStopTerm,
		edit: func(c *config.Config) { c.Profile.RestoreAfter = config.Duration{Duration: 10 * time.Minute} },
		setup: func(s *scenario) {
			s.pstate.Rung = 1
			s.load = func() (float64, float64, bool) { return 0, 0, true }
			s.gpu.fractions = []float64{0.5}
		},
		reach: func(s *scenario) { s.ready() }, fire: func(s *scenario) { s.advance(10*time.Minute + 2*time.Second) }},
	drainEnds(),
	{from: subDraining, event: "a second stop signal", to: subStopKill, edit: withDrain,
		setup: func(s *scenario) { s.inFlight = func() int { return 1 } },
		reach: func(s *scenario) { s.ready(); s.cancel() }, fire: func(s *scenario) { s.sup.Kill() }},
	{from: subStopTerm, event: "stop timer", to: subStopKill, effects: []string{"SIGKILL"},
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = true } },
		reach: func(s *scenario) { s.ready(); s.cancel() }, fire: func(s *scenario) { s.advance(s.cfg.VLLM.StopTimeout.Duration) }},
	{from: subStopTerm, event: "a second stop signal", to: subStopKill,
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = true } },
		reach: func(s *scenario) { s.ready(); s.cancel() }, fire: func(s *scenario) { s.sup.Kill() }},
	{from: subStopTerm, event: "the tree is gone", to: subCleaning, effects: []string{},
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM = true } },
		reach: func(s *scenario) { s.ready(); s.cancel() }, fire: func(s *scenario) { s.l.last().end(exitInfo{Code: 0}) }},
	{from: subStopKill, event: "the tree is gone", to: subCleaning,
		setup: func(s *scenario) { s.l.setup = func(p *fakeVLLM) { p.ignoreTERM, p.outlivesKill = true, true } },
		reach: func(s *scenario) { s.ready(); s.cancel(); s.advance(s.cfg.VLLM.StopTimeout.Duration) },
		fire:  func(s *scenario) { s.l.last().end(exitInfo{Code: -1, Signal: "SIGKILL"}) }},
	{from: subCleaning, event: "cleaned: a failure, NVML watching", to: subReleasing,
		reach: func(s *scenario) { stuckLeftovers(s); crash(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: a failure, no NVML", to: subBackoff,
		setup: func(s *scenario) { s.noGPU = true },
		reach: func(s *scenario) { stuckLeftovers(s); crash(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: a failure that gives up", to: subGaveUp,
		reach: func(s *scenario) { stuckLeftovers(s); badFlag(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: a failure that gives up, on_give_up = stay", to: subFailed,
		edit:  func(c *config.Config) { c.Restart.OnGiveUp = "stay" },
		reach: func(s *scenario) { stuckLeftovers(s); badFlag(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: a start that failed before ready, its port taken", to: subCheckGPU,
		reach: func(s *scenario) { stuckLeftovers(s); s.setHolder(squatter); bindFails(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: asked to stop", to: subStopped,
		reach: func(s *scenario) { s.ready(); stuckLeftovers(s); s.cancel() }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subCleaning, event: "cleaned: an operator restart", to: subCheckGPU,
		reach: func(s *scenario) { s.ready(); stuckLeftovers(s); restart(s) }, fire: func(s *scenario) { s.advance(time.Minute) }},
	{from: subReleasing, event: "NVML read: released", to: subBackoff,
		setup: func(s *scenario) { s.gpu.released = false }, reach: crash,
		fire: func(s *scenario) {
			s.gpu.set(func(g *fakeGPU) { g.released = true })
			s.advance(s.cfg.GPU.SampleInterval.Duration)
		}},
	{from: subReleasing, event: "stop", to: subStopped, setup: func(s *scenario) { s.gpu.released = false }, reach: crash,
		fire: func(s *scenario) { s.cancel() }},
	{from: subBackoff, event: "backoff timer", to: subCheckGPU, reach: crash,
		fire: func(s *scenario) { s.advance(s.cfg.Restart.InitialDelay.Duration) }},
	{from: subBackoff, event: "operator restart", to: subCheckGPU, reach: crash, fire: restart},
	{from: subBackoff, event: "stop", to: subStopped, reach: crash, fire: func(s *scenario) { s.cancel() }},
	{from: subFailed, event: "stop", to: subGaveUp, edit: func(c *config.Config) { c.Restart.OnGiveUp = "stay" }, reach: badFlag,
		fire: func(s *scenario) { s.cancel() }},
}

// drainEnds: the requests in flight through the proxy end while draining.
func drainEnds() row {
	var inFlight atomic.Int64
	inFlight.Store(1)
	return row{from: subDraining, event: "drain timer: no requests left", to: subStopTerm, effects: []string{"SIGTERM"}, edit: withDrain,
		setup: func(s *scenario) { s.inFlight = func() int { return int(inFlight.Load()) } },
		reach: func(s *scenario) { s.ready(); s.cancel() },
		fire:  func(s *scenario) { inFlight.Store(0); s.advance(time.Second) }}
}

func TestMachineTable(t *testing.T) {
	covered := map[subState]bool{}
	for _, c := range rows {
		covered[c.from] = true
		t.Run(c.from.String()+" × "+c.event, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newScenario(t, c.edit)
				if c.setup != nil {
					c.setup(s)
				}
				n := 0
				if c.from != subIdle {
					s.start()
					if c.reach != nil {
						c.reach(s)
					}
					synctest.Wait()
					s.mu.Lock()
					n = len(s.subs)
					now := s.subs[n-1]
					s.mu.Unlock()
					if now != c.from {
						t.Fatalf("reached %s, want %s (sub-states %v)", now, c.from, s.subs)
					}
				}
				n0, last := s.l.n(), (*fakeVLLM)(nil)
				var stops, kills int32
				if n0 > 0 {
					last = s.l.last()
					stops, kills = last.stops.Load(), last.kills.Load()
				}
				if c.fire != nil {
					c.fire(s)
				} else {
					s.start()
				}
				synctest.Wait()
				s.mu.Lock()
				after := slices.Clone(s.subs[n:])
				s.mu.Unlock()
				if c.from == subIdle {
					after = after[1:]
				}
				if len(after) == 0 || after[0] != c.to {
					t.Fatalf("%s × %s: entered %v, want %s first", c.from, c.event, after, c.to)
				}
				if got := effectsSince(s, n0, last, stops, kills); c.effects != nil && !slices.Equal(got, c.effects) {
					t.Errorf("%s × %s: effects %v, want %v", c.from, c.event, got, c.effects)
				}
				if st := s.sup.Status(); slices.Equal(after, []subState{c.to}) && st.State != publicState[c.to] {
					t.Errorf("in %s the status says %s, want %s", c.to, st.State, publicState[c.to])
				}
				s.advance(2 * time.Minute) // reads still on their way end (NVML calls are not cancelled)
			})
		})
	}
	// Every sub-state but the ends has at least one cell that leaves it.
	for sub := range subStates {
		if !sub.done() && !covered[sub] {
			t.Errorf("no row leaves sub-state %s", sub)
		}
	}
}

// Every sub-state has a name and shows a public State.
func TestEverySubStateShowsAState(t *testing.T) {
	for sub := range subStates {
		if subStateNames[sub] == "" || publicState[sub] == "" {
			t.Errorf("sub-state %d: name %q, public state %q", sub, subStateNames[sub], publicState[sub])
		}
	}
}

// The public State is set in one place: enter, from the table. No other
// code of the package assigns a status's State.
func TestOnlyEnterSetsTheState(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || fn.Name.Name == "enter" {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				as, ok := n.(*ast.AssignStmt)
				if !ok {
					return true
				}
				for _, l := range as.Lhs {
					if sel, ok := l.(*ast.SelectorExpr); ok && sel.Sel.Name == "State" {
						t.Errorf("%s: %s assigns a State; use enter with a sub-state", fset.Position(as.Pos()), fn.Name.Name)
					}
				}
				return true
			})
		}
	}
}

// docs/design.md's table of sub-states says what the code says: every
// sub-state, in order, with the public State it shows.
func TestDesignTableIsTheCode(t *testing.T) {
	b, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows [][2]string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "| sub-state | shows |") {
			in = true
			continue
		}
		if !in || strings.HasPrefix(l, "|---") {
			continue
		}
		if !strings.HasPrefix(l, "|") {
			break
		}
		f := strings.Split(l, "|")
		rows = append(rows, [2]string{strings.Trim(strings.TrimSpace(f[1]), "`"), strings.Trim(strings.TrimSpace(f[2]), "`")})
	}
	var want [][2]string
	for sub := range subStates {
		want = append(want, [2]string{sub.String(), string(publicState[sub])})
	}
	if !slices.Equal(rows, want) {
		t.Errorf("docs/design.md's sub-state table:\n%v\nthe code (substate.go):\n%v", rows, want)
	}
}

// The decisions read no clock, start no goroutine and reach no process,
// socket or GPU themselves: the loop stamps each event with its time
// (m.now), and every effect that waits runs in the executor
// (machine_exec.go) or behind a port (ports.go, gpu.go).
func TestDecisionsReadNoClock(t *testing.T) {
	decisions := []string{"machine.go", "machine_start.go", "machine_ready.go", "machine_end.go", "machine_ops.go", "gpufault.go", "substate.go"}
	banned := map[string]bool{"os": true, "os/exec": true, "net": true, "net/http": true, "syscall": true,
		"golang.org/x/sys/unix": true, "github.com/NVIDIA/go-nvml/pkg/nvml": true,
		"github.com/vllm-guard/vllm-guard/internal/gpumon": true, "github.com/vllm-guard/vllm-guard/internal/proctree": true}
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "AfterFunc": true, "NewTimer": true, "NewTicker": true,
		"Sleep": true, "Tick": true, "After": true}
	fset := token.NewFileSet()
	for _, name := range decisions {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range f.Imports {
			if p := strings.Trim(im.Path.Value, `"`); banned[p] {
				t.Errorf("%s imports %s", name, p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: a go statement: effects that wait belong in machine_exec.go", fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" && clock[n.Sel.Name] {
					t.Errorf("%s: time.%s: decisions take the event's time, m.now", fset.Position(n.Pos()), n.Sel.Name)
				}
			}
			return true
		})
	}
}
