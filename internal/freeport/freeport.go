// Package freeport finds a TCP port nobody listens on right now, for the
// tests, the soak and the benchmarks that start a guard, a simulator or a
// proxy on a port of their own. It is the one such helper (tests reach it
// through testkit.FreePort); a port it returns may be taken by another
// process before it is used, which is why the guard and the simulator say
// plainly when their port is in use.
package freeport

import (
	"fmt"
	"net"
)

// Pick returns a TCP port on 127.0.0.1 that was free a moment ago: the
// kernel's choice for a listener that is closed at once.
func Pick() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free TCP port on 127.0.0.1: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
