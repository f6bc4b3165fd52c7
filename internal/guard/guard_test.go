package guard

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// newTestGuard wires a guard that is never run, and the decisions it says.
func newTestGuard(t *testing.T) (*Guard, func() []events.Event) {
	t.Helper()
	cfg := config.Default()
	cfg.VLLM.Command = []string{"vllm", "serve", "m"}
	cfg.Control.StateDir = t.TempDir()
	g, err := New(cfg, nil, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.inc.Close)
	var mu sync.Mutex
	var said []events.Event
	g.bus.Handle(func(e events.Event) {
		if e.Kind == events.KindDecision {
			mu.Lock()
			said = append(said, e)
			mu.Unlock()
		}
	})
	return g, func() []events.Event {
		mu.Lock()
		defer mu.Unlock()
		return append([]events.Event(nil), said...)
	}
}

// A broken file on SIGHUP changes nothing, and says so on the event stream
// with the file's error.
func TestReloadOfABrokenFileIsRefused(t *testing.T) {
	g, said := newTestGuard(t)
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("[restart]\nmax_delay = \"soon\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g.reload(bad, "")
	got := said()
	if len(got) != 1 || got[0].Decision != events.DecisionReload || !strings.HasPrefix(got[0].Reason, "refused: ") ||
		!strings.Contains(got[0].Reason, "max_delay") {
		t.Fatalf("reload of a broken file said %+v; want one reload decision, refused, naming max_delay", got)
	}
}

// A SIGHUP reload of nested inline tables, which took a running guard to
// 1.7 GB in BurntSushi/toml (issue 32 item 5), is refused before decoding,
// naming the line; the input is deep enough that decoding would take
// minutes.
func TestReloadOfADeeplyNestedFileIsRefusedBeforeDecoding(t *testing.T) {
	g, said := newTestGuard(t)
	deep := filepath.Join(t.TempDir(), "deep.toml")
	const n = 13000
	body := "[vllm]\nenv = " + strings.Repeat("{a = ", n) + "1" + strings.Repeat("}", n) + "\n"
	if err := os.WriteFile(deep, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	g.reload(deep, "")
	got := said()
	if len(got) != 1 || !strings.HasPrefix(got[0].Reason, "refused: "+deep+":2: ") || !strings.Contains(got[0].Reason, "nest more than 32 deep") {
		t.Fatalf("reload of a deeply nested file said %+v; want one reload refused at line 2", got)
	}
}

// SIGUSR1 means nothing; the first SIGTERM stops gracefully, the second
// kills vLLM's tree (it never stops twice).
func TestSignals(t *testing.T) {
	g, _ := newTestGuard(t)
	sigs := make(chan os.Signal)
	done := make(chan struct{})
	stops := make(chan struct{}, 2)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		g.HandleSignals(sigs, done, func() { stops <- struct{}{} }, "", "")
	}()
	sigs <- syscall.SIGUSR1
	sigs <- syscall.SIGTERM // handled once the next send is taken
	sigs <- syscall.SIGTERM
	sigs <- syscall.SIGUSR2 // the second SIGTERM was handled
	close(done)
	<-exited
	if len(stops) != 1 {
		t.Errorf("stop called %d times for two SIGTERMs, want once (the second kills)", len(stops))
	}
}
