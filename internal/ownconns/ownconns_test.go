package ownconns

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func TestRecordsOwnPortsOnly(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	s := New()
	clock := time.Unix(1000, 0)
	s.now = func() time.Time { return clock }
	dial := s.Dial(&net.Dialer{})
	ours, err := dial(context.Background(), "tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := net.Dial("tcp", l.Addr().String()) // a client, not dialled through the set
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()
	for range 2 {
		c := <-accepted
		defer c.Close()
	}
	port := ours.LocalAddr().(*net.TCPAddr).Port
	if !s.Has("127.0.0.1", port) {
		t.Fatal("own open connection not recognised")
	}
	if s.Has("127.0.0.1", theirs.LocalAddr().(*net.TCPAddr).Port) {
		t.Fatal("a client's connection taken for the guard's")
	}
	if s.Has("10.1.2.3", port) {
		t.Fatal("another host with the same port taken for the guard's")
	}
	ours.Close()
	if !s.Has("127.0.0.1", port) {
		t.Fatal("a just-closed connection must still be recognised (its access line may come later)")
	}
	clock = clock.Add(Linger + time.Second)
	if s.Has("127.0.0.1", port) {
		t.Fatal("a connection closed long ago is still recognised")
	}
	var nilSet *Set
	if nilSet.Has("127.0.0.1", port) {
		t.Fatal("nil set")
	}
}
