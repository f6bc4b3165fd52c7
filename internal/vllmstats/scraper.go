package vllmstats

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Scraper polls vLLM's /metrics while vLLM is ready and keeps the latest
// reading. Its methods are safe from any goroutine.
type Scraper struct {
	interval time.Duration
	log      *zap.Logger
	client   *http.Client
	wake     chan struct{}          // a new target: scrape now, not at the next tick
	key      atomic.Pointer[string] // vLLM's API key, sent as a Bearer token ("" or nil: none)

	mu      sync.Mutex
	target  string // guarded by mu; "" = vLLM not ready
	stats   Stats  // guarded by mu
	failing bool   // guarded by mu: inside a failure episode (logged once)
}

// NewScraper returns a Scraper that scrapes every interval (1s when ≤ 0).
func NewScraper(interval time.Duration, log *zap.Logger) *Scraper {
	if interval <= 0 {
		interval = time.Second
	}
	if log == nil {
		log = zap.NewNop()
	}
	// A scrape must finish before the next one is due, and never hold on
	// a wedged vLLM longer than a few seconds.
	timeout := min(max(interval, time.Second), 5*time.Second)
	return &Scraper{
		interval: interval,
		log:      log,
		client:   &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConns: 1, IdleConnTimeout: 30 * time.Second}},
		wake:     make(chan struct{}, 1),
	}
}

// Dial makes the scraper connect through dial (the guard records its own
// connections to vLLM with it). Call it before Run.
func (s *Scraper) Dial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	if tr, ok := s.client.Transport.(*http.Transport); ok {
		tr.DialContext = dial
	}
}

// SetAPIKey makes every scrape carry vLLM's API key as a Bearer token:
// /metrics is open today, but vLLM may protect more than /v1 soon, and a
// key vLLM does not need is harmless. "" sends none.
func (s *Scraper) SetAPIKey(key string) { s.key.Store(&key) }

// SetTarget sets vLLM's base URL ("http://127.0.0.1:8000") once it is
// ready, or "" when it is not: then nothing is scraped and Stats.Up is
// false. The last values are kept so the status still shows them.
func (s *Scraper) SetTarget(baseURL string) {
	baseURL = strings.TrimRight(baseURL, "/")
	s.mu.Lock()
	changed := s.target != baseURL
	s.target = baseURL
	if baseURL == "" {
		s.stats.Up = false
	}
	s.mu.Unlock()
	if changed && baseURL != "" {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// Latest returns the latest reading.
func (s *Scraper) Latest() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Run scrapes every interval while a target is set, until ctx ends.
func (s *Scraper) Run(ctx context.Context) {
	defer s.client.CloseIdleConnections()
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.wake:
		}
		s.scrapeOnce(ctx)
	}
}

// scrapeOnce is one step of Run: scrape the current target, if any, and
// record the outcome.
func (s *Scraper) scrapeOnce(ctx context.Context) {
	s.mu.Lock()
	target := s.target
	s.mu.Unlock()
	if target == "" {
		return
	}
	asked := time.Now()
	st, err := s.fetch(ctx, target+"/metrics")
	if ctx.Err() != nil {
		return // shutting down: not a failure of vLLM
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.target != target {
		return // vLLM went away or moved while we were scraping
	}
	s.stats.Scrapes++
	if err != nil {
		s.stats.Failures++
		s.stats.Up = false
		s.stats.LastError = err.Error()
		if !s.failing {
			s.failing = true
			s.log.Warn("cannot scrape vLLM metrics; status and metrics show the last values until it works again",
				zap.String("url", target+"/metrics"), zap.Error(err))
		}
		return
	}
	if s.failing {
		s.failing = false
		s.log.Info("vLLM metrics scrape works again", zap.String("url", target+"/metrics"),
			zap.Uint64("failures", s.stats.Failures))
	}
	st.Up = true
	st.ScrapedAt, st.AskedAt = time.Now(), asked
	st.Scrapes, st.Failures, st.LastError = s.stats.Scrapes, s.stats.Failures, ""
	s.stats = st
}

func (s *Scraper) fetch(ctx context.Context, url string) (Stats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Stats{}, fmt.Errorf("vllmstats: bad metrics URL %q: %w", url, err)
	}
	if k := s.key.Load(); k != nil && *k != "" {
		req.Header.Set("Authorization", "Bearer "+*k)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return Stats{}, fmt.Errorf("vllmstats: GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return Stats{}, fmt.Errorf("vllmstats: GET %s: HTTP %d", url, resp.StatusCode)
	}
	return Parse(resp.Body)
}
