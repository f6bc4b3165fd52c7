// Package procmark finds the processes that carry a mark in their
// environment ("NAME=value"): how the tests, the soak and the benchmarks
// find every process of a vLLM tree they started, wherever the kernel
// reparented it.
package procmark

import (
	"bytes"
	"os"
	"strconv"
)

// Live lists the live (not zombie) processes whose environment holds entry
// exactly, as one "NAME=value" of it.
func Live(entry string) []int {
	want := []byte("\x00" + entry + "\x00")
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(append([]byte{0}, env...), want) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if i := bytes.LastIndexByte(st, ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				continue
			}
		}
		out = append(out, pid)
	}
	return out
}
