package main

import (
	"net/http"
	"testing"
)

// As the pinned vLLM's uvicorn printed them (issue 32): from 127.0.0.1
// X-Forwarded-For's rightmost untrusted entry, port 0; from elsewhere the peer.
func TestUvicornClient(t *testing.T) {
	for _, tc := range []struct {
		remote string
		xff    []string
		want   string
	}{
		{"127.0.0.1:5000", nil, "127.0.0.1:5000"},
		{"127.0.0.1:5000", []string{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB, 127.0.0.1"},
			"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB:0"},
		{"127.0.0.1:5000", []string{"127.0.0.1"}, "127.0.0.1:0"},
		{"127.0.0.1:5000", []string{"10.0.0.1, 10.0.0.2", "127.0.0.1"}, "10.0.0.2:0"},
		{"10.9.9.9:5000", []string{"spoofed"}, "10.9.9.9:5000"},
	} {
		r := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := uvicornClient(r); got != tc.want {
			t.Errorf("uvicornClient(%s, %q) = %q; want %q", tc.remote, tc.xff, got, tc.want)
		}
	}
}
