package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

// A request counts as awaiting from the moment it is sent to vLLM until the
// first byte of its answer's body: the headers of a stream are not an
// answer (vLLM sends them before its first engine step), the first event is.
func TestAwaitingCountsRequestsUntilTheirFirstByte(t *testing.T) {
	arrived, sendHeaders, sendByte := make(chan struct{}), make(chan struct{}), make(chan struct{})
	r := newRig(t, proxyConfig(), 4, func(w http.ResponseWriter, req *http.Request) {
		close(arrived)
		<-sendHeaders
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-sendByte
		w.Write([]byte("data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: [DONE]\n\n"))
	})
	if n, _ := r.p.Awaiting(); n != 0 {
		t.Fatalf("%d awaiting before any request", n)
	}
	prompt := strings.Repeat("abcd", 1000) // about 1000 tokens
	type reply struct {
		resp *http.Response
		err  error
	}
	got := make(chan reply, 1)
	go func() {
		resp, err := r.client.Post(r.front.URL+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"prompt":"`+prompt+`"}`))
		got <- reply{resp, err}
	}()
	<-arrived
	if n, largest := r.p.Awaiting(); n != 1 || largest < 900 || largest > 1100 {
		t.Fatalf("sent upstream: awaiting %d, largest prompt %v; want 1 and about 1000", n, largest)
	}
	close(sendHeaders)
	rp := <-got
	if rp.err != nil {
		t.Fatal(rp.err)
	}
	defer rp.resp.Body.Close()
	if n, _ := r.p.Awaiting(); n != 1 {
		t.Fatalf("the stream's headers ended the wait: awaiting %d, want 1", n)
	}
	close(sendByte)
	if _, err := bufio.NewReader(rp.resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if n, _ := r.p.Awaiting(); n != 0 {
		t.Fatalf("after the first byte: awaiting %d, want 0", n)
	}
}

// A request vLLM never answers leaves the count when the client gives up.
func TestAwaitingEndsWhenTheClientLeaves(t *testing.T) {
	arrived := make(chan struct{})
	r := newRig(t, proxyConfig(), 4, func(w http.ResponseWriter, req *http.Request) {
		io.Copy(io.Discard, req.Body) // so the server notices the proxy hang up
		close(arrived)
		<-req.Context().Done()
	})
	req, _ := http.NewRequest(http.MethodPost, r.front.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(done)
		resp, err := r.client.Do(req.WithContext(ctx))
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-arrived
	if n, _ := r.p.Awaiting(); n != 1 {
		t.Fatalf("awaiting %d, want 1", n)
	}
	cancel()
	<-done
	testkit.WaitFor(t, "the abandoned request to leave the count", 30*time.Second, func() bool { n, _ := r.p.Awaiting(); return n == 0 })
}
