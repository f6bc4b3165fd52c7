package freeport

import (
	"net"
	"strconv"
	"testing"
)

// A port Pick returns can be listened on, and is a real port number.
func TestPickIsFree(t *testing.T) {
	port, err := Pick()
	if err != nil {
		t.Fatal(err)
	}
	if port <= 0 || port > 65535 {
		t.Fatalf("port %d", port)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("the picked port %d is not free: %v", port, err)
	}
	l.Close()
}
