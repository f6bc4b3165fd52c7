package guard

// pairsleep.go is [standby] mode = "sleep": the standby shares the serving
// vLLM's GPUs. It starts first, and once ready it is put to sleep (POST
// /sleep?level=1: its weights go to host memory, its KV cache is freed,
// only a residual stays on the GPUs); then the serving vLLM starts. When
// the serving vLLM dies, its supervisor cleans up its tree and waits for
// its memory to be released as after any death; as its backoff begins (or,
// failing that, when it asks for free memory to start again) the standby
// is woken (POST /wake_up), asked for one token, and served from. The dead one starts again only
// when there is room for it (as the standby, put to sleep in turn).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/status"
	"github.com/vllm-guard/vllm-guard/internal/supervisor"
)

// Sleep-mode decisions on the event stream.
const (
	decisionSleep = "standby_asleep" // the standby was put to sleep
	decisionWake  = "standby_woken"  // the standby was woken to serve
)

// sleepState is the pair's view of sleep mode (under pair.mu).
type sleepState struct {
	// sleepy: vLLM i is ready as the standby and asleep (or being put to
	// sleep, or being woken): it serves nothing until woken.
	sleepy [2]bool
	asleep [2]bool // its sleep answered: it can be woken
	served [2]bool // it has been ready while serving: its restart wakes the other
	waking bool
}

// gatedGPU is vLLM i's GPU view in sleep mode. Its free-memory check,
// asked before every start of vLLM i, is the moment the serving vLLM's
// old tree is gone and its memory released: the sleeping standby is woken
// then, and vLLM i waits for it (and then for room).
type gatedGPU struct {
	supervisor.GPU
	own bool // a view of the GPUs of its own (vLLM a's monitor); else roomBeside
	p   *pair
	i   int
}

func (g *gatedGPU) CheckFree(r policy.Rung) (bool, string, []supervisor.Holder) {
	if why := g.p.holdForWake(g.i); why != "" {
		return false, why, nil
	}
	if !g.own {
		return g.p.roomBeside(g.i)
	}
	return g.GPU.CheckFree(r)
}

// roomBeside: without a GPU view of its own (the standby, vLLM b), vLLM i
// has room only while the other vLLM has no tree on the GPUs, or sleeps.
func (p *pair) roomBeside(i int) (bool, string, []supervisor.Holder) {
	o := 1 - i
	st := p.m[o].sup.Status()
	p.mu.Lock()
	asleep := p.sl.asleep[o]
	p.mu.Unlock()
	if st.PID != 0 && !asleep {
		return false, "vLLM " + vllmName(o) + " (pid " + strconv.Itoa(st.PID) + ") is awake on these GPUs: no room for a standby beside it", nil
	}
	return true, "", nil
}

// noGPU is the standby's GPU view in sleep mode when it has none of its
// own: every reading unknown, the free-memory check gatedGPU's.
type noGPU struct{ critical float64 }

func (noGPU) SetTree(func() []int)                                      {}
func (noGPU) SetLoading(bool)                                           {}
func (noGPU) RecentFractions(int) []float64                             { return nil }
func (noGPU) UsedBytes() []uint64                                       { return nil }
func (noGPU) Fullest() (uint64, uint64, time.Time, bool)                { return 0, 0, time.Time{}, false }
func (noGPU) Released([]int, []uint64) (bool, []supervisor.Holder)      { return true, nil }
func (noGPU) CheckFree(policy.Rung) (bool, string, []supervisor.Holder) { return true, "", nil }
func (noGPU) SetBudget(policy.Rung)                                     {}
func (n noGPU) CriticalFraction() float64                               { return n.critical }

// holdForWake: vLLM i, which served, is about to start again while the
// other sleeps as the standby: wake the other (once) and hold i meanwhile.
func (p *pair) holdForWake(i int) string {
	o := 1 - i
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.sl.waking:
		return "waking the standby vLLM " + vllmName(o) + " on these GPUs"
	case !p.sl.served[i] || !p.sl.asleep[o] || !p.isServing(i) || p.stopped.Load():
		return ""
	}
	p.sl.waking = true
	go p.wake(o)
	return "waking the standby vLLM " + vllmName(o) + " on these GPUs"
}

// onReadySleep: vLLM i is ready; as the standby in sleep mode it is put
// to sleep (it serves nothing until woken). Called with p.mu held.
func (p *pair) onReadySleepLocked(i int) {
	if p.isServing(i) {
		p.sl.served[i] = true
		return
	}
	p.sl.sleepy[i] = true
	go p.putToSleep(i)
}

// putToSleep puts vLLM i to sleep (level 1) and checks it sleeps; then
// the serving vLLM may start (the first start).
func (p *pair) putToSleep(i int) {
	defer p.startServingOnce()
	c := p.client(i)
	if err := p.post(c, i, "/sleep?level=1", ""); err != nil {
		p.log.Error("the standby vLLM could not be put to sleep: the guard serves without a standby", zap.String("vllm", vllmName(i)), zap.Error(err))
		return
	}
	var v struct {
		IsSleeping bool `json:"is_sleeping"`
	}
	if err := p.getJSON(c, i, "/is_sleeping", &v); err != nil || !v.IsSleeping {
		p.log.Error("the standby vLLM does not say it sleeps: the guard serves without a standby", zap.String("vllm", vllmName(i)), zap.Error(err))
		return
	}
	p.mu.Lock()
	still := p.sl.sleepy[i]
	p.sl.asleep[i] = still
	p.mu.Unlock()
	if still {
		p.out(events.Event{Kind: events.KindDecision, Decision: decisionSleep, VLLM: vllmName(i), Role: events.RoleStandby,
			Reason: "the standby vLLM " + vllmName(i) + " sleeps (level 1): its weights in host memory, its KV cache freed"})
	}
}

// startServingOnce lets the serving vLLM start (sleep mode: after the
// standby sleeps, or could not).
func (p *pair) startServingOnce() { p.firstOnce.Do(func() { close(p.firstReady) }) }

// wake wakes vLLM o, checks it answers a completion, and serves from it.
func (p *pair) wake(o int) {
	defer func() {
		p.mu.Lock()
		p.sl.waking = false
		p.mu.Unlock()
	}()
	c := p.client(o)
	err := p.post(c, o, "/wake_up", "")
	if err == nil {
		err = p.post(c, o, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":1}`, p.model))
	}
	if err != nil {
		p.log.Error("the standby vLLM did not wake to serve: the guard waits for the serving one's restart", zap.String("vllm", vllmName(o)), zap.Error(err))
		return
	}
	p.out(events.Event{Kind: events.KindDecision, Decision: decisionWake, VLLM: vllmName(o), Role: events.RoleStandby,
		Reason: "the standby vLLM " + vllmName(o) + " is awake and answered a completion"})
	p.mu.Lock()
	p.sl.sleepy[o], p.sl.asleep[o] = false, false
	fo, r := p.stepLocked(time.Now())
	p.mu.Unlock()
	p.announce(fo, r)
}

// client is an HTTP client to vLLM i alone (its supervisor's dial).
func (p *pair) client(i int) *http.Client {
	dial := p.m[i].sup.DialVLLM(&net.Dialer{Timeout: 5 * time.Second})
	return &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DialContext: dial}}
}

func (p *pair) url(i int, path string) string {
	return "http://" + net.JoinHostPort(p.host, strconv.Itoa(p.m[i].port)) + path
}

func (p *pair) post(c *http.Client, i int, path, body string) error {
	req, err := http.NewRequestWithContext(p.life, http.MethodPost, p.url(i, path), bytes.NewReader([]byte(body)))
	if err != nil {
		return err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if p.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

func (p *pair) getJSON(c *http.Client, i int, path string, v any) error {
	req, err := http.NewRequestWithContext(p.life, http.MethodGet, p.url(i, path), nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(v)
}

// sleepView marks a sleeping standby as not ready for the decision.
func (p *pair) sleepViewLocked(i int, v *vllmView) {
	if !p.sleepMode {
		return
	}
	if v.State != status.StateReady && v.State != stateDying {
		p.sl.sleepy[i], p.sl.asleep[i] = false, false
		return
	}
	if p.sl.sleepy[i] {
		v.State = stateAsleep
	}
}
