package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/notify/notifytest"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// watchdogUSEC is the WatchdogSec the guard runs under in these tests. The
// guard pings every half of it when its loop turned within that half; its
// loop turns every second, so 6 s leaves 2 s of slack for a loaded machine
// (under 4 s the guard itself warns that a healthy loop may miss).
const watchdogUSEC = 6 * time.Second

// wedgedAfter is how long /livez lets the loop stand still before it
// answers 503: a wait shorter than this would prove nothing about /livez.
const wedgedAfter = 30 * time.Second

// The two long waits of the guard's cleanup keep its heartbeat going, as
// systemd (WATCHDOG=1) and the kubelet (/livez) see it from outside: a
// guard killed in the middle of its own cleanup of a hung vLLM would lose
// that incident.
func TestHeartbeatDuringLongWaits(t *testing.T) {
	t.Parallel()

	// The driver frees the dead vLLM's memory 40 s late (the stand-in's
	// release delay): the guard waits for it in waiting_gpu.
	t.Run("release_wait", func(t *testing.T) {
		t.Parallel()
		const delay = 40 * time.Second
		s := quick(newScene(t))
		hb := watchHeartbeat(t, s)
		if err := os.WriteFile(filepath.Join(s.gpuDir, "release_delay_ms"), fmt.Appendf(nil, "%d\n", delay.Milliseconds()), 0o644); err != nil {
			t.Fatal(err)
		}
		// A SIGSEGV leaves the dead processes' memory to the driver (a
		// clean exit frees it at once, and the delay would not apply).
		oneShot(s, "segv_after=300ms")
		s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n[gpu]\nsample_interval = \"200ms\"\nrelease_timeout = \"120s\"\n"
		s.start()
		// The fault fires 300 ms after vLLM's startup line, before or after
		// the guard's own readiness (a loaded machine probes slower): the
		// wait after it is what this test is about.
		crash := s.WaitEvent("the crash", 1, 60*time.Second, isExited)
		hb.pollLivez()
		wait := s.WaitEvent("the release wait", 1, 30*time.Second, after(crash, inState("waiting_gpu")))
		end := s.WaitEvent("the end of the release wait", 1, delay+60*time.Second, after(wait, kind(events.KindState)))
		if end.State != "backoff" {
			t.Fatalf("the release wait ended in %s (%s), want backoff after the release", end.State, end.Reason)
		}
		// The stand-in holds the memory for the whole delay, so the wait
		// covers the wedge threshold at any speed; this says the test
		// tests what it claims.
		if d := end.Time.Sub(wait.Time); d < wedgedAfter {
			t.Fatalf("the release wait lasted %s, less than /livez's %s", d, wedgedAfter)
		}
		hb.check(t, "the release wait", wait.Time, end.Time)
		s.WaitEvent("ready after the wait", 1, 60*time.Second, after(end, isReady))
		if n := s.CountEvents(exitedWith("gpu_busy")); n != 0 {
			t.Fatal("the restart ran into the old run's memory (gpu_busy)")
		}
		s.stopCleanly(30*time.Second, 10*time.Second)
	})

	// vLLM ignores SIGTERM and an operator asks for a restart: the guard
	// stays in stopping for stop_timeout (35 s), then kills the group.
	t.Run("stop_timeout", func(t *testing.T) {
		t.Parallel()
		const stopTimeout = 35 * time.Second
		s := quick(newScene(t))
		hb := watchHeartbeat(t, s)
		oneShot(s, "ignore_sigterm") // the run after the restart stops normally
		s.editConfig = func(c string) string {
			return strings.Replace(c, `stop_timeout = "3s"`, fmt.Sprintf("stop_timeout = %q", stopTimeout), 1)
		}
		s.extra = "\n[restart]\ninitial_delay = \"50ms\"\n"
		s.start()
		ready := s.WaitEvent("ready", 1, 60*time.Second, isReady)
		hb.pollLivez()
		c := control.NewClient(s.socket())
		defer c.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := c.Restart(ctx)
		cancel()
		if err != nil {
			t.Fatalf("restart: %v", err)
		}
		stopping := s.WaitEvent("stopping", 1, 30*time.Second, after(ready, inState("stopping")))
		end := s.WaitEvent("the end of stopping", 1, stopTimeout+60*time.Second, after(stopping, kind(events.KindState)))
		if d := end.Time.Sub(stopping.Time); d < wedgedAfter {
			t.Fatalf("stopping lasted %s, less than /livez's %s: vLLM did not ignore SIGTERM", d, wedgedAfter)
		}
		hb.check(t, "the stop_timeout escalation", stopping.Time, end.Time)
		s.WaitEvent("ready again", 2, 60*time.Second, isReady)
		// The simulator ignored the SIGTERM (its marker) and the next run
		// started: the group was killed, the escalation.
		if _, err := os.Stat(s.env["FAKEVLLM_FAULT_MARKER"]); err != nil {
			t.Fatalf("vLLM never ignored a SIGTERM (no marker): %v", err)
		}
		s.stopCleanly(30*time.Second, 10*time.Second)
	})
}

// heartbeat is what systemd and the kubelet see of the guard: every
// WATCHDOG=1 datagram with the time it came, and every answer of /livez.
type heartbeat struct {
	s    *scene
	sock *notifytest.Socket
	stop chan struct{}
	wg   sync.WaitGroup

	mu    sync.Mutex
	pings []time.Time
	livez []livezAnswer
}

type livezAnswer struct {
	at     time.Time
	status int
	err    error
}

// watchHeartbeat sets the scene's guard up with a notification socket,
// WATCHDOG_USEC and an HTTP listener, and starts reading the datagrams.
func watchHeartbeat(t *testing.T, s *scene) *heartbeat {
	t.Helper()
	hb := &heartbeat{s: s, sock: notifytest.Open(t), stop: make(chan struct{})}
	s.httpListen = fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	s.guardEnv = map[string]string{"NOTIFY_SOCKET": hb.sock.Path(), "WATCHDOG_USEC": fmt.Sprint(watchdogUSEC.Microseconds())}
	hb.wg.Add(1)
	go func() {
		defer hb.wg.Done()
		for {
			select {
			case <-hb.stop:
				return
			default:
			}
			if m, ok := hb.sock.Read(200 * time.Millisecond); ok && m == "WATCHDOG=1" {
				hb.mu.Lock()
				hb.pings = append(hb.pings, time.Now())
				hb.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		close(hb.stop)
		hb.wg.Wait()
	})
	return hb
}

// pollLivez asks GET /livez four times a second until the test ends; call
// it once the guard listens.
func (hb *heartbeat) pollLivez() {
	url := "http://" + hb.s.httpListen + "/livez"
	client := &http.Client{Timeout: 10 * time.Second}
	hb.wg.Add(1)
	go func() {
		defer hb.wg.Done()
		for {
			a := livezAnswer{}
			resp, err := client.Get(url)
			a.at, a.err = time.Now(), err
			if err == nil {
				a.status = resp.StatusCode
				resp.Body.Close()
			}
			hb.mu.Lock()
			hb.livez = append(hb.livez, a)
			hb.mu.Unlock()
			select {
			case <-hb.stop:
				return
			case <-time.After(250 * time.Millisecond): // the pace of the polls, not a wait
			}
		}
	}()
}

// check asserts over [from, to] (the times of the events that opened and
// closed a wait): no stretch without WATCHDOG=1 longer than WATCHDOG_USEC
// (from the start to the first ping, between two, from the last to the
// end), and every /livez answer so far 200, some of them inside the wait.
func (hb *heartbeat) check(t *testing.T, what string, from, to time.Time) {
	t.Helper()
	hb.mu.Lock()
	pings := append([]time.Time(nil), hb.pings...)
	livez := append([]livezAnswer(nil), hb.livez...)
	hb.mu.Unlock()
	last, n := from, 0
	for _, p := range pings {
		if p.Before(from) {
			continue
		}
		if p.After(to) {
			break
		}
		if gap := p.Sub(last); gap > watchdogUSEC {
			t.Errorf("during %s: no WATCHDOG=1 for %s (WATCHDOG_USEC %s), until %s", what, gap.Round(time.Millisecond), watchdogUSEC, p.Format(time.StampMilli))
		}
		last, n = p, n+1
	}
	if gap := to.Sub(last); gap > watchdogUSEC {
		t.Errorf("during %s: no WATCHDOG=1 for the last %s before it ended (WATCHDOG_USEC %s)", what, gap.Round(time.Millisecond), watchdogUSEC)
	}
	inside := 0
	for _, a := range livez {
		if a.err != nil || a.status != http.StatusOK {
			t.Errorf("/livez at %s: status %d, error %v; want 200 throughout", a.at.Format(time.StampMilli), a.status, a.err)
		}
		if !a.at.Before(from) && !a.at.After(to) {
			inside++
		}
	}
	if inside == 0 {
		t.Errorf("no /livez answer during %s", what)
	}
	t.Logf("%s: %s, %d WATCHDOG=1, %d /livez answers (all 200 unless said above)", what, to.Sub(from).Round(time.Millisecond), n, inside)
}
