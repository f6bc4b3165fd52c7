// Package drill owns `vllm-guard drill`: an OpenAI-compatible
// load generator that sends a long-context burst at vLLM (directly or
// through the guard's proxy), samples the guard's status every second over
// its control socket, and reports requests by outcome, latency and time to
// first token, peak GPU memory, every alert with its lead time before an
// OOM, the OOMs, whether admission control engaged, and a verdict.
package drill

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
)

// Options is one drill.
type Options struct {
	URL          string        // vLLM's or the proxy's base URL: http://host:port
	Model        string        // the served model name
	Concurrency  int           // workers, each with one request at a time
	PromptTokens int           // prompt length in tokens (≈4 characters each)
	MaxTokens    int           // max_tokens of each request
	Duration     time.Duration // workers start new requests until this has passed
	Ramp         time.Duration // workers start evenly spread over this
	Chat         bool          // /v1/chat/completions instead of /v1/completions
	Stream       bool          // "stream": true
	Socket       string        // the guard's control socket; "" = plain vLLM, no guard side
	Timeout      time.Duration // one request's limit
	Interval     time.Duration // guard status sampling period (1 s)
	// APIKey is sent as "Authorization: Bearer <key>" when set (vLLM's
	// --api-key); it is never printed.
	APIKey string `json:"-"`
}

const usage = `usage: vllm-guard drill --url URL --model NAME [--concurrency N] [--prompt-tokens T]
       [--max-tokens M] [--duration D] [--ramp D] [--chat] [--stream]
       [--socket PATH | --instance NAME] [--timeout D] [--json FILE] [--api-key-file FILE]

Sends an OpenAI-compatible long-context burst at URL (vLLM, or the guard's
proxy), samples the guard's status every second over --socket (--instance
NAME: /run/vllm-guard/NAME.sock), prints a
report and a verdict: PASS when no OOM happened or every OOM was preceded by
an alert (without --socket: when no request failed with a 5xx, a connection
error or a cut stream). Exit 0 on PASS, 1 on FAIL, 2 on a usage error.
When vLLM needs an API key, the drill sends $VLLM_API_KEY, or the first line
of --api-key-file, as a Bearer token (never on the command line, where ps
would show it).
`

// Command implements `vllm-guard drill`.
func Command(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return command(ctx, args, stdout, stderr)
}

func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, jsonPath, code, ok := parseArgs(args, stdout, stderr)
	if !ok {
		return code
	}
	rep, err := Run(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard drill: %v\n", err)
		return 1
	}
	WriteTable(stdout, rep)
	if jsonPath != "" {
		if err := writeJSON(jsonPath, rep); err != nil {
			fmt.Fprintf(stderr, "vllm-guard drill: %v\n", err)
			return 1
		}
	}
	if rep.Verdict != VerdictPass {
		return 1
	}
	return 0
}

func parseArgs(args []string, stdout, stderr io.Writer) (o Options, jsonPath string, code int, ok bool) {
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.URL, "url", "", "base URL of vLLM or of the guard's proxy (http://host:port)")
	fs.StringVar(&o.Model, "model", "", "served model name")
	fs.IntVar(&o.Concurrency, "concurrency", 16, "concurrent requests")
	fs.IntVar(&o.PromptTokens, "prompt-tokens", 2000, "prompt length in tokens (≈4 characters each)")
	fs.IntVar(&o.MaxTokens, "max-tokens", 64, "max_tokens of each request")
	fs.DurationVar(&o.Duration, "duration", 60*time.Second, "how long to keep sending")
	fs.DurationVar(&o.Ramp, "ramp", 0, "spread the workers' start over this long")
	fs.BoolVar(&o.Chat, "chat", false, "use /v1/chat/completions")
	fs.BoolVar(&o.Stream, "stream", false, "stream the answers (SSE)")
	fs.StringVar(&o.Socket, "socket", "", "the guard's control socket (without it: plain vLLM, no guard side)")
	instance := fs.String("instance", "", "the guard instance NAME whose socket to sample: "+config.RuntimeDir+"/NAME.sock")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "one request's time limit")
	fs.StringVar(&jsonPath, "json", "", "also write the report as JSON to this file")
	keyFile := fs.String("api-key-file", "", "a file whose first line is vLLM's API key (default: $VLLM_API_KEY)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return o, "", 0, false
		}
		fmt.Fprintf(stderr, "vllm-guard drill: %v\n%s", err, usage)
		return o, "", 2, false
	}
	if *instance != "" {
		// Only the flag: $VLLM_GUARD_INSTANCE does not turn a plain-vLLM
		// drill into a guarded one behind the operator's back.
		name, err := config.Instance(*instance)
		if err == nil && o.Socket != "" {
			err = fmt.Errorf("give --socket or --instance, not both")
		}
		if err != nil {
			fmt.Fprintf(stderr, "vllm-guard drill: %v\n%s", err, usage)
			return o, "", 2, false
		}
		o.Socket = config.InstanceSocket(name)
	}
	o.Interval = time.Second
	o.APIKey = os.Getenv("VLLM_API_KEY")
	if *keyFile != "" {
		raw, err := os.ReadFile(*keyFile)
		if err != nil {
			fmt.Fprintf(stderr, "vllm-guard drill: --api-key-file: %v\n", err)
			return o, "", 2, false
		}
		o.APIKey = strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0])
	}
	if err := o.validate(); err != nil || fs.NArg() > 0 {
		if err == nil {
			err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
		}
		fmt.Fprintf(stderr, "vllm-guard drill: %v\n%s", err, usage)
		return o, "", 2, false
	}
	return o, jsonPath, 0, true
}

func (o *Options) validate() error {
	var errs []string
	if o.URL == "" {
		errs = append(errs, "--url is required (vLLM's or the proxy's base URL, such as http://127.0.0.1:8000)")
	} else if u, err := url.Parse(o.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Sprintf("--url %q is not a base URL such as http://127.0.0.1:8000", o.URL))
	}
	if o.Model == "" {
		errs = append(errs, "--model is required (the served model name, as /v1/models lists it)")
	}
	if o.Concurrency < 1 {
		errs = append(errs, fmt.Sprintf("--concurrency %d: want at least 1", o.Concurrency))
	}
	if o.PromptTokens < 1 || o.MaxTokens < 1 {
		errs = append(errs, "--prompt-tokens and --max-tokens must be at least 1")
	}
	if o.Duration <= 0 || o.Ramp < 0 || o.Timeout <= 0 {
		errs = append(errs, "--duration and --timeout must be positive, --ramp not negative")
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// Run runs a drill and returns its report. The error is for a drill that
// could not run at all; failures of vLLM are in the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	var g *guardWatch
	if o.Socket != "" {
		g = newGuardWatch(newSocketStatus(o.Socket), o.Interval)
	}
	start := time.Now()
	var sampled chan struct{}
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	if g != nil {
		sampled = make(chan struct{})
		go func() { defer close(sampled); g.run(sctx) }()
	}
	results := runLoad(ctx, o)
	end := time.Now()
	if g != nil {
		stopSampling()
		<-sampled
		// One more look: an OOM at the very end shows up in the next status.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		g.sample(fctx)
		cancel()
		if c, ok := g.src.(interface{ CloseIdleConnections() }); ok {
			c.CloseIdleConnections()
		}
	}
	return buildReport(o, start, end, results, g), nil
}

func writeJSON(path string, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write the JSON report: %w; check --json's folder exists and is writable", err)
	}
	return nil
}
