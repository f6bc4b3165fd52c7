package config

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// CheckStateDir refuses a [control] state_dir the guard must not use: a
// symlink (the guard would follow it, tighten its target's mode, and write
// and prune records there: whoever can change the link chooses the
// folder), something that is not a folder, or a folder another user owns
// (its owner could swap the saved rung and read vLLM's lines in the
// incident records). A folder that does not exist yet is fine: the guard
// creates it, 0750; one it cannot reach it does without (internal/state). It only reads: `vllm-guard check` calls it as well as
// the guard's start.
func (c *Config) CheckStateDir() error {
	return checkStateDir(c.Path, c.Control.StateDir, os.Geteuid())
}

// CheckStateDirPath is CheckStateDir for a folder given without its config
// file: internal/state refuses such a folder for every reader too
// (`incidents` and `diagnose` without a guard), before it creates or
// tightens anything.
func CheckStateDirPath(dir string) error { return checkStateDir("", dir, os.Geteuid()) }

func checkStateDir(file, dir string, euid int) error {
	bad := func(msg string, a ...any) error {
		return &Error{File: file, Key: "[control] state_dir", Msg: fmt.Sprintf(msg, a...)}
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		// Missing: the guard creates it. Unreachable (a file in its path,
		// no permission): the guard runs without persistence and says so.
		return nil
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ := filepath.EvalSymlinks(dir)
		if target == "" {
			target, _ = os.Readlink(dir)
		}
		return bad("%s is a symlink (to %s); the guard does not follow one (whoever can change the link would choose where the guard writes and whose mode it tightens): set state_dir to the real folder (%s), or replace the link with a folder (mode 0750)", dir, target, target)
	}
	if !fi.IsDir() {
		return bad("%s is not a folder (%s); remove it (the guard creates the folder) or set state_dir to another path", dir, fi.Mode().Type())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return bad("cannot tell who owns %s", dir)
	}
	if int(st.Uid) != euid && st.Uid != 0 {
		return bad("%s belongs to uid %d, not to the guard's user (uid %d) or root: its owner could change the saved rung and read the incident records; chown it to the guard's user (chown -R %d %s), or set state_dir to a folder of the guard's", dir, st.Uid, euid, euid, dir)
	}
	return nil
}
