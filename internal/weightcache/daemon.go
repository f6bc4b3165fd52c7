package weightcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/freeport"
	"github.com/vllm-guard/vllm-guard/internal/proctree"
)

// Options are what the daemon is run with.
type Options struct {
	Argv []string // PreloadArgv
	// HealthPort is its /health port on 127.0.0.1; 0: a free one at each start.
	HealthPort int
	Keeper     []string // the keeper's argv prefix: [exe, proctree.KeeperArg]
	Env        []string // its whole environment (vLLM's)
	Dir        string
	// StopTimeout is how long its stop may take before its tree is killed
	// (and how long the keeper leaves the tree after the launcher's exit).
	StopTimeout time.Duration
	Log         *zap.Logger
	// OnDeath hears that a daemon that was ready died (why), on the
	// daemon's own goroutine: vLLM must start again with the next one.
	OnDeath func(why string)
}

// Timing of the watch: how often /health is asked while the daemon starts
// and once it serves, how many answers in a row other than 200 mean it
// lost a rank, the first wait between failed starts (doubling).
const (
	startPoll    = 100 * time.Millisecond
	servePoll    = time.Second
	healthMisses = 2
	retryFirst   = time.Second
	// startTries: the starts one launch of vLLM waits for; after as many
	// failures vLLM starts without the daemon (it reads the disk, vLLM's
	// fallback) and the next launch tries the daemon again.
	startTries = 3
)

// errStopped: the guard stopped the daemon; it starts no more.
var errStopped = errors.New("the weight cache daemon was stopped with the guard")

// Daemon is the weight cache daemon's life: at most one running at a time.
type Daemon struct {
	opts   Options
	client *http.Client

	mu       sync.Mutex
	cur      *run
	stopped  bool
	starts   int
	lastExit string
}

// run is one start of the daemon, from its launch to its tree's end.
type run struct {
	// treeMu: the tree's record of what it has seen is written by a
	// re-read (Refresh) and read by its signals (Stop, KillLeftovers):
	// one at a time (internal/proctree).
	treeMu  sync.Mutex
	child   *proctree.Child
	port    int
	started time.Time
	out     *lineLog
	readyC  chan struct{} // closed once its /health answered 200
	doneC   chan struct{} // closed once its tree is gone
	why     string        // how it ended (valid after doneC)
}

// New makes the daemon's keeper; it starts nothing.
func New(opts Options) *Daemon {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.OnDeath == nil {
		opts.OnDeath = func(string) {}
	}
	return &Daemon{opts: opts, client: &http.Client{Timeout: 2 * time.Second}}
}

// Ready starts the daemon if none is running and returns once it serves
// (its /health answers 200), or when ctx ends. A daemon that exits before
// it serves is started again, 1 s later, then 2 s, each failure logged
// with its last lines; after startTries failures Ready gives up for this
// launch (an error that says so): vLLM starts without the daemon and reads
// the disk, rather than not serving at all.
func (d *Daemon) Ready(ctx context.Context) error {
	delay := retryFirst
	waiting := false
	for try := 1; ; try++ {
		r, err := d.running()
		if err != nil {
			return err
		}
		if !waiting && !isClosed(r.readyC) {
			waiting = true
			d.opts.Log.Info("waiting for the weight cache daemon to serve before starting vLLM", zap.Int("health_port", r.port))
		}
		select {
		case <-r.readyC:
			if !isClosed(r.doneC) {
				return nil
			}
			continue // it died since: start the next one
		case <-r.doneC:
		case <-ctx.Done():
			return ctx.Err()
		}
		if try >= startTries {
			d.opts.Log.Error("the weight cache daemon does not start: vLLM starts without it and reads its weights from the disk; the next start of vLLM tries the daemon again",
				zap.String("exit", r.why), zap.Int("tries", try), zap.Strings("last_lines", r.out.last()))
			return fmt.Errorf("the weight cache daemon exited %d times before it served (last: %s)", try, r.why)
		}
		d.opts.Log.Error("the weight cache daemon exited before it served: starting it again",
			zap.String("exit", r.why), zap.Duration("in", delay), zap.Strings("last_lines", r.out.last()))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
		delay *= 2
	}
}

// running is the daemon that runs now, started if there is none.
func (d *Daemon) running() (*run, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return nil, errStopped
	}
	if d.cur != nil && !isClosed(d.cur.doneC) {
		return d.cur, nil
	}
	r, err := d.start()
	if err != nil {
		return nil, err
	}
	d.cur = r
	d.starts++
	go d.watch(r)
	return r, nil
}

// start launches the daemon under its own keeper (mu held).
func (d *Daemon) start() (*run, error) {
	port := d.opts.HealthPort
	if port == 0 {
		p, err := freeport.Pick()
		if err != nil {
			return nil, fmt.Errorf("no free port for the weight cache daemon's /health: %w", err)
		}
		port = p
	}
	argv := append(append([]string(nil), d.opts.Argv...),
		"--weight-cache-health-port", strconv.Itoa(port), "--weight-cache-health-host", "127.0.0.1")
	out := newLineLog(d.opts.Log.Named("daemon"))
	c, err := proctree.Start(proctree.Spec{Keeper: d.opts.Keeper, Argv: argv, Env: d.opts.Env, Dir: d.opts.Dir,
		Grace: d.opts.StopTimeout, Stdout: out, Stderr: out})
	if err != nil {
		return nil, fmt.Errorf("start the weight cache daemon: %w", err)
	}
	c.Refresh()
	d.opts.Log.Info("weight cache daemon started", zap.Int("pid", c.PID()), zap.Strings("argv", argv))
	return &run{child: c, port: port, started: time.Now(), out: out, readyC: make(chan struct{}), doneC: make(chan struct{})}, nil
}

// watch follows one start of the daemon: ready on its /health, dead when
// its tree is gone or its /health stops answering 200 (a rank died while
// the launcher waits for the others); then what outlived its keeper is
// killed and, if it had served and the guard did not stop it, OnDeath.
func (d *Daemon) watch(r *run) {
	misses := 0
	tick := time.NewTicker(startPoll)
	defer tick.Stop()
	for dead := false; !dead; {
		select {
		case <-r.child.Done():
			dead = true
			continue
		case <-tick.C:
		}
		r.refresh()
		ok := d.healthy(r.port)
		switch {
		case ok && !isClosed(r.readyC):
			d.opts.Log.Info("weight cache daemon serving", zap.Int("pid", r.child.PID()), zap.Duration("after", time.Since(r.started).Round(time.Millisecond)))
			close(r.readyC)
			tick.Reset(servePoll)
		case ok:
			misses = 0
		case isClosed(r.readyC):
			if misses++; misses >= healthMisses {
				d.opts.Log.Warn("the weight cache daemon's /health no longer answers 200: killing it", zap.Int("pid", r.child.PID()))
				r.child.Kill()
				dead = true
			}
		}
	}
	<-r.child.Done()
	r.treeMu.Lock()
	r.child.KillLeftovers()
	r.treeMu.Unlock()
	r.why = r.child.Exit().String()
	if misses >= healthMisses {
		r.why = "its /health stopped answering 200 (a rank died); " + r.why
	}
	d.mu.Lock()
	stopped := d.stopped
	d.lastExit = r.why
	d.mu.Unlock()
	close(r.doneC)
	if isClosed(r.readyC) && !stopped {
		d.opts.Log.Error("the weight cache daemon died", zap.String("exit", r.why), zap.Strings("last_lines", r.out.last()))
		d.opts.OnDeath(r.why)
	}
}

// refresh re-reads the run's tree (its record of every process seen).
func (r *run) refresh() {
	r.treeMu.Lock()
	defer r.treeMu.Unlock()
	r.child.Refresh()
}

// healthy asks the daemon's /health once.
func (d *Daemon) healthy(port int) bool {
	resp, err := d.client.Get("http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// PIDs is the running daemon's process tree (the keeper, the launcher,
// one daemon per rank): the guard's own holders of GPU memory, never an
// orphan's nor another tenant's. Safe from any goroutine.
func (d *Daemon) PIDs() []int {
	d.mu.Lock()
	r := d.cur
	d.mu.Unlock()
	if r == nil || isClosed(r.doneC) {
		return nil
	}
	return r.child.Tree()
}

// Stop stops the daemon for good: SIGTERM to the launcher (it terminates
// its daemons), its tree killed after StopTimeout; it returns once the
// tree is gone. The guard calls it after vLLM has stopped.
func (d *Daemon) Stop() {
	d.mu.Lock()
	d.stopped = true
	r := d.cur
	d.mu.Unlock()
	if r == nil {
		return
	}
	r.treeMu.Lock()
	r.child.Stop()
	r.treeMu.Unlock()
	t := time.NewTimer(d.opts.StopTimeout)
	defer t.Stop()
	select {
	case <-r.doneC:
	case <-t.C:
		d.opts.Log.Warn("the weight cache daemon did not stop within the stop timeout: killing its process tree", zap.Duration("stop_timeout", d.opts.StopTimeout))
		r.child.Kill()
		<-r.doneC
	}
	d.opts.Log.Info("weight cache daemon stopped", zap.String("exit", r.why))
}

// Status is the daemon as `vllm-guard status` shows it.
type Status struct {
	State      string    `json:"state"` // starting | serving | stopped | exited
	PID        int       `json:"pid,omitempty"`
	PIDs       []int     `json:"pids,omitempty"` // its process tree: the guard's own holders of GPU memory
	HealthPort int       `json:"health_port,omitempty"`
	Since      time.Time `json:"since,omitzero"`
	Starts     int       `json:"starts"`
	LastExit   string    `json:"last_exit,omitempty"`
}

// Status says what the daemon is doing now.
func (d *Daemon) Status() Status {
	d.mu.Lock()
	r, st := d.cur, Status{Starts: d.starts, LastExit: d.lastExit}
	stopped := d.stopped
	d.mu.Unlock()
	switch {
	case r == nil:
		st.State = "not started"
		return st
	case isClosed(r.doneC) && stopped:
		st.State = "stopped"
	case isClosed(r.doneC):
		st.State = "exited"
	case isClosed(r.readyC):
		st.State = "serving"
	default:
		st.State = "starting"
	}
	if !isClosed(r.doneC) {
		st.PID, st.PIDs = r.child.PID(), r.child.Tree()
	}
	st.HealthPort, st.Since = r.port, r.started
	return st
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// lineLog logs the daemon's output line by line (tqdm's carriage returns
// taken as line ends) and keeps the last few lines for the reports.
type lineLog struct {
	log  *zap.Logger
	mu   sync.Mutex
	part []byte
	tail []string
}

const keptLines = 20

func newLineLog(log *zap.Logger) *lineLog { return &lineLog{log: log} }

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.part = append(l.part, p...)
	for {
		i := strings.IndexAny(string(l.part), "\r\n")
		if i < 0 {
			break
		}
		line := strings.TrimSpace(string(l.part[:i]))
		l.part = l.part[i+1:]
		if line == "" {
			continue
		}
		l.log.Info(line)
		if l.tail = append(l.tail, line); len(l.tail) > keptLines {
			l.tail = l.tail[1:]
		}
	}
	if len(l.part) > 64<<10 { // a line without an end: cut it
		l.part = l.part[:0]
	}
	return len(p), nil
}

func (l *lineLog) last() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.tail...)
}
