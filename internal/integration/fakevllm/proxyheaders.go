package main

import (
	"net"
	"net/http"
	"strings"
)

// uvicornClient is the client uvicorn prints in its access line. vLLM runs
// uvicorn with its proxy headers on and 127.0.0.1 trusted
// (forwarded_allow_ips): from 127.0.0.1 the client is X-Forwarded-For's
// rightmost untrusted entry (its leftmost when all are trusted), port 0,
// whatever text that entry holds; from anyone else, the peer.
func uvicornClient(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	xff := r.Header.Values("X-Forwarded-For")
	if err != nil || host != "127.0.0.1" || len(xff) == 0 {
		return r.RemoteAddr
	}
	var hosts []string
	for _, v := range xff {
		for _, h := range strings.Split(v, ",") {
			hosts = append(hosts, strings.TrimSpace(h))
		}
	}
	client := hosts[0]
	for i := len(hosts) - 1; i >= 0; i-- {
		if hosts[i] != "127.0.0.1" {
			client = hosts[i]
			break
		}
	}
	return client + ":0"
}
