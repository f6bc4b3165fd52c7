package config

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func writeTemp(t testing.TB, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "vllm-guard.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default() does not validate: %v", err)
	}
}

// The repository's example must load, equal Default() and write every key.
func TestRepoExample(t *testing.T) {
	path := filepath.Join("..", "..", "vllm-guard.toml")
	cfg, err := Load(path)
	if err != nil {
		t.Fatalf("repository vllm-guard.toml does not load: %v", err)
	}
	want := Default()
	want.Path = path
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("vllm-guard.toml differs from Default():\n got %+v\nwant %+v", cfg, want)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pos := scanPositions(string(data))
	for _, p := range schemaPaths() {
		if !pos.has(p) {
			t.Errorf("vllm-guard.toml does not document %s", keyName(p))
		}
	}
}

// schemaPaths lists every [section] key of the schema.
func schemaPaths() [][]string {
	var out [][]string
	ct := reflect.TypeFor[Config]()
	for f := range ct.Fields() {
		sec := tomlName(f)
		if sec == "" {
			continue
		}
		for _, k := range tomlFields(f.Type) {
			out = append(out, []string{sec, k})
		}
	}
	return out
}

func TestLoadFull(t *testing.T) {
	cfg, err := Load(filepath.Join("testdata", "full.toml"))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"command", cfg.VLLM.Command[len(cfg.VLLM.Command)-1], "8192"},
		{"port", cfg.VLLM.Port, 8001},
		{"env", cfg.VLLM.Env, map[string]string{"HF_HOME": "/models", "CUDA_VISIBLE_DEVICES": "0,1"}},
		{"stop_timeout", cfg.VLLM.StopTimeout.Duration, 45 * time.Second},
		{"max_num_seqs", cfg.Profile.MaxNumSeqs, 128},
		{"restore_after", cfg.Profile.RestoreAfter.Duration, 2 * time.Hour},
		{"probe", cfg.Readiness.Probe, "models"},
		{"poll_interval", cfg.Readiness.PollInterval.Duration, 100 * time.Millisecond},
		{"devices", cfg.GPU.Devices, []string{"0", "GPU-5f3c2b1a-0000-1111-2222-333344445555"}},
		{"multiplier (integer into float)", cfg.Restart.Multiplier, 3.0},
		{"on_give_up", cfg.Restart.OnGiveUp, "stay"},
		{"http_listen", cfg.Control.HTTPListen, ""},
		{"alerts", cfg.Alerts.Command, []string{"/usr/local/bin/page", "--team", "inference"}},
		{"queue_size", cfg.Proxy.QueueSize, 0},
		{"max_body_bytes", cfg.Proxy.MaxBodyBytes, int64(1 << 20)},
		{"child_lines", cfg.Log.ChildLines, 500},
		{"served model", cfg.ServedModelName(), "llama"},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.name, c.got, c.want)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope.toml")
	_, err := Load(p)
	var ce *Error
	if !errors.As(err, &ce) || ce.File != p || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load(missing) = %v; want *Error naming %s that wraps fs.ErrNotExist", err, p)
	}
	if !strings.Contains(err.Error(), "--config") {
		t.Errorf("error does not say what to do: %v", err)
	}
}

// A config file is read up to MaxFileBytes: a larger one (valid TOML, all
// comments) and an endless device are refused by name, not read to the end.
func TestLoadCapsTheFileSize(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.toml")
	line := "# " + strings.Repeat("x", 1021) + "\n"
	if err := os.WriteFile(big, []byte(strings.Repeat(line, 2048)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{big, "/dev/zero"} {
		_, err := Load(p)
		var ce *Error
		if !errors.As(err, &ce) || ce.File != p || !strings.Contains(err.Error(), "larger than 1024 KiB") {
			t.Errorf("Load(%s) = %v; want an *Error naming it as too large", p, err)
		}
	}
}

// Every error class: the message names file:line, the key and what is allowed.
func TestLoadErrors(t *testing.T) {
	cases := []struct {
		name string
		body string
		line int
		key  string // substring of Error.Key
		msg  string // substring of the message
	}{
		{"syntax", "[vllm]\nport = 8000\nhost = \"x\nstop_timeout = \"1s\"\n", 3, "", "syntax"},
		{"syntax unclosed table", "[vllm\nport = 1\n", 1, "", "syntax"},
		{"duplicate key", "[vllm]\nport = 1\nport = 2\n", 3, "", "syntax"},
		{"unknown key with suggestion", "[profile]\nmax_num_seq = 4\n", 2, "[profile] max_num_seq", "did you mean max_num_seqs?"},
		{"unknown key in wrong section", "[vllm]\nport = 8000\n\nmax_num_seqs = 4\n", 4, "[vllm] max_num_seqs", "belongs in [profile]"},
		{"unknown key lists allowed", "[liveness]\nzzz = 1\n", 2, "[liveness] zzz", "allowed keys: interval, timeout, failures"},
		{"unknown section", "[vllm]\nport = 1\n[profle]\nmax_num_seqs = 4\n", 3, "[profle]", "did you mean profile?"},
		{"unknown top-level key", "port = 8000\n", 1, "[port]", "belongs in [vllm]"},
		{"case mismatch", "[profile]\n\nMax_Num_Seqs = 4\n", 3, "[profile] Max_Num_Seqs", "write max_num_seqs"},
		{"case mismatch section", "[VLLM]\nport = 1\n", 1, "[VLLM]", "write vllm"},
		{"duration as integer", "[restart]\ninitial_delay = \"1s\"\nmax_delay = 5\n", 3, "[restart] max_delay", `5 is a number; write a duration string with a unit, such as "5s" or "5m"`},
		{"duration as float", "[gpu]\nsample_interval = 0.5\n", 2, "[gpu] sample_interval", "is a number"},
		{"duration unparsable", "[vllm]\nstop_timeout = \"30 seconds\"\n", 2, "[vllm] stop_timeout", "is not a duration"},
		{"duration negative", "[restart]\nreset_after = \"-5m\"\n", 2, "[restart] reset_after", "is negative"},
		{"duration zero where positive", "[liveness]\ninterval = \"0s\"\n", 2, "[liveness] interval", "allowed: 100ms to 1h"},
		{"interval 1ns", "[readiness]\npoll_interval = \"1ns\"\n", 2, "[readiness] poll_interval", `"1ns" is out of range; allowed: 10ms to 1m`},
		{"sample 1ns", "[gpu]\nsample_interval = \"1ns\"\n", 2, "[gpu] sample_interval", "allowed: 10ms to 15s"},
		{"liveness 1ns", "[liveness]\ninterval = \"1ns\"\n", 2, "[liveness] interval", "allowed: 100ms to 1h"},
		{"initial_delay 0", "[restart]\ninitial_delay = \"0s\"\n", 2, "[restart] initial_delay", "allowed: 10ms to 1h"},
		{"restore_after too short", "[profile]\nrestore_after = \"1s\"\n", 2, "[profile] restore_after", `allowed: "0s" (off) or 10s to 720h`},
		{"stall_timeout huge", "[readiness]\nstall_timeout = \"2562047h\"\n", 2, "[readiness] stall_timeout", "allowed: 1s to 24h"},
		{"write_timeout", "[proxy]\nwrite_timeout = \"10ms\"\n", 2, "[proxy] write_timeout", "allowed: 1s to 1h"},
		{"max_connections", "[proxy]\nmax_connections = 0\n", 2, "[proxy] max_connections", "allowed: 1 to 1048576"},
		{"max_connections_per_client", "[proxy]\nmax_connections_per_client = -1\n", 2, "[proxy] max_connections_per_client", "or 1 to 1048576"},
		{"max_buffered_bytes below a body", "[proxy]\nmax_buffered_bytes = 1024\n", 2, "[proxy] max_buffered_bytes", "allowed: max_body_bytes (16777216)"},
		{"max_buffered_bytes_per_client below a body", "[proxy]\nmax_buffered_bytes_per_client = 1024\n", 2, "[proxy] max_buffered_bytes_per_client", "allowed: 0 (a quarter of max_buffered_bytes) or max_body_bytes (16777216)"},
		{"max_buffered_bytes_per_client above the budget", "[proxy]\nmax_buffered_bytes_per_client = 1073741824\n", 2, "[proxy] max_buffered_bytes_per_client", "to max_buffered_bytes (536870912)"},
		{"trusted_proxies not an address", "[proxy]\ntrusted_proxies = [\"10.0.0.0/8\", \"lb.internal\"]\n", 2, "[proxy] trusted_proxies", `"lb.internal" is neither a CIDR`},
		{"trusted_proxies bad mask", "[proxy]\ntrusted_proxies = [\"10.0.0.0/33\"]\n", 2, "[proxy] trusted_proxies", `"10.0.0.0/33" is neither a CIDR`},
		{"inflight_factor huge", "[proxy]\ninflight_factor = 1e300\n", 2, "[proxy] inflight_factor", "at most 64"},
		{"max_body_bytes huge", "[proxy]\nmax_body_bytes = 4611686018427387904\n", 2, "[proxy] max_body_bytes", "allowed: 1 to 1073741824"},
		{"string for int", "[vllm]\nport = \"8000\"\n", 2, "[vllm] port", "write a whole number without quotes"},
		{"float for int", "[profile]\nmax_num_seqs = 4.5\n", 2, "[profile] max_num_seqs", "whole number"},
		{"string for float", "[profile]\ngpu_memory_utilization = \"0.9\"\n", 2, "[profile] gpu_memory_utilization", "write a number without quotes"},
		{"int for string", "[readiness]\nprobe = 1\n", 2, "[readiness] probe", "write a string"},
		{"string for array", "[vllm]\ncommand = \"vllm serve m\"\n", 2, "[vllm] command", "array of strings"},
		{"array element type", "[vllm]\ncommand = [\"vllm\", 1]\n", 2, "[vllm] command", "element 2 is a whole number"},
		{"table for value", "[vllm]\nport = { a = 1 }\n", 2, "[vllm] port", "is a table"},
		{"value for table", "vllm = 1\n", 1, "[vllm]", "write a table"},
		{"env value type", "[vllm]\nenv = { A = 1 }\n", 2, "[vllm] env.A", "write a string"},
		{"env NOTIFY_SOCKET", "[vllm]\nenv = { NOTIFY_SOCKET = \"/x\" }\n", 2, "[vllm] env.NOTIFY_SOCKET", "never passed on"},
		{"env WATCHDOG", "[vllm.env]\nOK = \"1\"\nWATCHDOG_USEC = \"1\"\n", 3, "[vllm] env.WATCHDOG_USEC", "never passed on"},
		{"port range", "[vllm]\nport = 70000\n", 2, "[vllm] port", "allowed: 1 to 65535"},
		{"port zero", "[vllm]\nport = 0\n", 2, "[vllm] port", "allowed: 1 to 65535"},
		{"command empty", "[vllm]\ncommand = []\n", 2, "[vllm] command", "is empty"},
		{"command sets profile flag", "[vllm]\ncommand = [\"vllm\", \"serve\", \"m\", \"--max-num-seqs=8\"]\n", 2, "[vllm] command", "remove it from the command"},
		{"host empty", "[vllm]\nhost = \"\"\n", 2, "[vllm] host", "is empty"},
		{"utilization above 1", "[profile]\ngpu_memory_utilization = 1.2\n", 2, "[profile] gpu_memory_utilization", "at most 1"},
		{"utilization zero", "[profile]\ngpu_memory_utilization = 0\nmin_gpu_memory_utilization = 0\n", 2, "[profile] gpu_memory_utilization", "more than 0"},
		{"utilization nan", "[profile]\ngpu_memory_utilization = nan\n", 2, "[profile] gpu_memory_utilization", "out of range"},
		{"min utilization above utilization", "[profile]\nmin_gpu_memory_utilization = 0.9\n", 2, "[profile] min_gpu_memory_utilization", "above gpu_memory_utilization"},
		{"min utilization clash points at written key", "[profile]\ngpu_memory_utilization = 0.6\n", 2, "[profile] gpu_memory_utilization", "above gpu_memory_utilization"},
		{"factor 1", "[profile]\nmax_num_seqs_factor = 1.0\n", 2, "[profile] max_num_seqs_factor", "less than 1"},
		{"factor 0", "[profile]\nmax_num_seqs_factor = 0\n", 2, "[profile] max_num_seqs_factor", "more than 0"},
		{"min seqs above max", "[profile]\nmax_num_seqs = 8\n", 2, "[profile] max_num_seqs", "min_max_num_seqs (16) is above max_num_seqs (8)"},
		{"min seqs zero", "[profile]\nmin_max_num_seqs = 0\n", 2, "[profile] min_max_num_seqs", "1 or more"},
		{"max seqs zero", "[profile]\nmax_num_seqs = 0\n", 2, "[profile] max_num_seqs", "allowed: 1 to 1048576"},
		{"step negative", "[profile]\ngpu_memory_utilization_step = -0.05\n", 2, "[profile] gpu_memory_utilization_step", "0 or more"},
		{"headroom 1", "[profile]\nheadroom = 1.0\n", 2, "[profile] headroom", "less than 1"},
		{"probe", "[readiness]\nprobe = \"ping\"\n", 2, "[readiness] probe", `allowed: "auto" (the deepest request the model serves), "completion", "models" or "health"`},
		{"failures", "[liveness]\nfailures = 0\n", 2, "[liveness] failures", "1 or more"},
		{"warn above critical", "[gpu]\nwarn_fraction = 0.98\ncritical_fraction = 0.97\n", 2, "[gpu] warn_fraction", "below critical_fraction"},
		{"warn would always fire", "[profile]\ngpu_memory_utilization = 0.9\n[gpu]\nwarn_fraction = 0.90\n", 4, "[gpu] warn_fraction", "would always fire"},
		{"critical would always fire", "[profile]\ngpu_memory_utilization = 0.95\n[gpu]\ncritical_fraction = 0.9\n", 4, "[gpu] critical_fraction", "critical_over_budget"},
		{"over budget zero", "[gpu]\nwarn_over_budget = 0.0\n", 2, "[gpu] warn_over_budget", "more than 0"},
		{"warn over above critical over", "[gpu]\nwarn_over_budget = 0.06\n", 2, "[gpu] warn_over_budget", "below critical_over_budget"},
		{"critical above 1", "[gpu]\ncritical_fraction = 1.5\n", 2, "[gpu] critical_fraction", "at most 1"},
		{"device empty", "[gpu]\ndevices = [\"0\", \"\"]\n", 2, "[gpu] devices", "element 2 is empty"},
		{"multiplier", "[restart]\nmultiplier = 0.5\n", 2, "[restart] multiplier", "1 or more"},
		{"jitter", "[restart]\njitter = 1\n", 2, "[restart] jitter", "less than 1"},
		{"give_up_after", "[restart]\ngive_up_after = 0\n", 2, "[restart] give_up_after", "1 or more"},
		{"on_give_up", "[restart]\non_give_up = \"retry\"\n", 2, "[restart] on_give_up", `write "exit"`},
		{"max below initial", "[restart]\ninitial_delay = \"10m\"\n", 2, "[restart] initial_delay", "below initial_delay"},
		{"socket too long", "[control]\nsocket = \"/" + strings.Repeat("s", 120) + "\"\n", 2, "[control] socket", "at most 107"},
		{"http_listen", "[control]\nhttp_listen = \"9461\"\n", 2, "[control] http_listen", "is not host:port"},
		{"state_dir empty", "[control]\nstate_dir = \"\"\n", 2, "[control] state_dir", "is empty"},
		{"webhook", "[alerts]\nwebhook = \"hooks.example.com\"\n", 2, "[alerts] webhook", "http(s) URL"},
		{"alert command", "[alerts]\ncommand = [\"\"]\n", 2, "[alerts] command", "empty program name"},
		{"proxy same as http", "[proxy]\nlisten = \"127.0.0.1:9461\"\n", 2, "[proxy] listen", "give them different ports"},
		{"inflight_factor", "[proxy]\ninflight_factor = 0\n", 2, "[proxy] inflight_factor", "more than 0"},
		{"queue_size", "[proxy]\nqueue_size = -1\n", 2, "[proxy] queue_size", "allowed: 0 to 1048576"},
		{"max_body_bytes", "[proxy]\nmax_body_bytes = 0\n", 2, "[proxy] max_body_bytes", "allowed: 1 to 1073741824"},
		{"log level", "[log]\nlevel = \"verbose\"\n", 2, "[log] level", `"debug", "info", "warn" or "error"`},
		{"log format", "[log]\nformat = \"text\"\n", 2, "[log] format", `"auto", "json" or "console"`},
		{"child_lines", "[log]\nchild_lines = 4097\n", 2, "[log] child_lines", "1 to 4096"},
		{"child_lines of the 1.6 GB ring", "[log]\nchild_lines = 100000\n", 2, "[log] child_lines", "at most 64 MiB"},
		{"dotted key line", "vllm.port = 1\nvllm.host = \"h\"\nprofile.headroom = 2.0\n", 3, "[profile] headroom", "less than 1"},
		{"inline table line", "[vllm]\nenv = {\n  A = \"1\",\n  NOTIFY_SOCKET = \"x\",\n}\n", 4, "[vllm] env.NOTIFY_SOCKET", "never passed on"},
		{"after multi-line string", "[vllm]\nworkdir = \"\"\"\nport = 5\n\"\"\"\nport = 0\n", 5, "[vllm] port", "1 to 65535"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := writeTemp(t, tc.body)
			cfg, err := Load(p)
			if err == nil {
				t.Fatalf("Load succeeded (%+v); want an error", cfg)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %T %v is not a *config.Error", err, err)
			}
			if ce.File != p || ce.Line != tc.line || !strings.Contains(ce.Key, tc.key) || !strings.Contains(ce.Msg, tc.msg) {
				t.Errorf("got %q (line %d key %q)\nwant line %d, key containing %q, message containing %q", err, ce.Line, ce.Key, tc.line, tc.key, tc.msg)
			}
			prefix := p + ":" + strconv.Itoa(tc.line) + ": "
			if !strings.HasPrefix(ce.Error(), prefix) {
				t.Errorf("Error() = %q; want it to start with %q", ce.Error(), prefix)
			}
		})
	}
}

// Several problems: all reported, in file order.
func TestLoadReportsAllErrors(t *testing.T) {
	body := "[log]\nlevel = \"loud\"\n[vllm]\nport = 0\n[restart]\nmax_delay = 5\nbogus = 1\n"
	_, err := Load(writeTemp(t, body))
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("got %T %v; want config.Errors", err, err)
	}
	// Type, key and range problems come in one pass, in file order.
	if len(es) != 4 || es[0].Line != 2 || es[1].Line != 4 || es[2].Line != 6 || es[3].Line != 7 {
		t.Fatalf("got %d errors %v; want level (2), port (4), max_delay (6), bogus (7)", len(es), err)
	}
	_, err = Load(writeTemp(t, "[log]\nlevel = \"loud\"\n[vllm]\nport = 0\n[gpu]\nwarn_fraction = 2.0\n"))
	if !errors.As(err, &es) || len(es) != 3 {
		t.Fatalf("got %v; want 3 range errors", err)
	}
	for i, want := range []int{2, 4, 6} {
		if es[i].Line != want {
			t.Errorf("error %d at line %d, want %d: %v", i, es[i].Line, want, es[i])
		}
	}
	// A key with a type error is not also reported as out of range.
	_, err1 := Load(writeTemp(t, "[vllm]\nport = \"0\"\n"))
	if _, ok := err1.(*Error); !ok {
		t.Errorf("port = \"0\": got %T %v; want exactly one *Error", err1, err1)
	}
	var first *Error
	if !errors.As(err, &first) || first != es[0] {
		t.Errorf("errors.As finds %v; want the first error", first)
	}
	if n := strings.Count(err.Error(), "\n"); n != 2 {
		t.Errorf("Error() has %d newlines, want one line per problem: %q", n, err.Error())
	}
}

// What check prints loads back to the same configuration.
func TestWriteEffectiveRoundTrip(t *testing.T) {
	for _, src := range []string{filepath.Join("testdata", "full.toml"), filepath.Join("..", "..", "vllm-guard.toml")} {
		cfg, err := Load(src)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := cfg.WriteEffective(&buf); err != nil {
			t.Fatal(err)
		}
		p := writeTemp(t, buf.String())
		back, err := Load(p)
		if err != nil {
			t.Fatalf("effective output of %s does not load: %v\n%s", src, err, buf.String())
		}
		back.Path = cfg.Path
		if !reflect.DeepEqual(back, cfg) {
			t.Errorf("round trip of %s differs:\n got %+v\nwant %+v", src, back, cfg)
		}
		for _, key := range schemaPaths() {
			if !scanPositions(buf.String()).has(key) {
				t.Errorf("effective output lacks %s", keyName(key))
			}
		}
	}
}

func TestWriteEffectiveFormat(t *testing.T) {
	cfg := Default()
	cfg.VLLM.Env = map[string]string{"B": "2", "A": "quote\"d\x01"}
	var buf bytes.Buffer
	if err := cfg.WriteEffective(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"from built-in defaults",
		`max_delay      = "5m"`,
		"multiplier     = 2.0",
		`env               = { A = "quote\"d\u0001", B = "2" }`,
		`devices              = []`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestServedModelName(t *testing.T) {
	cases := []struct {
		name    string
		served  string
		command []string
		want    string
	}{
		{"explicit", "api-name", []string{"vllm", "serve", "m"}, "api-name"},
		{"positional", "", []string{"vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--port", "1"}, "Qwen/Qwen2.5-7B-Instruct"},
		{"positional after flags", "", []string{"vllm", "serve", "--enforce-eager", "--port", "1", "org/m"}, "org/m"},
		{"flag", "", []string{"vllm", "serve", "m", "--served-model-name", "a", "b"}, "a"},
		{"flag equals", "", []string{"vllm", "serve", "m", "--served-model-name=a"}, "a"},
		{"--model", "", []string{"python", "-m", "vllm.entrypoints.openai.api_server", "--model", "x/y"}, "x/y"},
		{"serve then flag", "", []string{"vllm", "serve", "--model=x"}, "x"},
		{"nothing", "", []string{"vllm"}, ""},
	}
	for _, tc := range cases {
		c := Default()
		c.VLLM.ServedModelName = tc.served
		c.VLLM.Command = tc.command
		if got := c.ServedModelName(); got != tc.want {
			t.Errorf("%s: ServedModelName() = %q, want %q", tc.name, got, tc.want)
		}
	}
	// Several names, the extra arguments and the --config file all count.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "v.yaml"), []byte("served-model-name: [y1, y2]\n"), 0o644)
	c := Default()
	c.VLLM.Workdir = dir
	c.VLLM.Command = []string{"vllm", "serve", "m", "--config", "v.yaml"}
	a, err := c.VLLMArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ServedModelNames(a); !reflect.DeepEqual(got, []string{"y1", "y2"}) {
		t.Errorf("from YAML: %q", got)
	}
	a, _ = c.VLLMArgs([]string{"--served-model-name", "x"})
	if got := c.ServedModelNames(a); !reflect.DeepEqual(got, []string{"x"}) {
		t.Errorf("extra args override the file: %q", got)
	}
	c.VLLM.Command = []string{"vllm", "serve", "m", "--config", "nope.yaml"}
	var ce *Error
	if _, err := c.VLLMArgs(nil); !errors.As(err, &ce) || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("missing YAML: %v", err)
	}
}

func TestThresholdsFollowTheBudget(t *testing.T) {
	g := Default().GPU
	for _, budget := range []float64{0.9, 0.95} {
		warn, crit := g.Thresholds(budget)
		if warn <= budget || crit <= warn {
			t.Errorf("budget %g: warn %g critical %g: each must be above the budget, warn first", budget, warn, crit)
		}
	}
	if w, c := g.Thresholds(0.99); w != 0.995 || c != 0.995 {
		t.Errorf("near-full budget: %g %g, want both capped at 0.995", w, c)
	}
	g.WarnFraction, g.CriticalFraction = 0.93, 0.98
	if w, c := g.Thresholds(0.5); w != 0.93 || c != 0.98 {
		t.Errorf("fixed keys: %g %g", w, c)
	}
}

func TestCheckMasksSecrets(t *testing.T) {
	c := Default()
	c.VLLM.Command = []string{"vllm", "serve", "m", "--api-key", "sk-top", "--api-key=sk-two"}
	c.VLLM.Env = map[string]string{"VLLM_API_KEY": "sk-env", "HF_HOME": "/models"}
	var b strings.Builder
	if err := c.WriteEffective(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, s := range []string{"sk-top", "sk-two", "sk-env"} {
		if strings.Contains(out, s) {
			t.Errorf("secret %q printed:\n%s", s, out)
		}
	}
	if !strings.Contains(out, `"--api-key", "***"`) || !strings.Contains(out, `VLLM_API_KEY = "***"`) || !strings.Contains(out, "/models") {
		t.Errorf("masking went too far or not far enough:\n%s", out)
	}
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	t.Setenv("VLLM_GUARD_CONFIG", "")
	if got := Resolve("/x/flag.toml"); got != "/x/flag.toml" {
		t.Errorf("flag: got %q", got)
	}
	t.Setenv("VLLM_GUARD_CONFIG", "/x/env.toml")
	if got := Resolve(""); got != "/x/env.toml" {
		t.Errorf("env: got %q", got)
	}
	if got := Resolve("/x/flag.toml"); got != "/x/flag.toml" {
		t.Errorf("flag over env: got %q", got)
	}
	t.Setenv("VLLM_GUARD_CONFIG", "")
	want := "./vllm-guard.toml"
	if _, err := os.Stat("/etc/vllm-guard/vllm-guard.toml"); err == nil {
		want = "/etc/vllm-guard/vllm-guard.toml"
	}
	if got := Resolve(""); got != want {
		t.Errorf("nothing in cwd: got %q, want %q", got, want)
	}
	if err := os.WriteFile(filepath.Join(dir, "vllm-guard.toml"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := Resolve(""); got != "./vllm-guard.toml" {
		t.Errorf("cwd file: got %q", got)
	}
}

func TestDuration(t *testing.T) {
	for in, want := range map[string]string{"0s": "0s", "5m": "5m", "90s": "1m30s", "1h": "1h", "1h30m": "1h30m", "250ms": "250ms", "2h0m5s": "2h0m5s"} {
		var d Duration
		if err := d.UnmarshalText([]byte(in)); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got := d.String(); got != want {
			t.Errorf("Duration(%s).String() = %q, want %q", in, got, want)
		}
	}
	var d Duration
	if err := d.UnmarshalTOML(int64(30)); err == nil || !strings.Contains(err.Error(), `"30s"`) {
		t.Errorf("UnmarshalTOML(30) = %v; want a hint to write \"30s\"", err)
	}
	if err := d.UnmarshalTOML(true); err == nil {
		t.Error("UnmarshalTOML(true) succeeded")
	}
}

func TestScanPositions(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "dotted.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(filepath.Join("testdata", "dotted.toml")); err != nil {
		t.Fatalf("dotted.toml does not load: %v", err)
	}
	pos := scanPositions(string(src))
	for key, want := range map[string]int{
		"vllm" + keySep + "port":               3,
		"profile" + keySep + "max_num_seqs":    4,
		"vllm" + keySep + "env":                5,
		"vllm" + keySep + "env" + keySep + "A": 6,
		"vllm" + keySep + "env" + keySep + "B": 9,
		"log" + keySep + "level":               11,
	} {
		if pos[key] != want {
			t.Errorf("line of %q = %d, want %d", strings.ReplaceAll(key, keySep, "."), pos[key], want)
		}
	}
	if _, ok := pos["vllm"+keySep+"env"+keySep+"port"]; ok {
		t.Error("a key inside a multi-line string was recorded")
	}
}

// FuzzLoad runs in memory (parse, not Load: no temp file per input) on
// small seeds (fuzzLoadSeeds): go's fuzzer minimizes every input that finds
// new coverage by trying to delete each byte range, which is quadratic in
// the input's length, so a 6.7 KB seed made each new input cost the full
// minimization budget (issue 15 item 14).
func FuzzLoad(f *testing.F) {
	for _, b := range fuzzLoadSeeds(f) {
		f.Add(b)
	}
	const name = "fuzz.toml"
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := parse(name, data)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || ce.Line < 0 || ce.File != name || ce.Msg == "" {
				t.Fatalf("error %T %q is not a located *config.Error", err, err)
			}
			if ce.Line > bytes.Count(data, []byte("\n"))+1 {
				t.Fatalf("line %d is past the end of the file: %v", ce.Line, err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Load accepted a config that Validate refuses: %v", err)
		}
		if err := roundTrip(name, cfg); err != nil {
			t.Fatal(err)
		}
	})
}

// Every duration key has a floor and a ceiling (issue 15 item 13): a key
// added without an entry in durationRanges fails here, and every range
// holds its own default.
func TestEveryDurationIsBounded(t *testing.T) {
	var walk func(path []string, v reflect.Value)
	seen := map[string]bool{}
	walk = func(path []string, v reflect.Value) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			name := tomlName(f)
			if name == "" {
				continue
			}
			p := append(append([]string{}, path...), name)
			switch {
			case f.Type == durationType:
				key := strings.Join(p, ".")
				seen[key] = true
				r, ok := durationRanges[key]
				if !ok {
					t.Errorf("%s has no entry in durationRanges", key)
					continue
				}
				if r.min > r.max || r.max > 1000*24*time.Hour {
					t.Errorf("%s: range %s to %s", key, r.min, r.max)
				}
				d := v.Field(i).Interface().(Duration).Duration
				if !(r.off && d == 0) && (d < r.min || d > r.max) {
					t.Errorf("%s: the default %s is outside its own range %s to %s", key, d, r.min, r.max)
				}
			case f.Type.Kind() == reflect.Struct:
				walk(p, v.Field(i))
			}
		}
	}
	walk(nil, reflect.ValueOf(Default()).Elem())
	for key := range durationRanges {
		if !seen[key] {
			t.Errorf("durationRanges has %s, which is not a duration key", key)
		}
	}
}

// check refuses 1ns for every interval, naming file, line and key.
func TestOneNanosecondIntervalsAreRefused(t *testing.T) {
	body := "[readiness]\npoll_interval = \"1ns\"\n[liveness]\ninterval = \"1ns\"\n[gpu]\nsample_interval = \"1ns\"\n"
	p := writeTemp(t, body)
	_, err := Load(p)
	var errs Errors
	if !errors.As(err, &errs) || len(errs) != 3 {
		t.Fatalf("Load = %v; want three errors", err)
	}
	for i, want := range []string{
		p + ":2: [readiness] poll_interval: \"1ns\" is out of range; allowed: 10ms to 1m",
		p + ":4: [liveness] interval: \"1ns\" is out of range; allowed: 100ms to 1h",
		p + ":6: [gpu] sample_interval: \"1ns\" is out of range; allowed: 10ms to 15s",
	} {
		if !strings.HasPrefix(errs[i].Error(), want) {
			t.Errorf("error %d = %q; want it to start with %q", i, errs[i].Error(), want)
		}
	}
}

func TestTrustedPrefixes(t *testing.T) {
	got, err := TrustedPrefixes([]string{"10.0.0.0/8", " 192.0.2.7 ", "::1", "::ffff:172.16.0.0/108", "10.1.2.3/8"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.0.2.7/32", "::1/128", "172.16.0.0/12", "10.0.0.0/8"}
	if len(got) != len(want) {
		t.Fatalf("got %v; want %v", got, want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("entry %d: %s; want %s", i, got[i], want[i])
		}
	}
	if p, err := TrustedPrefixes(nil); err != nil || len(p) != 0 {
		t.Errorf("none: %v %v; want nothing trusted", p, err)
	}
}

// A trusted_proxies entry that trusts every address is allowed but warned
// about (issue 41); a list of balancers is not.
func TestTrustEveryoneWarns(t *testing.T) {
	for _, tc := range []struct {
		list []string
		warn string
	}{
		{[]string{"10.0.0.0/8", "192.0.2.7"}, ""},
		{[]string{"10.0.0.0/8", " 0.0.0.0/0"}, `"0.0.0.0/0" trusts every address`},
		{[]string{"::/0"}, `"::/0" trusts every address`},
		{[]string{"::ffff:0.0.0.0/96"}, `"::ffff:0.0.0.0/96" trusts every address`},
	} {
		cfg := Default()
		cfg.Proxy.TrustedProxies = tc.list
		w := strings.Join(cfg.Warnings(), "\n")
		if (tc.warn == "") != (w == "") || !strings.Contains(w, tc.warn) || (w != "" && !strings.Contains(w, "list only your load balancers")) {
			t.Errorf("trusted_proxies %q: warnings %q; want one containing %q", tc.list, w, tc.warn)
		}
	}
}

// parse reads a config file's bytes as LoadFor(path, "") reads the file.
func parse(path string, data []byte) (*Config, error) { return parseFor(path, data, "") }
