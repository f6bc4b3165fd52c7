package supervisor

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/policy"
)

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
	tree := func() []int { return []int{os.Getpid()} }
	sup.tree.Store(&tree)
	c, err := dial(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatalf("the running tree's listener: %v", err)
	}
	c.Close()
}
