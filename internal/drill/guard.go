package drill

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/control"
)

// statusSource is where the drill reads the guard's status; the control
// socket in production, a script in tests.
type statusSource interface {
	Status(ctx context.Context) (control.Doc, error)
}

func newSocketStatus(path string) statusSource { return control.NewClient(path) }

// memoryAlerts warn before an OOM; the others (oom, gave_up) report one.
var memoryAlerts = map[string]bool{"gpu_memory_warn": true, "gpu_memory_critical": true, "oom_predicted": true}

// sample is what the drill keeps of one status document.
type sample struct {
	at          time.Time
	state       string
	ooms        int       // restarts by cause oom
	failTime    time.Time // the last failure's time, when its cause is oom
	alerts      []control.ActiveAlert
	gpuFraction float64 // the fullest device
}

func sampleOf(at time.Time, d control.Doc) sample {
	s := sample{at: at, state: string(d.Guard.State), ooms: d.Guard.Restarts[cause.CauseOOM]}
	if f := d.Guard.LastFailure; f != nil && f.Verdict.Cause == cause.CauseOOM {
		s.failTime = f.Time
	}
	s.alerts = append(s.alerts, d.Alerts...)
	for _, a := range d.GPU.Active {
		s.alerts = append(s.alerts, control.ActiveAlert{Name: a.Name, Since: a.At, Message: a.Message})
	}
	for _, dev := range d.GPU.Devices {
		s.gpuFraction = max(s.gpuFraction, dev.Fraction)
	}
	return s
}

// guardWatch samples the guard's status every interval.
type guardWatch struct {
	src      statusSource
	interval time.Duration

	mu      sync.Mutex
	samples []sample
	errors  int
	lastErr string
}

func newGuardWatch(src statusSource, interval time.Duration) *guardWatch {
	return &guardWatch{src: src, interval: interval}
}

func (g *guardWatch) run(ctx context.Context) {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		g.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (g *guardWatch) sample(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, max(g.interval, time.Second))
	defer cancel()
	d, err := g.src.Status(sctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			g.errors++
			g.lastErr = err.Error()
		}
		return
	}
	g.samples = append(g.samples, sampleOf(time.Now(), d))
}

// GuardReport is the guard's side of a drill.
type GuardReport struct {
	Samples         int         `json:"samples"`
	SampleErrors    int         `json:"sample_errors"`
	LastSampleError string      `json:"last_sample_error,omitempty"`
	PeakGPUFraction float64     `json:"peak_gpu_fraction"`
	States          []string    `json:"states"` // the guard's states in the order seen, repeats folded
	Alerts          []AlertSeen `json:"alerts"`
	OOMs            []OOM       `json:"ooms"`
}

// AlertSeen is one alert episode the drill saw.
type AlertSeen struct {
	Name      string    `json:"name"`
	Since     time.Time `json:"since"`
	FirstSeen time.Time `json:"first_seen"`
	// LeadSeconds is how long before the next OOM it was raised; absent
	// when no OOM followed.
	LeadSeconds *float64 `json:"lead_seconds,omitempty"`
}

// OOM is one out-of-memory death of vLLM during the drill.
type OOM struct {
	Time time.Time `json:"time"`
	// Alert is the first memory alert of its episode (raised after the
	// previous OOM and before this one); "" when none warned.
	Alert       string   `json:"alert,omitempty"`
	LeadSeconds *float64 `json:"lead_seconds,omitempty"`
}

// analyze turns samples into the guard's report. The first sample is the
// baseline: OOMs before the drill are not counted.
func analyze(samples []sample, errs int, lastErr string) *GuardReport {
	r := &GuardReport{Samples: len(samples), SampleErrors: errs, LastSampleError: lastErr, States: []string{}, Alerts: []AlertSeen{}, OOMs: []OOM{}}
	if len(samples) == 0 {
		return r
	}
	type key struct {
		name  string
		since time.Time
	}
	seenAlert := map[key]int{} // index into r.Alerts
	seenFail := map[time.Time]bool{samples[0].failTime: true}
	prev := samples[0].ooms
	for i, s := range samples {
		r.PeakGPUFraction = max(r.PeakGPUFraction, s.gpuFraction)
		if n := len(r.States); n == 0 || r.States[n-1] != s.state {
			r.States = append(r.States, s.state)
		}
		for _, a := range s.alerts {
			k := key{a.Name, a.Since}
			if _, ok := seenAlert[k]; !ok {
				seenAlert[k] = len(r.Alerts)
				r.Alerts = append(r.Alerts, AlertSeen{Name: a.Name, Since: a.Since, FirstSeen: s.at})
			}
		}
		if i == 0 {
			continue
		}
		n := s.ooms - prev
		if s.ooms < prev {
			n = 0 // the guard itself restarted: its counters started over
		}
		prev = s.ooms
		if !s.failTime.IsZero() && !seenFail[s.failTime] {
			seenFail[s.failTime] = true
			r.OOMs = append(r.OOMs, OOM{Time: s.failTime})
			n--
		}
		for ; n > 0; n-- {
			r.OOMs = append(r.OOMs, OOM{Time: s.at})
		}
	}
	sort.SliceStable(r.OOMs, func(i, j int) bool { return r.OOMs[i].Time.Before(r.OOMs[j].Time) })
	sort.SliceStable(r.Alerts, func(i, j int) bool { return r.Alerts[i].Since.Before(r.Alerts[j].Since) })

	// Each OOM's warning: the earliest memory alert raised after the
	// previous OOM and not after this one.
	var after time.Time
	for i := range r.OOMs {
		o := &r.OOMs[i]
		for _, a := range r.Alerts {
			if memoryAlerts[a.Name] && a.Since.After(after) && !a.Since.After(o.Time) {
				lead := o.Time.Sub(a.Since).Seconds()
				o.Alert, o.LeadSeconds = a.Name, &lead
				break
			}
		}
		after = o.Time
	}
	// Each alert's lead before the next OOM.
	for i := range r.Alerts {
		a := &r.Alerts[i]
		if !memoryAlerts[a.Name] {
			continue
		}
		for _, o := range r.OOMs {
			if !a.Since.After(o.Time) {
				lead := o.Time.Sub(a.Since).Seconds()
				a.LeadSeconds = &lead
				break
			}
		}
	}
	return r
}

func (g *guardWatch) report() *GuardReport {
	g.mu.Lock()
	defer g.mu.Unlock()
	return analyze(g.samples, g.errors, g.lastErr)
}
