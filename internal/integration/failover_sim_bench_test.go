package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// Issue 42 item 4 on the simulator's GPU model (the shipped guard, no race
// detector): a failover to a sleeping standby against a plain restart, and
// a restart with the weight cache daemon against one without. The
// simulator's times are its knobs (below), not a GPU's: the figures show
// the guard's overhead around them and the order of events. `make
// bench-failover-sim` runs both once and prints a table each.

const (
	simStreams = 8  // greedy streams through the proxy at each death
	simTokens  = 48 // each stream's tokens, 2 a chunk
)

// The simulator's times: a weight load long enough to see (15 GiB at
// 3 GiB/s from a disk), the other phases at their defaults, 50 ms a token;
// a wake from sleep level 1 is the default (the weights back at 20 GiB/s:
// 0.75 s); the weight cache daemon's map the default 100 ms.
var simTimes = map[string]string{
	"FAKEVLLM_ERA":            "v1",
	"FAKEVLLM_LOAD_WEIGHTS":   "5s",
	"FAKEVLLM_TOKEN_INTERVAL": "50ms",
}

// simFailoverRestart is [restart] for both benchmarks: a 1 s first backoff,
// as the real vLLM's benchmark (the default is 5 s).
const simFailoverRestart = "\n[restart]\ninitial_delay = \"1s\"\n\n[gpu]\nsample_interval = \"100ms\"\n"

// simView is what one streaming client got.
type simView struct {
	status      int
	ids         []int
	text        string
	done, errEv bool
	err         error
	// cutAt: the proxy's first hold comment; continuedAt: the first chunk
	// with token ids after it (the first continued token).
	cutAt, continuedAt time.Time
	firstAt            time.Time // the first chunk with token ids
}

var simClient = &http.Client{Timeout: 2 * time.Minute}

// simStream reads one streaming completion; progress gets the ids so far.
func simStream(base, body string, progress func(n int)) simView {
	resp, err := simClient.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return simView{err: err}
	}
	defer resp.Body.Close()
	v := simView{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		return v
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), ": vllm-guard: ") && v.cutAt.IsZero() {
			v.cutAt = time.Now()
		}
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if d == "[DONE]" {
			v.done = true
			continue
		}
		var c struct {
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				Text     string `json:"text"`
				TokenIDs []int  `json:"token_ids"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(d), &c) != nil || c.Error != nil {
			v.errEv = true
			continue
		}
		for _, ch := range c.Choices {
			if len(ch.TokenIDs) > 0 {
				now := time.Now()
				if v.firstAt.IsZero() {
					v.firstAt = now
				}
				if !v.cutAt.IsZero() && v.continuedAt.IsZero() {
					v.continuedAt = now
				}
			}
			v.ids = append(v.ids, ch.TokenIDs...)
			v.text += ch.Text
		}
		if progress != nil {
			progress(len(v.ids))
		}
	}
	v.err = sc.Err()
	return v
}

func simBody(i int) string {
	return fmt.Sprintf(`{"model":"test-model","prompt":"hello there friend %d","max_tokens":%d,"stream":true,"stream_interval":2,`+
		`"return_token_ids":true,"temperature":0}`, i, simTokens)
}

// simDeath is what one kill of the serving EngineCore under the streams
// cost their clients.
type simDeath struct {
	killAt                    time.Time
	continued                 []time.Duration
	failed, cut, wrongIDs     int
	wrongTexts, short         int
	serving                   time.Duration // kill → a vLLM serving again (off: the restarted one ready; sleep: the failover to the woken standby)
	guardFirstToken           float64       // sleep: the guard's own failover first_token_seconds (from the death seen)
	standbyAgain, standbyNote string
}

// sleepFailoverScene: one simulated H100, the proxy, and with sleep
// [standby] mode = "sleep" (the standby b on the same GPU, asleep).
func sleepFailoverScene(b *testing.B, sleep bool) (*scene, string) {
	s := plainScene(b)
	for k, v := range simTimes {
		s.env[k] = v
	}
	proxy := fmt.Sprintf("http://127.0.0.1:%d", testkit.FreePort(b))
	s.extra = simFailoverRestart + fmt.Sprintf("\n[proxy]\nlisten = %q\n", strings.TrimPrefix(proxy, "http://"))
	if sleep {
		s.extra += fmt.Sprintf("\n[standby]\nmode = \"sleep\"\nport = %d\n", testkit.FreePort(b))
	}
	return s, proxy
}

// BenchmarkSleepFailover: a death of the serving vLLM under 8 greedy
// streams through the proxy (completions, 2 ids a chunk), SIGKILL of its
// EngineCore once each stream has 10 ids, with [standby] off (the plain
// restart: a weight load) and mode = "sleep" (the standby on the same GPU,
// woken once the dead one's memory is released). Per death: kill → first
// continued token p50 / p99 over the streams (the client's view: the
// SIGKILL to the first chunk with ids after the proxy's hold comment),
// failed, cut, token ids and texts that differ from vLLM's own
// uninterrupted answers, kill → serving again, and whether a standby is
// ready again.
//
//	make bench-failover-sim
func BenchmarkSleepFailover(b *testing.B) {
	for range b.N {
		var rows []string
		for _, sleep := range []bool{false, true} {
			rows = append(rows, sleepFailoverVariant(b, sleep))
		}
		fmt.Printf("\n%s\n%s\n", sleepHeader, strings.Join(rows, "\n"))
	}
}

const sleepHeader = "standby  short at kill  kill→first continued token p50 / p99 / max  failed  cut  ids wrong  texts wrong  kill→serving again  guard's first token  standby again"

func sleepFailoverVariant(b *testing.B, sleep bool) string {
	s, proxy := sleepFailoverScene(b, sleep)
	s.start()
	name := "off"
	ready := s.WaitEvent("vLLM ready", 1, 60*time.Second, isReady)
	if sleep {
		name = "sleep"
		s.WaitEvent("b asleep", 1, 60*time.Second, of("b", events.RoleStandby, decided("standby_asleep")))
		ready = s.WaitEvent("a ready (serving)", 1, 60*time.Second, of("a", events.RoleServing, isReady))
	}
	want := simOracle(b, fmt.Sprintf("http://127.0.0.1:%d", s.port))
	d := s.killUnderStreams(b, proxy, ready.PID, want)
	if sleep {
		fo := s.WaitEvent("the failover to b", 1, 60*time.Second, kind(events.KindFailover))
		d.serving = fo.Time.Sub(d.killAt)
		if st := s.standbyStatus(); st.LastFailover != nil {
			d.guardFirstToken = st.LastFailover.FirstTokenSeconds
		}
		testkit.WaitFor(b, "a waiting for room, with no process", 60*time.Second, func() bool {
			st := s.standbyStatus()
			return st.Serving == "b" && st.VLLMs[0].State == "waiting_gpu" && st.VLLMs[0].PID == 0
		})
		d.standbyAgain = "none: a waits for room beside the awake b"
	} else {
		again := s.WaitEvent("vLLM ready again", 2, 60*time.Second, isReady)
		d.serving = again.Time.Sub(d.killAt)
		d.standbyAgain = "—"
	}
	s.Stop(30 * time.Second)
	if len(d.continued) > 0 {
		b.ReportMetric(simPercentile(d.continued, 50).Seconds(), "s-first-token-p50-"+name)
		b.ReportMetric(simPercentile(d.continued, 99).Seconds(), "s-first-token-p99-"+name)
	}
	b.ReportMetric(d.serving.Seconds(), "s-serving-again-"+name)
	b.ReportMetric(float64(d.failed+d.cut), "streams-failed-or-cut-"+name)
	b.ReportMetric(float64(d.wrongIDs), "ids-wrong-"+name)
	guard := "—"
	if d.guardFirstToken > 0 {
		guard = fmt.Sprintf("%.2f s", d.guardFirstToken)
	}
	row := fmt.Sprintf("%-7s  %13d  %13s / %s / %s  %6d  %3d  %9d  %11d  %18s  %19s  %s", name, d.short,
		simSeconds(simPercentile(d.continued, 50)), simSeconds(simPercentile(d.continued, 99)), simSeconds(simPercentile(d.continued, 100)),
		d.failed, d.cut, d.wrongIDs, d.wrongTexts, simSeconds(d.serving), guard, d.standbyAgain)
	fmt.Println(row)
	return row
}

// simOracle is vLLM's own uninterrupted answer to each stream, asked of
// the serving vLLM directly (all at once: the simulator's greedy answer
// depends on the prompt alone).
func simOracle(b *testing.B, base string) []simView {
	want := make([]simView, simStreams)
	var wg sync.WaitGroup
	for i := range simStreams {
		wg.Go(func() { want[i] = simStream(base, simBody(i), nil) })
	}
	wg.Wait()
	for i, w := range want {
		if w.err != nil || !w.done || w.errEv || len(w.ids) != simTokens {
			b.Fatalf("vLLM's own answer %d: %+v", i, w)
		}
	}
	return want
}

// killUnderStreams runs the streams through the proxy, SIGKILLs the
// EngineCore of the API server apiPID once each has 10 ids, and waits
// for every stream to end.
func (s *scene) killUnderStreams(b *testing.B, proxy string, apiPID int, want []simView) *simDeath {
	kids := childrenOf(apiPID)
	if len(kids) != 1 {
		b.Fatalf("API server %d has children %v; want its EngineCore alone", apiPID, describe(kids))
	}
	var mu sync.Mutex
	sofar := make([]int, simStreams)
	tenIn, allTen := 0, make(chan struct{})
	got := make([]simView, simStreams)
	var wg sync.WaitGroup
	for i := range simStreams {
		wg.Go(func() {
			got[i] = simStream(proxy, simBody(i), func(n int) {
				mu.Lock()
				defer mu.Unlock()
				if sofar[i] < 10 && n >= 10 {
					if tenIn++; tenIn == simStreams {
						close(allTen)
					}
				}
				sofar[i] = n
			})
		})
	}
	select {
	case <-allTen:
	case <-time.After(60 * time.Second):
		b.Fatal("the streams did not all reach 10 tokens in 60 s")
	}
	killAt := time.Now()
	if err := syscall.Kill(kids[0], syscall.SIGKILL); err != nil {
		b.Fatal(err)
	}
	d := &simDeath{killAt: killAt}
	mu.Lock()
	for _, n := range sofar {
		if n < simTokens {
			d.short++
		}
	}
	mu.Unlock()
	wg.Wait()
	for i, v := range got {
		switch {
		case v.err != nil || v.status != http.StatusOK:
			d.failed++
		case !v.done || v.errEv:
			d.cut++
		}
		clean := v.done && !v.errEv
		d.wrongIDs += simIDsWrong(v.ids, want[i].ids, clean)
		if clean && v.text != want[i].text {
			d.wrongTexts++
		}
		if !v.continuedAt.IsZero() {
			d.continued = append(d.continued, v.continuedAt.Sub(killAt))
		}
	}
	return d
}

// simIDsWrong counts the ids of got that differ from want's at the same
// place, and, when the stream finished, those of want it lacks.
func simIDsWrong(got, want []int, finished bool) int {
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

// simPercentile is the p-th percentile of ds (nearest rank), 0 when empty.
func simPercentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[min(max(i, 0), len(s)-1)]
}

func simSeconds(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// BenchmarkRestartWeightDaemon: vLLM's restart after a SIGKILL of its
// EngineCore, twice, with [weights] cache = "daemon" (vLLM started with
// --load-format ipc_cache maps the weights the daemon holds) and "off"
// (vLLM reads them from the disk: the simulator's 5 s). Per restart: kill
// → ready again, and kill → the first token of a streaming request sent
// through the proxy right after the kill (held until vLLM is back). Also
// the first start (the guard's start → ready): with the daemon, its load
// and then vLLM's map.
//
//	make bench-failover-sim
func BenchmarkRestartWeightDaemon(b *testing.B) {
	for range b.N {
		var rows []string
		for _, daemon := range []bool{false, true} {
			rows = append(rows, restartWeightVariant(b, daemon)...)
		}
		fmt.Printf("\n%s\n%s\n", weightHeader, strings.Join(rows, "\n"))
	}
}

const weightHeader = "weights  restart  first start→ready  kill→ready  kill→first token of a held request  disk loads by vLLM so far"

func restartWeightVariant(b *testing.B, daemon bool) []string {
	s := plainScene(b)
	for k, v := range simTimes {
		s.env[k] = v
	}
	tmp, err := os.MkdirTemp("", "wc") // the daemon's socket path must fit a Unix socket name
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(tmp) })
	s.env["TMPDIR"] = tmp
	proxy := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(b))
	name := map[bool]string{false: "off", true: "daemon"}[daemon]
	s.extra = simFailoverRestart + fmt.Sprintf("\n[proxy]\nlisten = %q\n\n[weights]\ncache = %q\n", proxy, name)
	began := time.Now()
	s.start()
	prev := s.WaitEvent("the first ready", 1, 60*time.Second, isReady)
	firstStart := prev.Time.Sub(began)
	b.ReportMetric(firstStart.Seconds(), "s-first-start-"+name)
	var rows []string
	for i := range 2 {
		kids := childrenOf(prev.PID)
		if len(kids) != 1 {
			b.Fatalf("API server %d has children %v; want its EngineCore alone", prev.PID, describe(kids))
		}
		killAt := time.Now()
		if err := syscall.Kill(kids[0], syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		held := simStream("http://"+proxy, simBody(i), nil)
		prev = s.WaitEvent("ready after the kill", i+2, 60*time.Second, isReady)
		if held.err != nil || held.status != http.StatusOK || !held.done || held.errEv || len(held.ids) != simTokens {
			b.Fatalf("the request held through restart %d: status %d, %d ids, [DONE] %v, error event %v, err %v", i+1, held.status, len(held.ids), held.done, held.errEv, held.err)
		}
		ready, first := prev.Time.Sub(killAt), held.firstAt.Sub(killAt)
		b.ReportMetric(ready.Seconds(), fmt.Sprintf("s-kill-to-ready-%s-%d", name, i+1))
		b.ReportMetric(first.Seconds(), fmt.Sprintf("s-kill-to-first-token-%s-%d", name, i+1))
		start := "—"
		if i == 0 {
			start = simSeconds(firstStart)
		}
		rows = append(rows, fmt.Sprintf("%-7s  %7d  %17s  %10s  %35s  %d", name, i+1, start, simSeconds(ready), simSeconds(first),
			s.CountLogs(vllmLine("Loading weights took"))))
		fmt.Println(rows[len(rows)-1])
	}
	s.Stop(30 * time.Second)
	return rows
}
