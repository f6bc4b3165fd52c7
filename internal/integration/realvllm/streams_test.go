package realvllm

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// The streams of a death scenario (TestNoClientSeesVLLMDie, the failover
// scenario and BenchmarkFailover): greedy, a fixed number of tokens,
// completions and chat alternating, half of them with a stop string taken
// from near the end of their answer (the proxy holds its text back and
// finds it after the cut), each with its uninterrupted answer.
const (
	deathStreams   = 16
	deathMaxTokens = 64
)

// streamSet is the streams and their uninterrupted answers, asked of one
// proxy (base: its URL).
type streamSet struct {
	base     string
	want     [][]int  // each stream's token ids, uninterrupted
	wantText []string // and its text
	stops    []string // its stop string, "" none
}

// newStreamSet runs each stream's request alone, uninterrupted, for the
// reference answers; a stop string that comes too soon is dropped.
func newStreamSet(t testing.TB, base string) *streamSet {
	t.Helper()
	ss := &streamSet{base: base, want: make([][]int, deathStreams), wantText: make([]string, deathStreams), stops: make([]string, deathStreams)}
	for i := range deathStreams {
		v := ss.run(i, nil)
		if v.err != nil || !v.done || v.errEv || len(v.ids) != deathMaxTokens {
			t.Fatalf("reference stream %d: %+v", i, v)
		}
		if i%4 >= 2 {
			r := []rune(v.text)
			ss.stops[i] = "zz-no-such-text"
			if len(r) > 12 {
				ss.stops[i] = string(r[len(r)-5 : len(r)-2])
			}
			if v = ss.run(i, nil); v.err != nil || !v.done || v.errEv || len(v.ids) < 20 {
				t.Logf("stream %d: stop %q comes too soon (%d ids); no stop string", i, ss.stops[i], len(v.ids))
				ss.stops[i] = ""
				v = ss.run(i, nil)
			}
		}
		ss.want[i], ss.wantText[i] = v.ids, v.text
	}
	return ss
}

// run sends stream i and reads it to its end.
func (ss *streamSet) run(i int, progress func(n int)) clientView {
	path, body := resumeRequest(i, i%2 == 1, true, deathMaxTokens)
	if ss.stops[i] != "" {
		body["stop"] = []string{ss.stops[i]}
	}
	return streamIDs(ss.base+path, body, progress)
}

// streamLoad is the streams in flight at once.
type streamLoad struct {
	mu     sync.Mutex
	sofar  []int // ids each stream has received
	tenIn  int   // streams past 10 ids
	allTen chan struct{}
	got    []clientView
	wg     sync.WaitGroup
}

// launch sends every stream at once.
func (ss *streamSet) launch() *streamLoad {
	l := &streamLoad{sofar: make([]int, deathStreams), allTen: make(chan struct{}), got: make([]clientView, deathStreams)}
	for i := range deathStreams {
		l.wg.Go(func() {
			l.got[i] = ss.run(i, func(n int) {
				l.mu.Lock()
				defer l.mu.Unlock()
				if l.sofar[i] < 10 && n >= 10 {
					if l.tenIn++; l.tenIn == deathStreams {
						close(l.allTen)
					}
				}
				l.sofar[i] = n
			})
		})
	}
	return l
}

// waitTenIn waits until every stream has received 10 ids.
func (l *streamLoad) waitTenIn(t testing.TB, bound time.Duration) {
	t.Helper()
	select {
	case <-l.allTen:
	case <-time.After(bound):
		t.Fatalf("the %d streams did not all reach 10 tokens in %s", deathStreams, bound)
	}
}

// received is the ids each stream has received so far.
func (l *streamLoad) received() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sofar)
}

// wait waits for every stream to end and returns what each client got.
func (l *streamLoad) wait() []clientView {
	l.wg.Wait()
	return l.got
}

// check fails t for every stream whose client did not get its
// uninterrupted answer: [DONE], no error event, one finish reason, one
// role delta (chat), the same token ids and text.
func (ss *streamSet) check(t testing.TB, got []clientView) {
	t.Helper()
	for i, v := range got {
		if v.err != nil || v.status != 200 || !v.done || v.errEv {
			t.Errorf("stream %d did not end cleanly: status %d, [DONE] %v, error event %v, err %v %s", i, v.status, v.done, v.errEv, v.err, v.raw)
			continue
		}
		if len(v.finish) != 1 {
			t.Errorf("stream %d: finish reasons %v, want exactly one", i, v.finish)
		}
		if i%2 == 1 && v.roles != 1 {
			t.Errorf("chat stream %d: %d role deltas, want 1", i, v.roles)
		}
		if !slices.Equal(v.ids, ss.want[i]) {
			t.Errorf("stream %d: token ids %v\nwant (uninterrupted)  %v", i, v.ids, ss.want[i])
		}
		if v.text != ss.wantText[i] {
			t.Errorf("stream %d (stop %q): text %q\nwant (uninterrupted) %q", i, ss.stops[i], v.text, ss.wantText[i])
		}
	}
}

// cutAt counts the streams still short of their answer when the engine
// died (atKill: the ids each had received).
func (ss *streamSet) cutAt(atKill []int) int {
	cut := 0
	for i, n := range atKill {
		if n < len(ss.want[i]) {
			cut++
		}
	}
	return cut
}
