package guard

import (
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/metrics"
	"github.com/vllm-guard/vllm-guard/internal/notify"
	"github.com/vllm-guard/vllm-guard/internal/starttimes"
	"github.com/vllm-guard/vllm-guard/internal/state"
)

// What the wait for vLLM shows (issue 42 item 5): the record of this
// host's starts, read from the state folder, for the time to ready
// expected of each start; the load's series; STATUS= at each step of the
// load.

// startTimes reads the record of this host's earlier starts
// (state_dir/starts.json); an unreadable one is moved aside and said.
func startTimes(store *state.Store, log *zap.Logger) *starttimes.Book {
	h, warning := store.LoadStarts()
	if warning != "" {
		log.Warn(warning)
	}
	return starttimes.NewBook(h)
}

// registerLoadSeries adds the load's progress and the expected time to
// ready to /metrics, read from the supervisor's status at each scrape.
func (g *Guard) registerLoadSeries() {
	g.met.Registry().MustRegister(metrics.LoadCollector{Status: g.pair.Status})
}

// statusLine is STATUS= for st now: while vLLM starts, with the load's
// progress and the time to ready expected.
func (g *Guard) statusLine() string {
	return notify.StatusLineAt(g.pair.Status(), g.gpu.Snapshot(), time.Now())
}
