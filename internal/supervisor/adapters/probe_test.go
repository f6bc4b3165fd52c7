package adapters

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

	"github.com/vllm-guard/vllm-guard/internal/launch"
	"github.com/vllm-guard/vllm-guard/internal/ownconns"
)

// fakeAPI is a small vLLM API: an optional key, the names it lists, and
// whether it generates or pools.
type FakeAPI struct {
	Key     string
	Names   []string
	Pooling bool
	Seen    atomic.Pointer[string] // the last path asked
}

func (f *FakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	f.Seen.Store(&p)
	if strings.HasPrefix(p, "/v1") && f.Key != "" && r.Header.Get("Authorization") != "Bearer "+f.Key {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	switch {
	case p == "/health":
	case p == "/v1/models":
		var data []map[string]string
		for _, n := range f.Names {
			data = append(data, map[string]string{"id": n})
		}
		json.NewEncoder(w).Encode(map[string]any{"data": data})
	case p == "/v1/completions" && !f.Pooling:
	case (p == "/v1/embeddings" || p == "/pooling" || p == "/classify") && f.Pooling:
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func EndpointOf(t *testing.T, url string) launch.Endpoint {
	t.Helper()
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	n, _ := strconv.Atoi(port)
	return launch.Endpoint{Host: host, Port: n}
}

func ProbeOnce(t *testing.T, api *FakeAPI, spec ProbeSpec, level string) ProbeResult {
	t.Helper()
	srv := httptest.NewServer(api)
	defer srv.Close()
	if spec.Tree == nil {
		spec.Tree = ThisProcess
	}
	p := NewProber(EndpointOf(t, srv.URL), spec)
	defer p.Close()
	return p.Ready(context.Background(), level, 2*time.Second)
}

// thisProcess is the tree of a test whose listener is its own.
func ThisProcess() []int { return []int{os.Getpid()} }

func TestProbeAPIKey(t *testing.T) {
	api := &FakeAPI{Key: "sk-1", Names: []string{"m"}}
	r := ProbeOnce(t, api, ProbeSpec{Names: []string{"m"}}, "auto")
	if r.OK || r.Status != 401 || !r.Explains || !strings.HasPrefix(r.Err, "vLLM answers 401: the guard has no valid API key") {
		t.Fatalf("no key: %+v", r)
	}
	if r := ProbeOnce(t, api, ProbeSpec{Names: []string{"m"}, Key: "sk-1"}, "auto"); !r.OK || !strings.Contains(r.Probe, "/v1/completions") {
		t.Fatalf("with the key: %+v", r)
	}
	if r := ProbeOnce(t, api, ProbeSpec{Names: []string{"m"}, Key: "wrong"}, "models"); r.OK || !strings.Contains(r.Err, "refused the key") || strings.Contains(r.Err, "wrong") {
		t.Fatalf("wrong key: %+v", r)
	}
}

func TestProbeNames(t *testing.T) {
	api := &FakeAPI{Names: []string{"a", "b"}}
	if r := ProbeOnce(t, api, ProbeSpec{Names: []string{"x", "b"}}, "completion"); !r.OK {
		t.Fatalf("one of several names listed: %+v", r)
	}
	r := ProbeOnce(t, api, ProbeSpec{Names: []string{"x"}}, "completion")
	if r.OK || !r.Explains || !strings.Contains(r.Err, `/v1/models lists ["a" "b"], not the served name "x"`) {
		t.Fatalf("name not listed: %+v", r)
	}
}

func TestProbeAutoPooling(t *testing.T) {
	api := &FakeAPI{Names: []string{"e"}, Pooling: true}
	// The task from vLLM's Supported_tasks line.
	tasks := func() []string { return []string{"encode", "embed"} }
	r := ProbeOnce(t, api, ProbeSpec{Names: []string{"e"}, Tasks: tasks}, "auto")
	if !r.OK || *api.Seen.Load() != "/v1/embeddings" || !strings.Contains(r.Probe, "task embed, vLLM's Supported tasks line") {
		t.Fatalf("embed from the log: %+v (last %s)", r, *api.Seen.Load())
	}
	// Today's task names: each task's own endpoint.
	for ts, want := range map[string]string{"token_embed": "/pooling", "token_classify,classify": "/classify", "plugin": "/pooling", "embed,token_embed": "/v1/embeddings"} {
		r := ProbeOnce(t, api, ProbeSpec{Names: []string{"e"}, Tasks: func() []string { return strings.Split(ts, ",") }}, "auto")
		if !r.OK || *api.Seen.Load() != want {
			t.Fatalf("tasks %s: %+v (last %s), want %s", ts, r, *api.Seen.Load(), want)
		}
	}
	// From --task.
	r = ProbeOnce(t, api, ProbeSpec{Names: []string{"e"}, TaskHint: "classify"}, "auto")
	if !r.OK || *api.Seen.Load() != "/classify" {
		t.Fatalf("classify from --task: %+v", r)
	}
	// Nothing said it: the 404 on completions teaches it.
	r = ProbeOnce(t, api, ProbeSpec{Names: []string{"e"}}, "auto")
	if !r.OK || *api.Seen.Load() != "/pooling" || !strings.Contains(r.Probe, "404") {
		t.Fatalf("pooling learned from a 404: %+v", r)
	}
	// An explicit completion probe stays a completion probe.
	if r := ProbeOnce(t, api, ProbeSpec{Names: []string{"e"}}, "completion"); r.OK || r.Status != 404 {
		t.Fatalf("explicit completion on a pooling model: %+v", r)
	}
}

func TestProbeConnectionsAreRecorded(t *testing.T) {
	api := &FakeAPI{Names: []string{"m"}}
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
	p := NewProber(EndpointOf(t, srv.URL), ProbeSpec{Names: []string{"m"}, Conns: conns, Tree: ThisProcess})
	defer p.Close()
	if r := p.Ready(context.Background(), "health", time.Second); !r.OK {
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
		Status int
		Body   string
		Want   bool
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
			w.WriteHeader(c.Status)
			w.Write([]byte(c.Body))
		}))
		p := NewProber(EndpointOf(t, srv.URL), ProbeSpec{Names: []string{"m"}, Key: "sk-1", Tree: ThisProcess})
		r := p.Paused(context.Background(), time.Second)
		p.Close()
		srv.Close()
		if r.Paused != c.Want || *auth.Load() != "Bearer sk-1" {
			t.Errorf("%d %s: paused %v (%+v), key %q; want %v", c.Status, c.Body, r.Paused, r, *auth.Load(), c.Want)
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
	p := NewProber(EndpointOf(t, srv.URL), ProbeSpec{Names: []string{"m"}, Key: "sk-1", Tree: func() []int { return []int{1} }})
	r := p.Ready(context.Background(), "auto", time.Second)
	p.Close()
	if r.OK || got.Load() != 0 || !strings.Contains(r.Err, "not vLLM's: pid "+strconv.Itoa(os.Getpid())) || !strings.Contains(r.Err, "no API key") {
		t.Fatalf("%+v after %d requests reached the listener", r, got.Load())
	}
	p = NewProber(EndpointOf(t, srv.URL), ProbeSpec{Names: []string{"m"}, Key: "sk-1"})
	p.Ready(context.Background(), "models", time.Second)
	p.Close()
	if a := auth.Load(); a == nil || *a != "" {
		t.Fatalf("unchecked listener: Authorization %v, want none", a)
	}
}
