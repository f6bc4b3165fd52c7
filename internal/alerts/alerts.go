// Package alerts owns the delivery of the guard's alerts:
// gpu_memory_warn, gpu_memory_critical, oom_predicted, oom, gave_up,
// gpu_fault and state_not_saved.
// Each goes once per episode to the log and, when configured, to the
// [alerts] command (the event as JSON on stdin, bounded in time) and the
// webhook (a JSON POST with retries). Delivery runs on its own goroutine
// behind a bounded queue: a slow or broken receiver never holds up the guard.
package alerts

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/events"
	"github.com/vllm-guard/vllm-guard/internal/gpumon"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// Alert names.
const (
	GPUMemoryWarn     = gpumon.AlertWarn
	GPUMemoryCritical = gpumon.AlertCritical
	OOMPredicted      = gpumon.AlertPredicted
	OOM               = "oom"
	GaveUp            = "gave_up"
	// GPUFault: vLLM's GPU failed (package policy's gpu_fault): which GPU,
	// what it said (the XID and its meaning) and what to do.
	GPUFault = "gpu_fault"
	// StateNotSaved: the guard's state (the rung, the counters) cannot be
	// written to state_dir (a full disk, a read-only folder): a restarted
	// guard resumes the state on disk, not the one in force. Cleared by
	// the next save that succeeds.
	StateNotSaved = "state_not_saved"
)

// Names lists every alert.
var Names = []string{GPUMemoryWarn, GPUMemoryCritical, OOMPredicted, OOM, GaveUp, GPUFault, StateNotSaved}

// Severities.
const (
	Warning  = "warning"
	Critical = "critical"
)

// SeverityOf is an alert's default severity: the two that forecast trouble
// warn; those that say it has come (or will within seconds) are critical.
func SeverityOf(alert string) string {
	switch alert {
	case GPUMemoryCritical, OOM, GaveUp, GPUFault:
		return Critical
	default:
		return Warning
	}
}

// oneShot alerts are events, not episodes: each occurrence is delivered and
// none stays active.
func oneShot(alert string) bool { return alert == OOM || alert == GaveUp || alert == GPUFault }

// Event is one alert raised or cleared; its JSON is what the command reads
// on stdin and the webhook receives.
type Event struct {
	Alert             string         `json:"alert"`  // one of Names
	Active            bool           `json:"active"` // raised (true) or cleared (false); oom and gave_up are always raised
	Severity          string         `json:"severity"`
	Time              time.Time      `json:"time"`
	Message           string         `json:"message"`
	Host              string         `json:"host"`
	GPU               int            `json:"gpu"` // -1 when not about one GPU
	Fraction          float64        `json:"fraction"`
	SecondsToCritical float64        `json:"seconds_to_critical"` // -1 when memory is not climbing
	Cause             string         `json:"cause"`               // oom, gave_up: the classified cause
	Rung              policy.Rung    `json:"rung"`                // the profile in force when it happened
	Details           map[string]any `json:"details,omitempty"`
}

// Defaults of delivery (bounded, never blocking the guard).
const (
	CommandTimeout = 10 * time.Second
	WebhookTimeout = 5 * time.Second // per try
	WebhookTries   = 3
	QueueSize      = 64
	tailBytes      = 2048
)

type key struct {
	alert string
	gpu   int
}

// Dispatcher logs alert events, keeps the active episodes, and delivers
// events to the command and the webhook from Run.
type Dispatcher struct {
	log     *zap.Logger
	targets atomic.Pointer[targets] // where alerts go; replaced on a config reload
	host    string
	queue   chan Event
	client  *http.Client
	tr      *http.Transport

	// Limits; tests shorten them.
	commandTimeout time.Duration
	webhookTimeout time.Duration
	webhookTries   int
	retryInitial   time.Duration

	publish func(events.Event) // the guard's event stream; nil: none

	mu       sync.Mutex
	active   map[key]Event
	inForce  map[key]Event // active episodes, plus oom until vLLM is ready again and gave_up
	dropped  uint64
	dropping bool // inside a burst of drops (logged at its start and end)
	burst    uint64
	pending  int // queued or being delivered
	idle     []chan struct{}
}

// New makes a Dispatcher for the [alerts] section. A webhook that is not an
// http(s) URL is logged and ignored (the config check rejects it first).
func New(cfg config.Alerts, log *zap.Logger) *Dispatcher {
	if log == nil {
		log = zap.NewNop()
	}
	host, _ := os.Hostname()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true // alerts are rare; no idle connections to leak
	d := &Dispatcher{
		log: log, host: host,
		queue: make(chan Event, QueueSize), tr: tr, client: &http.Client{Transport: tr, CheckRedirect: refuseRedirect},
		commandTimeout: CommandTimeout, webhookTimeout: WebhookTimeout,
		webhookTries: WebhookTries, retryInitial: time.Second,
		active: map[key]Event{}, inForce: map[key]Event{},
	}
	d.Configure(cfg)
	return d
}

// targets are the [alerts] command and webhook in force.
type targets struct {
	command []string
	webhook string // "" when none or invalid
}

// Configure sets where alerts go (at New, and on a config reload: the
// alerts delivered next use it).
func (d *Dispatcher) Configure(cfg config.Alerts) {
	t := &targets{command: slices.Clone(cfg.Command)}
	if cfg.Webhook != "" {
		u, err := url.Parse(cfg.Webhook)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			d.log.Error("[alerts] webhook is not an http(s) URL; alerts will not be posted (fix it in the config)",
				zap.String("webhook", redactURL(cfg.Webhook)))
		} else {
			t.webhook = cfg.Webhook
		}
	}
	d.targets.Store(t)
}

// Send records and logs e, and queues it for delivery. It never blocks: when
// the queue is full the event is dropped, counted and logged. A raise of an
// alert already active (same alert, same GPU) and a clear of one not active
// are ignored: each episode is told once.
func (d *Dispatcher) Send(e Event) {
	e = d.complete(e)
	d.mu.Lock()
	k := key{e.Alert, e.GPU}
	if !oneShot(e.Alert) {
		_, was := d.active[k]
		if e.Active == was {
			d.mu.Unlock()
			return
		}
		if e.Active {
			d.active[k] = e
		} else {
			delete(d.active, k)
		}
	}
	if e.Active {
		d.inForce[k] = e
	} else {
		delete(d.inForce, k)
	}
	d.mu.Unlock()
	d.announce(e)

	d.logEvent(e)
	if t := d.targets.Load(); len(t.command) == 0 && t.webhook == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case d.queue <- e:
		d.pending++
		if d.dropping {
			d.dropping = false
			d.log.Warn("alert queue has room again", zap.Uint64("dropped_in_burst", d.burst), zap.Uint64("dropped_total", d.dropped))
		}
	default:
		d.dropped++
		d.burst++
		if !d.dropping {
			d.dropping, d.burst = true, 1
			d.log.Error("alert queue full: alert logged but not delivered to the command or webhook (are they slow or hanging?)",
				zap.String("alert", e.Alert), zap.Int("queue_size", cap(d.queue)))
		}
	}
}

// Publish makes the dispatcher announce every alert raised and cleared on
// the guard's event stream (metrics and the tools read it there). Set it
// before the first Send.
func (d *Dispatcher) Publish(publish func(events.Event)) { d.publish = publish }

func (d *Dispatcher) announce(e Event) {
	if d.publish == nil {
		return
	}
	d.publish(events.Event{Kind: events.KindAlert, Time: e.Time,
		Alert: &events.Alert{Name: e.Alert, Active: e.Active, Severity: e.Severity, Message: e.Message, GPU: e.GPU}})
}

// Clear ends an alert that is in force without being an episode of its own
// (oom, once vLLM is ready again). Nothing is delivered: the raise was.
func (d *Dispatcher) Clear(alert string) {
	d.mu.Lock()
	var cleared []Event
	for k, e := range d.inForce {
		if k.alert == alert {
			delete(d.inForce, k)
			e.Active, e.Time = false, time.Now()
			cleared = append(cleared, e)
		}
	}
	d.mu.Unlock()
	for _, e := range cleared {
		d.announce(e)
	}
}

// InForce lists the alerts in force, oldest first: the active memory
// episodes, oom from a death by GPU out of memory until vLLM is ready again,
// and gave_up once the guard gave up. This is the one place alert state lives.
func (d *Dispatcher) InForce() []Event {
	d.mu.Lock()
	out := make([]Event, 0, len(d.inForce))
	for _, e := range d.inForce {
		out = append(out, e)
	}
	d.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Event) int {
		return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.Alert, b.Alert), cmp.Compare(a.GPU, b.GPU))
	})
	return out
}

// complete fills what the caller may leave out and makes the numbers
// JSON-safe (NaN and ±Inf cannot be encoded).
func (d *Dispatcher) complete(e Event) Event {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if e.Host == "" {
		e.Host = d.host
	}
	if e.Severity == "" {
		e.Severity = SeverityOf(e.Alert)
	}
	if oneShot(e.Alert) {
		e.Active = true
	}
	if math.IsNaN(e.Fraction) || math.IsInf(e.Fraction, 0) {
		e.Fraction = 0
	}
	if math.IsNaN(e.SecondsToCritical) || math.IsInf(e.SecondsToCritical, 0) || e.SecondsToCritical < 0 {
		e.SecondsToCritical = -1
	}
	return e
}

func (d *Dispatcher) logEvent(e Event) {
	fields := []zap.Field{zap.String("alert", e.Alert), zap.Bool("active", e.Active), zap.String("severity", e.Severity),
		zap.String("message", e.Message)}
	if e.GPU >= 0 {
		fields = append(fields, zap.Int("gpu", e.GPU), zap.Float64("fraction", e.Fraction))
	}
	if e.SecondsToCritical >= 0 {
		fields = append(fields, zap.Float64("seconds_to_critical", e.SecondsToCritical))
	}
	if e.Cause != "" {
		fields = append(fields, zap.String("cause", e.Cause))
	}
	fields = append(fields, zap.Int("rung", e.Rung.Index))
	switch {
	case !e.Active:
		d.log.Info("alert cleared", fields...)
	case e.Severity == Critical:
		d.log.Error("alert", fields...)
	default:
		d.log.Warn("alert", fields...)
	}
}

// Active returns the episodes raised and not cleared, by alert then GPU.
// oom and gave_up are events and never appear here.
func (d *Dispatcher) Active() []Event {
	d.mu.Lock()
	out := make([]Event, 0, len(d.active))
	for _, e := range d.active {
		out = append(out, e)
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b Event) int {
		return cmp.Or(cmp.Compare(slices.Index(Names, a.Alert), slices.Index(Names, b.Alert)), cmp.Compare(a.Alert, b.Alert), cmp.Compare(a.GPU, b.GPU))
	})
	return out
}

// Dropped counts events that found the queue full.
func (d *Dispatcher) Dropped() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dropped
}

// Run delivers queued events until ctx ends; cancelling ctx also stops a
// delivery in progress (the command is killed). Call Flush first to let
// the last events (gave_up before the guard exits) go out.
func (d *Dispatcher) Run(ctx context.Context) {
	defer d.tr.CloseIdleConnections()
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-d.queue:
			d.deliver(ctx, e)
			d.mu.Lock()
			d.pending--
			if d.pending == 0 {
				for _, ch := range d.idle {
					close(ch)
				}
				d.idle = nil
			}
			d.mu.Unlock()
		}
	}
}

// Flush waits until every queued event has been delivered (or has failed
// for good), or ctx ends. Run must be running.
func (d *Dispatcher) Flush(ctx context.Context) error {
	d.mu.Lock()
	if d.pending == 0 {
		d.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	d.idle = append(d.idle, ch)
	d.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// deliver runs the command and the webhook side by side: a hanging command
// does not delay the webhook.
func (d *Dispatcher) deliver(ctx context.Context, e Event) {
	body, err := json.Marshal(e)
	if err != nil { // only Details can fail to encode
		d.log.Warn("alert details cannot be encoded as JSON; delivering without them", zap.String("alert", e.Alert), zap.Error(err))
		e.Details = nil
		if body, err = json.Marshal(e); err != nil {
			d.log.Error("alert cannot be encoded as JSON; not delivered", zap.String("alert", e.Alert), zap.Error(err))
			return
		}
	}
	body = append(body, '\n')
	var wg sync.WaitGroup
	t := d.targets.Load()
	if len(t.command) > 0 {
		wg.Go(func() { d.runCommand(ctx, e, body, t.command) })
	}
	if t.webhook != "" {
		wg.Go(func() { d.postWebhook(ctx, e, body, t.webhook) })
	}
	wg.Wait()
}

// tail keeps the last n bytes written to it.
type tail struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.n {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.n:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}
