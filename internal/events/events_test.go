package events

import (
	"bufio"
	"bytes"
	"encoding/json"
	"sync"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func TestBusDeliversInOrderAndAHandlerMayPublish(t *testing.T) {
	b := NewBus()
	var got []string
	b.Handle(func(e Event) {
		got = append(got, string(e.Kind)+":"+e.State)
		if e.Kind == KindExited {
			// An OOM raises an alert from inside the consumer.
			b.Publish(Event{Kind: KindAlert, State: "oom"})
		}
	})
	var seqs []uint64
	b.Handle(func(e Event) { seqs = append(seqs, e.Seq) })
	b.Publish(Event{Kind: KindState, State: "ready"})
	b.Publish(Event{Kind: KindExited, State: "x"})
	b.Publish(Event{Kind: KindState, State: "backoff"})
	want := []string{"state:ready", "exited:x", "alert:oom", "state:backoff"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] || seqs[i] != uint64(i+1) {
			t.Fatalf("got %v seqs %v, want %v with seqs 1..4", got, seqs, want)
		}
	}
}

func TestBusFromManyGoroutinesLosesNothing(t *testing.T) {
	b := NewBus()
	var mu sync.Mutex
	seen := map[uint64]bool{}
	last := uint64(0)
	inOrder := true
	b.Handle(func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		seen[e.Seq] = true
		inOrder = inOrder && e.Seq == last+1
		last = e.Seq
	})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				b.Publish(Event{Kind: KindProgress})
			}
		})
	}
	wg.Wait()
	if len(seen) != 1600 || !inOrder {
		t.Fatalf("%d events seen (want 1600), in order: %v", len(seen), inOrder)
	}
}

func TestJSONLinesWritesOneEventALine(t *testing.T) {
	var buf bytes.Buffer
	j := NewJSONLines(&buf, nil)
	code := 78
	j.Put(Event{Seq: 1, Kind: KindReady, PID: 42})
	j.Put(Event{Seq: 2, Kind: KindStopped, ExitCode: &code})
	j.Close()
	sc := bufio.NewScanner(&buf)
	var got []Event
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, e)
	}
	if len(got) != 2 || got[0].Kind != KindReady || got[0].PID != 42 || *got[1].ExitCode != 78 || j.Dropped() != 0 {
		t.Fatalf("%+v", got)
	}
}

func TestQueueDropsWhenTheConsumerFallsBehind(t *testing.T) {
	release := make(chan struct{})
	var n int
	q := NewQueue(1, func(Event) { <-release; n++ })
	for range 10 {
		q.Put(Event{})
	}
	close(release)
	q.Close()
	if q.Dropped() == 0 || uint64(n)+q.Dropped() != 10 {
		t.Fatalf("consumed %d, dropped %d, of 10", n, q.Dropped())
	}
}
