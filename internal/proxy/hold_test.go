package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// outlookUp is the guard's side with an Outlook: whether vLLM is coming
// back and when.
type outlookUp struct {
	*fakeUp
	comingBack bool
	readyIn    time.Duration
}

func (o *outlookUp) Outlook() (bool, time.Duration, time.Duration, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.comingBack, o.readyIn, DefaultHoldLimit, "vLLM restarting after oom, rung 1"
}

// newHoldRig is newRig over an outlookUp: coming back in 42 s.
func newHoldRig(t *testing.T, cfg config.Proxy, seqs int, h http.HandlerFunc) (*rig, *outlookUp) {
	t.Helper()
	r := &rig{t: t, reg: prometheus.NewRegistry()}
	r.upstream = httptest.NewServer(h)
	r.up = &fakeUp{url: r.upstream.URL, ready: true, seqs: seqs}
	o := &outlookUp{fakeUp: r.up, comingBack: true, readyIn: 42 * time.Second}
	r.p = New(cfg, o, r.reg, nil)
	r.p.noticeWait = 50 * time.Millisecond
	r.front = httptest.NewServer(r.p)
	r.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1000}}
	t.Cleanup(r.close)
	return r, o
}

func (r *rig) setReady(ready bool) {
	r.up.set(func(f *fakeUp) { f.ready = ready })
	r.p.Notify()
}

func (r *rig) send(path, body string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		resp, err := r.client.Post(r.front.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- result{code: resp.StatusCode, hdr: resp.Header, body: string(b), err: err}
	}()
	return ch
}

// killConn is vLLM dying under a request: its connection closes with no
// answer.
func killConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

// A request that arrives while vLLM restarts is held past queue_timeout
// (issue 30 item 1) and answered once vLLM is back.
func TestArrivalHeldWhileRestarting(t *testing.T) {
	cfg := proxyConfig()
	cfg.QueueTimeout = config.Duration{Duration: time.Millisecond}
	r, _ := newHoldRig(t, cfg, 4, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	r.setReady(false)
	res := r.send("/v1/completions", `{"prompt":"x"}`)
	testkit.WaitFor(t, "the request held", 30*time.Second, func() bool { return r.p.Stats().Held == 1 })
	r.setReady(true)
	if got := <-res; got.code != 200 || got.body != "ok" {
		t.Fatalf("got %d %q (err %v); want vLLM's answer once it is back", got.code, got.body, got.err)
	}
	if s := r.p.Stats(); s.Rejected != 0 || s.Held != 0 {
		t.Fatalf("stats %+v: want nothing refused, nothing held", s)
	}
}

// Beyond the hold limit, or the queue while vLLM is down: 503 with the
// expected remaining restart time as Retry-After.
func TestHoldBoundsAnswer503WithRestartTime(t *testing.T) {
	t.Run("hold limit", func(t *testing.T) {
		cfg := proxyConfig()
		cfg.HoldTimeout = config.Duration{Duration: 50 * time.Millisecond}
		r, _ := newHoldRig(t, cfg, 4, func(w http.ResponseWriter, _ *http.Request) { t.Error("vLLM got a request while down") })
		r.setReady(false)
		got := <-r.send("/v1/completions", `{}`)
		if got.code != 503 || got.hdr.Get("Retry-After") != "42" || !strings.Contains(got.body, "hold limit") {
			t.Fatalf("got %d Retry-After %q %q; want 503, Retry-After 42 (the restart's expected rest), the hold limit named",
				got.code, got.hdr.Get("Retry-After"), got.body)
		}
		if s := r.p.Stats(); s.RejectedBy[reasonNotReady] != 1 {
			t.Fatalf("rejections %v; want one not_ready", s.RejectedBy)
		}
	})
	t.Run("queue size", func(t *testing.T) {
		cfg := proxyConfig()
		cfg.QueueSize = 1
		r, _ := newHoldRig(t, cfg, 4, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
		r.setReady(false)
		first := r.send("/v1/completions", `{}`)
		testkit.WaitFor(t, "the first request held", 30*time.Second, func() bool { return r.p.Stats().Held == 1 })
		got := <-r.send("/v1/completions", `{}`)
		if got.code != 503 || got.hdr.Get("Retry-After") != "42" {
			t.Fatalf("over queue_size while down: got %d Retry-After %q %q; want 503 with Retry-After 42", got.code, got.hdr.Get("Retry-After"), got.body)
		}
		r.setReady(true)
		if got := <-first; got.code != 200 {
			t.Fatalf("the held request got %d %q", got.code, got.body)
		}
	})
}

// While the guard has given up, a request is refused at once, and one
// held is refused when the guard gives up.
func TestGaveUpRefusesHeldAndNew(t *testing.T) {
	r, o := newHoldRig(t, proxyConfig(), 4, func(w http.ResponseWriter, _ *http.Request) { t.Error("vLLM got a request while down") })
	r.setReady(false)
	held := r.send("/v1/completions", `{}`)
	testkit.WaitFor(t, "the request held", 30*time.Second, func() bool { return r.p.Stats().Held == 1 })
	o.set(func(*fakeUp) { o.comingBack = false })
	r.p.Notify()
	for i, ch := range []<-chan result{held, r.send("/v1/chat/completions", `{}`)} {
		got := <-ch
		if got.code != 503 || !strings.Contains(got.body, "not coming back") {
			t.Fatalf("request %d: got %d %q; want 503 saying vLLM is not coming back", i, got.code, got.body)
		}
	}
}

// A request in flight when vLLM dies (its connection closes before any
// answer, or vLLM answers its engine's death with a 500) is sent again,
// body and all, once vLLM is back: the client gets one answer (item 2).
func TestDeathBeforeAnswerReplayed(t *testing.T) {
	const deadBody = `{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"InternalServerError","param":null,"code":500}}`
	for _, tc := range []struct {
		name    string
		noticed bool // the guard sees the death before the proxy does
		die     func(http.ResponseWriter)
	}{
		{"connection closed", true, killConn},
		{"engine dead 500, before the guard notices", false, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(500)
			io.WriteString(w, deadBody)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			var noticed atomic.Bool
			died := make(chan struct{})
			var r *rig
			r, _ = newHoldRig(t, proxyConfig(), 4, func(w http.ResponseWriter, req *http.Request) {
				b, _ := io.ReadAll(req.Body)
				if string(b) != `{"prompt":"again"}` {
					t.Errorf("vLLM got body %q", b)
				}
				if n := calls.Add(1); n == 1 || !noticed.Load() {
					// Until the guard sees the death, vLLM still dies
					// under the request (it may be sent again meanwhile).
					if tc.noticed {
						r.setReady(false)
						noticed.Store(true)
					}
					tc.die(w)
					if n == 1 {
						close(died)
					}
					return
				}
				io.WriteString(w, "fresh")
			})
			res := r.send("/v1/completions", `{"prompt":"again"}`)
			<-died
			if !tc.noticed {
				r.setReady(false)
				noticed.Store(true)
			}
			testkit.WaitFor(t, "the request held", 30*time.Second, func() bool { return r.p.Stats().Held == 1 })
			r.setReady(true)
			got := <-res
			n := calls.Load()
			if got.code != 200 || got.body != "fresh" || n < 2 || (tc.noticed && n != 2) {
				t.Fatalf("got %d %q after %d calls (err %v); want the answer to the request sent again", got.code, got.body, n, got.err)
			}
			testkit.WaitFor(t, "the slot given back", 30*time.Second, func() bool { return r.p.Stats().Inflight == 0 })
			if s := r.p.Stats(); s.Resumed != uint64(n-1) || s.Admitted != uint64(n) || s.Suspects != 0 {
				t.Fatalf("stats %+v after %d calls: want every send but the first resumed, the slot taken again for each, no suspect", s, n)
			}
			if m := metricValue(t, r.reg, "vllm_guard_proxy_resumed_total", "how", ResumedReplayed); m != float64(n-1) {
				t.Fatalf("vllm_guard_proxy_resumed_total{how=replayed} = %v after %d calls", m, n)
			}
		})
	}
}

// A 500 that is not vLLM's engine dying is the request's own answer:
// passed on, sent once.
func TestOther500PassedOn(t *testing.T) {
	var calls atomic.Int32
	r, _ := newHoldRig(t, proxyConfig(), 4, func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(500)
		io.WriteString(w, `{"error":{"message":"tokenizer failed"}}`)
	})
	got := <-r.send("/v1/completions", `{}`)
	if got.code != 500 || !strings.Contains(got.body, "tokenizer failed") || calls.Load() != 1 {
		t.Fatalf("got %d %q after %d calls; want vLLM's 500 passed on, sent once", got.code, got.body, calls.Load())
	}
}

// A request in flight at two deaths in a row is not sent a third time
// (item 4, resume_limit 2): it ends with an error that says so, and the
// guard hears of it with its size.
func TestSuspectNotSentAThirdTime(t *testing.T) {
	var calls atomic.Int32
	died := make(chan struct{}, 4)
	var r *rig
	r, _ = newHoldRig(t, proxyConfig(), 4, func(w http.ResponseWriter, req *http.Request) {
		io.ReadAll(req.Body)
		calls.Add(1)
		r.setReady(false) // the giant request OOMs vLLM on every start
		r.p.Died()        // and the guard records each death
		killConn(w)
		died <- struct{}{}
	})
	var mu sync.Mutex
	var told []Suspect
	r.p.SetOnSuspect(func(s Suspect) { mu.Lock(); told = append(told, s); mu.Unlock() })
	const body = `{"prompt":"giant"}`
	res := r.send("/v1/completions", body)
	<-died
	testkit.WaitFor(t, "the request held after the first death", 30*time.Second, func() bool { return r.p.Stats().Held == 1 })
	r.setReady(true)
	<-died
	got := <-res
	var e apiError
	if got.code != http.StatusUnprocessableEntity || json.Unmarshal([]byte(got.body), &e) != nil || !strings.Contains(e.Error.Message, "resume_limit") {
		t.Fatalf("got %d %q; want 422 in OpenAI's shape naming resume_limit", got.code, got.body)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("vLLM got the request %d times, want 2", n)
	}
	mu.Lock()
	defer mu.Unlock()
	s := r.p.Stats()
	if len(told) != 1 || told[0].BodyBytes != int64(len(body)) || told[0].Deaths != 2 || s.Suspects != 1 || s.LastSuspect == nil {
		t.Fatalf("told %+v, stats %+v; want the suspect named once, %d bytes, 2 deaths", told, s, len(body))
	}
	if n := metricValue(t, r.reg, "vllm_guard_proxy_resume_failed_total", "reason", FailedSuspect); n != 1 {
		t.Fatalf("resume_failed_total{reason=resume_limit} = %v, want 1", n)
	}
}

// A connection that closes while the guard sees vLLM ready throughout was
// no death: the request is sent once more, and a second such close is
// passed on.
func TestUnnoticedCloseSentOnceMore(t *testing.T) {
	var calls atomic.Int32
	r, _ := newHoldRig(t, proxyConfig(), 4, func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		killConn(w)
	})
	got := <-r.send("/v1/completions", `{}`)
	if got.code != 503 || calls.Load() != 2 {
		t.Fatalf("got %d %q after %d calls; want 503 after two", got.code, got.body, calls.Load())
	}
	if s := r.p.Stats(); s.Suspects != 0 {
		t.Fatalf("stats %+v: closes the guard never saw made a suspect", s)
	}
}

// resume = false is the proxy before issue 30: a death before any answer
// is a 503 at once, the request sent once.
func TestResumeOffDeathIs503(t *testing.T) {
	var calls atomic.Int32
	cfg := proxyConfig()
	cfg.Resume = false
	r, _ := newHoldRig(t, cfg, 4, func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		killConn(w)
	})
	got := <-r.send("/v1/completions", `{}`)
	if got.code != 503 || calls.Load() != 1 {
		t.Fatalf("got %d %q after %d calls; want 503 after one", got.code, got.body, calls.Load())
	}
	if n := metricValue(t, r.reg, "vllm_guard_proxy_resume_failed_total", "reason", FailedResumeOff); n != 1 {
		t.Fatalf("resume_failed_total{reason=resume_off} = %v, want 1", n)
	}
}

// Resumed requests are admitted before new ones, oldest first, within the
// limit in force (item 4); a resumed one is never refused for a full queue.
func TestResumedAdmittedFirstOldestFirst(t *testing.T) {
	l := newLimiter(1)
	l.set(1, 0, false, outlook{resume: true, comingBack: true, holdLimit: time.Hour})
	now := time.Now()
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	granted := make(chan struct{}, 3)
	next := make(chan struct{})
	ask := func(name string, a admit) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := l.acquire(context.Background(), a); err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			granted <- struct{}{}
			<-next
			l.release(a.cost, a.tokens)
		}()
	}
	queued := func(n int) func() bool {
		return func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.queue.Len() == n }
	}
	ask("new", admit{arrived: now, queueTimeout: time.Hour})
	testkit.WaitFor(t, "new queued", 30*time.Second, queued(1))
	ask("resumed-late", admit{arrived: now.Add(-time.Minute), queueTimeout: time.Hour, resumed: true})
	testkit.WaitFor(t, "resumed-late queued", 30*time.Second, queued(2))
	ask("resumed-old", admit{arrived: now.Add(-2 * time.Minute), queueTimeout: time.Hour, resumed: true})
	testkit.WaitFor(t, "resumed-old queued past queue_size 1", 30*time.Second, queued(3))
	if s := l.stats(); s.Held != 3 {
		t.Fatalf("held %d, want 3 while vLLM is down", s.Held)
	}
	l.set(1, 0, true, outlook{resume: true})
	for range 3 {
		<-granted
		next <- struct{}{}
	}
	wg.Wait()
	if want := []string{"resumed-old", "resumed-late", "new"}; strings.Join(order, ",") != strings.Join(want, ",") {
		t.Fatalf("admitted %v, want %v", order, want)
	}
}

// holdUntilReady, as a stream calls it: the slot is given back while it
// waits, tick says why every tickEvery, status counts a paused stream, and
// the slot is its again once vLLM is back.
func TestHoldUntilReadyTicksAPausedStream(t *testing.T) {
	r, _ := newHoldRig(t, proxyConfig(), 1, func(w http.ResponseWriter, _ *http.Request) {})
	r.p.tickEvery = time.Millisecond
	st := &reqState{arrived: time.Now()}
	if _, err := r.p.lim.acquire(context.Background(), admit{arrived: st.arrived, queueTimeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	st.slot = true
	r.setReady(false)
	whys := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- r.p.holdUntilReady(context.Background(), st, func(why string) {
			select {
			case whys <- why:
			default:
			}
		})
	}()
	if why := <-whys; why != "vLLM restarting after oom, rung 1" {
		t.Fatalf("tick said %q", why)
	}
	if s := r.p.Stats(); s.Held != 1 || s.Paused != 1 || s.Inflight != 0 {
		t.Fatalf("stats %+v: want one held, one paused stream, its slot given back", s)
	}
	r.setReady(true)
	if err := <-done; err != nil || !st.slot {
		t.Fatalf("hold ended with %v, slot %v; want nil and the slot taken again", err, st.slot)
	}
	if s := r.p.Stats(); s.Inflight != 1 || s.Paused != 0 {
		t.Fatalf("stats %+v after the hold", s)
	}
	st.giveBack(r.p.lim)
}

// vLLM answers its engine's death more than once before the guard sees it
// go: the request is not passed on nor made a suspect; it is sent again
// once vLLM is back.
func TestEngineDeadUntilTheGuardNotices(t *testing.T) {
	var calls atomic.Int32
	var healthy atomic.Bool
	r, _ := newHoldRig(t, proxyConfig(), 4, func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		if healthy.Load() {
			io.WriteString(w, "fresh")
			return
		}
		w.WriteHeader(500)
		io.WriteString(w, `{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause."}}`)
	})
	res := r.send("/v1/completions", `{}`)
	testkit.WaitFor(t, "the request sent again while the guard still calls vLLM ready", 30*time.Second, func() bool { return calls.Load() >= 2 })
	r.setReady(false)
	healthy.Store(true)
	testkit.WaitFor(t, "the request held", 30*time.Second, func() bool { return r.p.Stats().Held == 1 })
	r.setReady(true)
	if got := <-res; got.code != 200 || got.body != "fresh" {
		t.Fatalf("got %d %q after %d calls; want the answer once vLLM is back", got.code, got.body, calls.Load())
	}
	if s := r.p.Stats(); s.Suspects != 0 {
		t.Fatalf("stats %+v: one death made a suspect", s)
	}
}
