package main

import (
	"bytes"
	"io"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/state"
)

// writeClean writes what write produces with every line cleaned for a
// terminal (state.Clean): the human views print strings from other
// processes (vLLM's lines, NVML's process command lines) that must not
// move the cursor, retitle the window or reorder the text.
func writeClean(w io.Writer, write func(io.Writer) error) error {
	var b bytes.Buffer
	err := write(&b)
	for _, l := range strings.SplitAfter(b.String(), "\n") {
		body, nl := strings.CutSuffix(l, "\n")
		io.WriteString(w, state.Clean(body))
		if nl {
			io.WriteString(w, "\n")
		}
	}
	return err
}
