package vllmstats

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestScraper(t *testing.T) {
	body, err := os.ReadFile(filepath.Join("testdata", "metrics_v0_old.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var fail atomic.Bool
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		if fail.Load() {
			http.Error(w, "engine dead", http.StatusServiceUnavailable)
			return
		}
		w.Write(body)
	}))
	defer srv.Close()

	core, logs := observer.New(zap.InfoLevel)
	s := NewScraper(10*time.Millisecond, zap.New(core))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// No target: nothing is scraped.
	if st := s.Latest(); st.Up || st.Scrapes != 0 {
		t.Fatalf("before a target: %+v", st)
	}

	s.SetTarget(srv.URL + "/")
	testkit.WaitFor(t, "a successful scrape", 30*time.Second, func() bool { return s.Latest().Up })
	st := s.Latest()
	if st.Running != 4 || st.Waiting != 9 || st.KVUsage != 0.9731 || st.ScrapedAt.IsZero() || st.Failures != 0 {
		t.Fatalf("after a scrape: %+v", st)
	}

	fail.Store(true)
	testkit.WaitFor(t, "three failed scrapes", 30*time.Second, func() bool { return s.Latest().Failures >= 3 })
	st = s.Latest()
	if st.Up || !strings.Contains(st.LastError, "HTTP 503") || st.Running != 4 {
		t.Fatalf("while failing: %+v; want down, HTTP 503 named, last values kept", st)
	}
	if n := logs.FilterMessageSnippet("cannot scrape").Len(); n != 1 {
		t.Errorf("failure episode logged %d times, want once", n)
	}

	fail.Store(false)
	testkit.WaitFor(t, "recovery", 30*time.Second, func() bool { return s.Latest().Up })
	if n := logs.FilterMessageSnippet("scrape works again").Len(); n != 1 {
		t.Errorf("recovery logged %d times: %+v %v", n, s.Latest(), logs.All())
	}

	s.SetTarget("")
	if s.Latest().Up {
		t.Fatal("Up after the target was cleared")
	}
	// Stop Run, then take one step by hand: with no target it must not
	// touch vLLM.
	cancel()
	<-done
	n, before := hits.Load(), s.Latest().Scrapes
	s.scrapeOnce(context.Background())
	if hits.Load() != n || s.Latest().Scrapes != before || s.Latest().Up {
		t.Fatalf("a step with no target scraped: %+v", s.Latest())
	}
}

func TestScraperConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more

	s := NewScraper(time.Hour, nil)
	s.SetTarget(url)
	s.scrapeOnce(context.Background())
	st := s.Latest()
	if st.Up || st.Failures != 1 || st.Scrapes != 1 || !strings.Contains(st.LastError, "GET "+url+"/metrics") {
		t.Fatalf("after a refused scrape: %+v", st)
	}
	s.client.CloseIdleConnections()
}

// TestScraperSendsTheAPIKey: every scrape carries vLLM's key (issue 23
// item 7: vLLM may protect more paths than /v1 soon).
func TestScraperSendsTheAPIKey(t *testing.T) {
	body, err := os.ReadFile(filepath.Join("testdata", "metrics_v0_old.txt"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk-7" {
			http.Error(w, `{"error":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		w.Write(body)
	}))
	defer srv.Close()
	s := NewScraper(10*time.Millisecond, nil)
	s.SetAPIKey("sk-7")
	if _, err := s.fetch(t.Context(), srv.URL+"/metrics"); err != nil {
		t.Fatalf("scrape with the key: %v", err)
	}
	s.client.CloseIdleConnections()
}
