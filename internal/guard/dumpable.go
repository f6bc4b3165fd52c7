package guard

import "golang.org/x/sys/unix"

// NonDumpable marks the guard's process non-dumpable while it holds vLLM's
// API keys and the alerts' credentials (in its config, vLLM's command line
// and environment): no core dump of it is written, and no process of the
// same user (vLLM running a model's remote code, say) can ptrace it or read
// its /proc/PID/environ, mem or fd (they become root's). The guard reads
// only its own /proc/self and its children's /proc, which stay readable:
// vLLM becomes dumpable again when the keeper execs it. The keeper marks
// itself the same way (internal/proctree).
func NonDumpable() error { return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) }
