package alerts

import "github.com/vllm-guard/vllm-guard/internal/proctree"

// killTree kills the alert command and every descendant of it, those that
// left its group or session (setsid) included, and waits until they are
// gone; it returns the PIDs still alive after the last round. It is the
// tree kill that empties vLLM's tree (internal/proctree: stop, walk until
// stable, SIGKILL through pidfds, in bounded rounds), from the command's
// process down.
//
// A descendant whose parent exited before the kill was reparented away from
// the command (to init or a subreaper) and is out of its reach.
func killTree(root int) []int { return proctree.KillTree(root) }
