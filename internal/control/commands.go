package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/state"
	"github.com/vllm-guard/vllm-guard/internal/status"
)

// Exit codes of the socket commands (package exitcode names them all).
const (
	ExitReady    = exitcode.OK      // status: vLLM ready; other commands: done
	ExitNotReady = exitcode.Failed  // status: a guard answers, vLLM is not ready; other commands: failed
	ExitUsage    = exitcode.Usage   // the command line is wrong
	ExitNoGuard  = exitcode.NoGuard // no guard reachable
)

// requestTimeout bounds one call to the guard: it answers from memory.
const requestTimeout = 10 * time.Second

// clearScreen moves the cursor home and clears the terminal.
const clearScreen = "\x1b[H\x1b[2J"

// commonFlags are the flags every socket command takes.
type commonFlags struct {
	socket, config, instanceFlag string
	instance                     string // checked, from --instance or $VLLM_GUARD_INSTANCE
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.socket, "socket", "", "the guard's control socket (default: [control] socket of the config, else the instance's "+config.RuntimeDir+"/NAME.sock, else "+DefaultSocket+")")
	fs.StringVar(&c.config, "config", "", "config file (default: the instance's "+config.ConfigDir+"/NAME.toml, else $VLLM_GUARD_CONFIG, ./vllm-guard.toml, /etc/vllm-guard/vllm-guard.toml)")
	fs.StringVar(&c.instanceFlag, "instance", "", "the guard instance NAME, one of several on this host (default: $VLLM_GUARD_INSTANCE)")
}

// resolveInstance checks the instance name after parsing; false means a
// usage error, already reported.
func (c *commonFlags) resolveInstance(stderr io.Writer) bool {
	name, err := config.Instance(c.instanceFlag)
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard: %v\n", err)
		return false
	}
	c.instance = name
	return true
}

// defaultSocket is the socket when neither --socket nor the config names
// one: the instance's, else /run/vllm-guard/guard.sock.
func (c *commonFlags) defaultSocket() string { return config.DefaultFor(c.instance).Control.Socket }

// loadConfig reads the config the flags point to. An explicit --config
// that fails is an error; a default location that does not exist is not
// (the commands also work without a config file), and cfg is then the
// defaults (the instance's, with one).
func (c *commonFlags) loadConfig(stderr io.Writer) (*config.Config, error) {
	path := config.ResolveFor(c.config, c.instance)
	if c.config == "" {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return config.DefaultFor(c.instance), nil
		}
	}
	cfg, err := config.LoadFor(path, c.instance)
	if err != nil {
		if c.config != "" {
			return nil, err
		}
		fmt.Fprintf(stderr, "vllm-guard: note: ignoring the config %s, it does not load (%v); using the defaults\n", path, err)
		return config.DefaultFor(c.instance), nil
	}
	return cfg, nil
}

// socketPath picks the socket: --socket, else [control] socket of the
// config when it loads, else the instance's, else the default.
func (c *commonFlags) socketPath(stderr io.Writer) string {
	if c.socket != "" {
		return c.socket
	}
	cfg, err := c.loadConfig(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard: note: %v; trying the default socket %s\n", err, c.defaultSocket())
		return c.defaultSocket()
	}
	return cmpOr(cfg.Control.Socket, c.defaultSocket())
}

// parseFlags parses args; done is true when the command should exit with
// code (help, usage error).
func parseFlags(fs *flag.FlagSet, usage string, args []string, stdout, stderr io.Writer) (code int, done bool) {
	fs.SetOutput(stderr)
	fs.Usage = func() {} // printed below, to the right stream
	printUsage := func(w io.Writer) {
		fmt.Fprint(w, usage)
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(stderr)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout)
			return ExitReady, true
		}
		printUsage(stderr)
		return ExitUsage, true
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments: %s\n", fs.Name(), strings.Join(fs.Args(), " "))
		printUsage(stderr)
		return ExitUsage, true
	}
	return 0, false
}

const statusUsage = `Usage: vllm-guard status [--instance NAME | --socket PATH | --config FILE] [--json] [--watch]
       vllm-guard status --all [--runtime-dir DIR] [--json]

Shows the state of the running guard: vLLM's state, pid and uptime, the
profile rung, GPU memory with its trend, active alerts, restarts by cause,
the last incident, and vLLM's queue and KV cache usage.
With --all: one line per guard on this host (every *.sock in the runtime
folder): instance, state, rung, GPUs used/total, last incident.
Exit status: 0 vLLM is ready (--all: every instance is), 1 not ready (--all:
any is not, or does not answer), 2 usage, 3 no guard reachable (--all: no
socket found, or none answers).

`

// StatusCommand is `vllm-guard status`; it returns the exit code.
func StatusCommand(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return statusCommand(ctx, args, stdout, stderr, time.Second)
}

// statusCommand is StatusCommand with the interruption and the redraw
// period given, for tests.
func statusCommand(ctx context.Context, args []string, stdout, stderr io.Writer, every time.Duration) int {
	fs := flag.NewFlagSet("vllm-guard status", flag.ContinueOnError)
	var cf commonFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print the status document as JSON (with --watch: one document per line)")
	watch := fs.Bool("watch", false, "redraw every second until interrupted")
	all := fs.Bool("all", false, "every guard on this host: one line per socket in the runtime folder (--runtime-dir)")
	runtimeDir := fs.String("runtime-dir", "", "with --all: where the sockets are (default: $"+RuntimeDirEnv+", else "+config.RuntimeDir+")")
	if code, done := parseFlags(fs, statusUsage, args, stdout, stderr); done {
		return code
	}
	if !cf.resolveInstance(stderr) {
		return ExitUsage
	}
	if *all {
		if *watch || cf.socket != "" || cf.config != "" || cf.instance != "" {
			fmt.Fprintln(stderr, "vllm-guard status: --all lists every instance; it takes neither --watch, --socket, --config nor an instance")
			return ExitUsage
		}
		return statusAll(ctx, cmpOr(*runtimeDir, cmpOr(os.Getenv(RuntimeDirEnv), config.RuntimeDir)), *asJSON, stdout, stderr)
	}
	path := cf.socketPath(stderr)
	c := NewClient(path)
	defer c.CloseIdleConnections()
	if !*watch {
		code, _ := drawStatus(ctx, c, *asJSON, false, stdout, stderr)
		return code
	}
	t := time.NewTicker(every)
	defer t.Stop()
	code := ExitNoGuard
	for {
		// A draw cut short by the interrupt says nothing about the guard.
		if got, interrupted := drawStatus(ctx, c, *asJSON, true, stdout, stderr); !interrupted {
			code = got
		}
		select {
		case <-ctx.Done():
			return code
		case <-t.C:
		}
	}
}

// drawStatus fetches the document and writes it once; errors go to errw,
// except in the human watch view, where they are the frame. In watch mode
// the frame is written in one piece, after a clear screen (JSON: one line
// per document, no clearing). interrupted is true when ctx ended before
// the document came: nothing was drawn.
func drawStatus(ctx context.Context, c *Client, asJSON, watch bool, stdout, errw io.Writer) (code int, interrupted bool) {
	reqCtx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var frame bytes.Buffer
	if watch && !asJSON {
		frame.WriteString(clearScreen)
	}
	d, err := c.Status(reqCtx)
	if err != nil && ctx.Err() != nil {
		return ExitNoGuard, true
	}
	if err != nil {
		if watch && !asJSON {
			fmt.Fprintf(&frame, "vllm-guard status: %v\n", err)
			stdout.Write(frame.Bytes())
		} else {
			fmt.Fprintf(errw, "vllm-guard status: %v\n", err)
		}
		// A guard that answered, even with an answer that cannot be
		// read, is not "no guard".
		if errors.Is(err, ErrNoGuard) {
			return ExitNoGuard, false
		}
		return ExitNotReady, false
	}
	if asJSON {
		enc := json.NewEncoder(&frame)
		if !watch {
			enc.SetIndent("", "  ")
		}
		if err := enc.Encode(d); err != nil {
			fmt.Fprintf(errw, "vllm-guard status: encode the status document: %v\n", err)
			return ExitNoGuard, false
		}
	} else {
		WriteStatus(&frame, d)
	}
	out := frame.Bytes()
	if asJSON {
		out = terminalSafeJSON(out)
	}
	stdout.Write(out)
	if d.Guard.State == status.StateReady {
		return ExitReady, false
	}
	return ExitNotReady, false
}

const incidentsUsage = `Usage: vllm-guard incidents [--json] [-n N] [--instance NAME | --socket PATH | --config FILE]

Lists the incident records, newest first: time, cause, rung before and
after, memory trend and the first line of evidence. Asks the running guard;
with no guard answering, reads state_dir/incidents directly.
Exit status: 0 listed, 1 the records cannot be read, 2 usage.

`

// IncidentsCommand is `vllm-guard incidents`; it returns the exit code.
func IncidentsCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("vllm-guard incidents", flag.ContinueOnError)
	var cf commonFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print the records as a JSON array")
	n := fs.Int("n", DefaultIncidents, "how many records, newest first (0: all)")
	if code, done := parseFlags(fs, incidentsUsage, args, stdout, stderr); done {
		return code
	}
	if !cf.resolveInstance(stderr) {
		return ExitUsage
	}
	if *n < 0 {
		fmt.Fprintf(stderr, "vllm-guard incidents: -n %d: give a number of records, 0 for all\n", *n)
		return ExitUsage
	}
	cfg, err := cf.loadConfig(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard incidents: %v\n", err)
		return ExitNotReady
	}
	path := cf.socket
	if path == "" {
		path = cmpOr(cfg.Control.Socket, cf.defaultSocket())
	}
	c := NewClient(path)
	defer c.CloseIdleConnections()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// One record at a time, from the guard or the folder, into the output:
	// JSON is written as each comes, the table keeps its rows' text.
	out := newIncidentsOut(stdout, *asJSON)
	err = c.EachIncident(ctx, *n, out.add)
	if errors.Is(err, ErrNoGuard) && out.count == 0 {
		fmt.Fprintf(stderr, "vllm-guard incidents: %v\n", err)
		err = eachIncidentOffline(cfg.Control.StateDir, *n, path, stderr, out.add)
	}
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard incidents: %v\n", err)
		if out.count > 0 {
			fmt.Fprintf(stderr, "vllm-guard incidents: the %d records above were read before that\n", out.count)
			out.finish()
		}
		return ExitNotReady
	}
	if err := out.finish(); err != nil {
		fmt.Fprintf(stderr, "vllm-guard incidents: %v\n", err)
		return ExitNotReady
	}
	if out.unreadable > 0 {
		fmt.Fprintf(stderr, "vllm-guard incidents: %d %s could not be read (named above as UNREADABLE)\n", out.unreadable, plural(out.unreadable, "record", "records"))
	}
	return ExitReady
}

// incidentsOut writes the records as they come: a JSON array written
// record by record, or the table (rows kept, records not).
type incidentsOut struct {
	w                 io.Writer
	json              bool
	table             state.IncidentTable
	count, unreadable int
}

func newIncidentsOut(w io.Writer, asJSON bool) *incidentsOut {
	return &incidentsOut{w: w, json: asJSON}
}

func (o *incidentsOut) add(inc state.Incident) error {
	o.count++
	if inc.Unreadable != "" {
		o.unreadable++
	}
	if !o.json {
		o.table.Add(inc)
		return nil
	}
	data, err := json.MarshalIndent(inc, "  ", "  ")
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	data = terminalSafeJSON(data)
	sep := ",\n  "
	if o.count == 1 {
		sep = "[\n  "
	}
	if _, err := io.WriteString(o.w, sep); err != nil {
		return err
	}
	_, err = o.w.Write(data)
	return err
}

func (o *incidentsOut) finish() error {
	if !o.json {
		return o.table.Write(o.w)
	}
	end := "\n]\n"
	if o.count == 0 {
		end = "[]\n"
	}
	_, err := io.WriteString(o.w, end)
	return err
}

// eachIncidentOffline reads the records from the state folder when no
// guard answers, one at a time. A missing folder means no records.
func eachIncidentOffline(dir string, n int, socket string, stderr io.Writer, each func(state.Incident) error) error {
	return withOfflineStore(dir, socket, stderr, func(store *state.Store) error { return store.EachIncident(n, each) })
}

func withOfflineStore(dir, socket string, stderr io.Writer, use func(*state.Store) error) error {
	if dir == "" {
		return fmt.Errorf("no vllm-guard answers on %s and [control] state_dir is empty: no records to read", socket)
	}
	incDir := filepath.Join(dir, "incidents")
	fmt.Fprintf(stderr, "vllm-guard incidents: reading the records in %s directly\n", incDir)
	if _, err := os.Stat(incDir); errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("read the incident records in %s: %w", incDir, err)
	}
	store, warnings, err := state.Open(dir, zap.NewNop())
	if err != nil {
		return err
	}
	defer store.Close()
	if !store.Persistent() && store.NotWritable() == "" {
		return fmt.Errorf("cannot read the incident records in %s as this user: %s; run as root or as a member of the folder's group",
			incDir, strings.Join(warnings, "; "))
	}
	if !store.RecordsReadable() {
		return fmt.Errorf("cannot read the incident records in %s: %s", incDir, strings.Join(warnings, "; "))
	}
	return use(store)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

const actionUsage = `Usage: vllm-guard %s [--instance NAME | --socket PATH | --config FILE]

%s
Exit status: 0 done, 1 the guard refused, 2 usage, 3 no guard reachable.

`

// ActionCommand is `vllm-guard restart` and `vllm-guard profile reset`;
// action is "restart" or "profile reset". It returns the exit code.
func ActionCommand(action string, args []string, stdout, stderr io.Writer) int {
	var (
		what string
		do   func(*Client, context.Context) error
		done string
	)
	switch action {
	case "restart":
		what = "Asks the running guard to restart vLLM (a clean stop, then a start on the same rung)."
		do, done = (*Client).Restart, "vLLM will be restarted"
	case "profile reset":
		what = "Asks the running guard to return to rung 0 of the profile at vLLM's next restart."
		do, done = (*Client).ResetProfile, "the profile returns to rung 0 at the next restart"
	default:
		fmt.Fprintf(stderr, "vllm-guard: unknown action %q; use restart or profile reset\n", action)
		return ExitUsage
	}
	fs := flag.NewFlagSet("vllm-guard "+action, flag.ContinueOnError)
	var cf commonFlags
	cf.register(fs)
	if code, stop := parseFlags(fs, fmt.Sprintf(actionUsage, action, what), args, stdout, stderr); stop {
		return code
	}
	if !cf.resolveInstance(stderr) {
		return ExitUsage
	}
	path := cf.socketPath(stderr)
	c := NewClient(path)
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	if err := do(c, ctx); err != nil {
		fmt.Fprintf(stderr, "vllm-guard %s: %v\n", action, err)
		if errors.Is(err, ErrNoGuard) {
			return ExitNoGuard
		}
		return ExitNotReady
	}
	fmt.Fprintf(stdout, "vllm-guard %s: %s (guard on %s)\n", action, done, path)
	return ExitReady
}
