package supervisor

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/ownconns"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

// fakeAPI is a small vLLM API: an optional key, the names it lists, and
// whether it generates or pools.
type fakeAPI struct {
	key     string
	names   []string
	pooling bool
	seen    atomic.Pointer[string] // the last path asked
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	f.seen.Store(&p)
	if strings.HasPrefix(p, "/v1") && f.key != "" && r.Header.Get("Authorization") != "Bearer "+f.key {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	switch {
	case p == "/health":
	case p == "/v1/models":
		var data []map[string]string
		for _, n := range f.names {
			data = append(data, map[string]string{"id": n})
		}
		json.NewEncoder(w).Encode(map[string]any{"data": data})
	case p == "/v1/completions" && !f.pooling:
	case (p == "/v1/embeddings" || p == "/pooling" || p == "/classify") && f.pooling:
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func endpointOf(t *testing.T, url string) launch.Endpoint {
	t.Helper()
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	n, _ := strconv.Atoi(port)
	return launch.Endpoint{Host: host, Port: n}
}

func probeOnce(t *testing.T, api *fakeAPI, spec probeSpec, level string) probeResult {
	t.Helper()
	srv := httptest.NewServer(api)
	defer srv.Close()
	if spec.tree == nil {
		spec.tree = thisProcess
	}
	p := newProber(endpointOf(t, srv.URL), spec)
	defer p.close()
	return p.ready(context.Background(), level, 2*time.Second)
}

// thisProcess is the tree of a test whose listener is its own.
func thisProcess() []int { return []int{os.Getpid()} }

func TestProbeAPIKey(t *testing.T) {
	api := &fakeAPI{key: "sk-1", names: []string{"m"}}
	r := probeOnce(t, api, probeSpec{names: []string{"m"}}, "auto")
	if r.ok || r.status != 401 || !r.explains || !strings.HasPrefix(r.err, "vLLM answers 401: the guard has no valid API key") {
		t.Fatalf("no key: %+v", r)
	}
	if r := probeOnce(t, api, probeSpec{names: []string{"m"}, key: "sk-1"}, "auto"); !r.ok || !strings.Contains(r.probe, "/v1/completions") {
		t.Fatalf("with the key: %+v", r)
	}
	if r := probeOnce(t, api, probeSpec{names: []string{"m"}, key: "wrong"}, "models"); r.ok || !strings.Contains(r.err, "refused the key") || strings.Contains(r.err, "wrong") {
		t.Fatalf("wrong key: %+v", r)
	}
}

func TestProbeNames(t *testing.T) {
	api := &fakeAPI{names: []string{"a", "b"}}
	if r := probeOnce(t, api, probeSpec{names: []string{"x", "b"}}, "completion"); !r.ok {
		t.Fatalf("one of several names listed: %+v", r)
	}
	r := probeOnce(t, api, probeSpec{names: []string{"x"}}, "completion")
	if r.ok || !r.explains || !strings.Contains(r.err, `/v1/models lists ["a" "b"], not the served name "x"`) {
		t.Fatalf("name not listed: %+v", r)
	}
}

func TestProbeAutoPooling(t *testing.T) {
	api := &fakeAPI{names: []string{"e"}, pooling: true}
	// The task from vLLM's Supported_tasks line.
	tasks := func() []string { return []string{"encode", "embed"} }
	r := probeOnce(t, api, probeSpec{names: []string{"e"}, tasks: tasks}, "auto")
	if !r.ok || *api.seen.Load() != "/v1/embeddings" || !strings.Contains(r.probe, "task embed, vLLM's Supported tasks line") {
		t.Fatalf("embed from the log: %+v (last %s)", r, *api.seen.Load())
	}
	// Today's task names: each task's own endpoint.
	for ts, want := range map[string]string{"token_embed": "/pooling", "token_classify,classify": "/classify", "plugin": "/pooling", "embed,token_embed": "/v1/embeddings"} {
		r := probeOnce(t, api, probeSpec{names: []string{"e"}, tasks: func() []string { return strings.Split(ts, ",") }}, "auto")
		if !r.ok || *api.seen.Load() != want {
			t.Fatalf("tasks %s: %+v (last %s), want %s", ts, r, *api.seen.Load(), want)
		}
	}
	// From --task.
	r = probeOnce(t, api, probeSpec{names: []string{"e"}, taskHint: "classify"}, "auto")
	if !r.ok || *api.seen.Load() != "/classify" {
		t.Fatalf("classify from --task: %+v", r)
	}
	// Nothing said it: the 404 on completions teaches it.
	r = probeOnce(t, api, probeSpec{names: []string{"e"}}, "auto")
	if !r.ok || *api.seen.Load() != "/pooling" || !strings.Contains(r.probe, "404") {
		t.Fatalf("pooling learned from a 404: %+v", r)
	}
	// An explicit completion probe stays a completion probe.
	if r := probeOnce(t, api, probeSpec{names: []string{"e"}}, "completion"); r.ok || r.status != 404 {
		t.Fatalf("explicit completion on a pooling model: %+v", r)
	}
}

func TestProbeConnectionsAreRecorded(t *testing.T) {
	api := &fakeAPI{names: []string{"m"}}
	srv := httptest.NewUnstartedServer(api)
	conns := ownconns.New()
	var port atomic.Int64
	srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateNew {
			port.Store(int64(c.RemoteAddr().(*net.TCPAddr).Port))
		}
	}
	srv.Start()
	defer srv.Close()
	p := newProber(endpointOf(t, srv.URL), probeSpec{names: []string{"m"}, conns: conns, tree: thisProcess})
	defer p.close()
	if r := p.ready(context.Background(), "health", time.Second); !r.ok {
		t.Fatal(r)
	}
	if !conns.Has("127.0.0.1", int(port.Load())) {
		t.Fatal("the prober's connection is not recorded")
	}
}

// vLLM's GET /is_paused (dev mode) answers {"is_paused": true} while an
// operator paused it; without dev mode it is a 404: not paused.
func TestProbePaused(t *testing.T) {
	for _, c := range []struct {
		status int
		body   string
		want   bool
	}{
		{200, `{"is_paused": true}`, true},
		{200, `{"is_paused": false}`, false},
		{404, `{"detail":"Not Found"}`, false},
		{200, `not json`, false},
	} {
		var auth atomic.Pointer[string]
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a := r.Header.Get("Authorization")
			auth.Store(&a)
			if r.Method != http.MethodGet || r.URL.Path != "/is_paused" {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			w.WriteHeader(c.status)
			w.Write([]byte(c.body))
		}))
		p := newProber(endpointOf(t, srv.URL), probeSpec{names: []string{"m"}, key: "sk-1", tree: thisProcess})
		r := p.paused(context.Background(), time.Second)
		p.close()
		srv.Close()
		if r.paused != c.want || *auth.Load() != "Bearer sk-1" {
			t.Errorf("%d %s: paused %v (%+v), key %q; want %v", c.status, c.body, r.paused, r, *auth.Load(), c.want)
		}
	}
}

// Issue 41 item 2: a listener that is not vLLM's (here: the tree is
// another process) gets no probe at all, so no key; the probe says who
// holds the port. With no tree to check against, no key is sent either.
func TestProbeSendsNothingToAListenerOutsideTheTree(t *testing.T) {
	var got atomic.Int64
	var auth atomic.Pointer[string]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		a := r.Header.Get("Authorization")
		auth.Store(&a)
		w.Write([]byte(`{"data":[{"id":"m"}]}`))
	}))
	defer srv.Close()
	p := newProber(endpointOf(t, srv.URL), probeSpec{names: []string{"m"}, key: "sk-1", tree: func() []int { return []int{1} }})
	r := p.ready(context.Background(), "auto", time.Second)
	p.close()
	if r.ok || got.Load() != 0 || !strings.Contains(r.err, "not vLLM's: pid "+strconv.Itoa(os.Getpid())) || !strings.Contains(r.err, "no API key") {
		t.Fatalf("%+v after %d requests reached the listener", r, got.Load())
	}
	p = newProber(endpointOf(t, srv.URL), probeSpec{names: []string{"m"}, key: "sk-1"})
	p.ready(context.Background(), "models", time.Second)
	p.close()
	if a := auth.Load(); a == nil || *a != "" {
		t.Fatalf("unchecked listener: Authorization %v, want none", a)
	}
}

// DialVLLM (the metrics scraper's dial) reaches the running vLLM's own
// listener only: between runs nothing, during a run its tree's.
func TestDialVLLMReachesTheRunningTreeOnly(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	cfg := config.Default()
	sup, err := New(cfg, Options{Policy: policy.New(cfg.Policy(), policy.State{}, realClockForTest{}), Keeper: []string{"keeper"}})
	if err != nil {
		t.Fatal(err)
	}
	dial := sup.DialVLLM(&net.Dialer{Timeout: time.Second})
	addr := strings.TrimPrefix(srv.URL, "http://")
	if c, err := dial(context.Background(), "tcp", addr); err == nil {
		c.Close()
		t.Fatal("connected with no vLLM running")
	}
	tree := func() []int { return thisProcess() }
	sup.tree.Store(&tree)
	c, err := dial(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatalf("the running tree's listener: %v", err)
	}
	c.Close()
}
