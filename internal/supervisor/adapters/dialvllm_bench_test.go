package adapters

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// The price of DialVLLM's check (VLLMOnly: sock_diag, then the tree's
// descriptors) per NEW connection to vLLM, beside a plain loopback dial.
// The proxy keeps its connections alive and reuses them, so a request on
// a kept connection pays nothing; extraFDs stands for the descriptors a
// real vLLM holds (its tree's /proc/<pid>/fd is read until the socket is
// found).
func BenchmarkDialVLLMNewConnection(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	plain := (&net.Dialer{}).DialContext
	tree := func() []int { return []int{os.Getpid()} }
	for _, extraFDs := range []int{0, 500} {
		var files []*os.File
		for range extraFDs {
			f, err := os.Open(os.DevNull)
			if err != nil {
				b.Fatal(err)
			}
			files = append(files, f)
		}
		for _, c := range []struct {
			name string
			dial DialFunc
		}{{"plain", plain}, {"vllm-only", VLLMOnly(plain, tree)}} {
			b.Run(fmt.Sprintf("%s/extra-fds-%d", c.name, extraFDs), func(b *testing.B) {
				for b.Loop() {
					conn, err := c.dial(context.Background(), "tcp", addr)
					if err != nil {
						b.Fatal(err)
					}
					conn.Close()
				}
			})
		}
		for _, f := range files {
			f.Close()
		}
	}
}
