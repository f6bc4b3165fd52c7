package state

import "github.com/vllm-guard/vllm-guard/internal/config"

// checkDir refuses a state folder that is a symlink, not a folder, or
// another user's (the rule is config's, shared with `check` and the
// guard's start): Open would otherwise create, tighten and write through
// it, for the guard and for `incidents` and `diagnose` alike.
func checkDir(dir string) error { return config.CheckStateDirPath(dir) }
