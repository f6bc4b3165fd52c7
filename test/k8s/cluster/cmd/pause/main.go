// Command pause is the test cluster's sandbox ("pause") container: it holds
// a pod's namespaces open and does nothing else. As the pod's first process
// it also reaps the zombies of processes reparented to it, which is what the
// upstream pause image does; it is built here because the cluster reaches no
// image registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
