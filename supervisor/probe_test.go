package supervisor

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeAPI answers like vLLM's API server: /health, /v1/models listing
// names, /v1/completions with the given status.
func fakeAPI(t *testing.T, health, completion int, names ...string) Endpoint {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(health) })
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		var list struct {
			Data []map[string]string `json:"data"`
		}
		for _, n := range names {
			list.Data = append(list.Data, map[string]string{"id": n})
		}
		_ = json.NewEncoder(w).Encode(list)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body["max_tokens"] != float64(1) {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(completion)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	p, _ := strconv.Atoi(port)
	return Endpoint{Host: host, Port: p}
}

func TestProberReadinessChain(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name               string
		health, completion int
		names              []string
		level              string
		ok                 bool
		step, errHas       string
	}{
		{"ready", 200, 200, []string{"m"}, "completion", true, "completion", ""},
		{"health only", 200, 500, nil, "health", true, "health", ""},
		{"models only", 200, 500, []string{"m"}, "models", true, "models", ""},
		{"engine dead", 503, 200, []string{"m"}, "completion", false, "health", "answered 503"},
		{"name not listed", 200, 200, []string{"other-a", "other-b"}, "completion", false, "models", `it lists ["other-a" "other-b"]`},
		{"completion fails", 200, 500, []string{"m"}, "completion", false, "completion", "answered 500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProber(fakeAPI(t, tc.health, tc.completion, tc.names...), "m")
			defer p.close()
			r := p.ready(ctx, tc.level, 2*time.Second)
			if r.ok != tc.ok || r.step != tc.step || !strings.Contains(r.err, tc.errHas) || r.refused {
				t.Fatalf("%+v", r)
			}
		})
	}
}

func TestProberSaysRefusedWhileNothingListens(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	p := newProber(Endpoint{Host: "127.0.0.1", Port: port}, "m")
	defer p.close()
	if r := p.health(context.Background(), time.Second); r.ok || !r.refused {
		t.Fatalf("%+v", r)
	}
}
