package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/vllm-guard/vllm-guard/internal/status"
)

// RuntimeDirEnv overrides where `status --all` looks for sockets (tests,
// and hosts that put [control] socket elsewhere).
const RuntimeDirEnv = "VLLM_GUARD_RUNTIME_DIR"

// Instance is one guard `status --all` found: its socket, and its status
// document or why it did not answer.
type Instance struct {
	Name   string `json:"instance"` // the socket's file name less ".sock" (guard: the one with no instance)
	Socket string `json:"socket"`
	Status *Doc   `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`

	answered bool // a guard answered, but not with a document that reads
}

// findInstances asks every *.sock in dir for its status, concurrently,
// each bounded by requestTimeout; the result is sorted by name.
func findInstances(ctx context.Context, dir string) ([]Instance, error) {
	socks, err := filepath.Glob(filepath.Join(dir, "*.sock"))
	if err != nil {
		return nil, fmt.Errorf("list the sockets in %s: %w", dir, err)
	}
	slices.Sort(socks)
	out := make([]Instance, len(socks))
	var wg sync.WaitGroup
	for i, path := range socks {
		out[i] = Instance{Name: strings.TrimSuffix(filepath.Base(path), ".sock"), Socket: path}
		// Only sockets that are there: a symlink in the runtime folder
		// (made by whoever can write there) could lead to any socket on
		// the host, root's included. The client dials the socket it
		// opened, not the name (a swap after this look is not followed).
		if fi, err := os.Lstat(path); err != nil {
			out[i].Error = err.Error()
			continue
		} else if fi.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			out[i].Error = fmt.Sprintf("%s is a symlink (to %q), not a guard's socket: not followed", path, target)
			continue
		} else if fi.Mode()&os.ModeSocket == 0 {
			out[i].Error = fmt.Sprintf("%s is not a socket (%s)", path, fi.Mode().Type())
			continue
		}
		wg.Go(func() {
			c := newClient(path, true)
			defer c.CloseIdleConnections()
			rctx, cancel := context.WithTimeout(ctx, requestTimeout)
			defer cancel()
			d, err := c.Status(rctx)
			if err != nil {
				out[i].Error = err.Error()
				out[i].answered = !errors.Is(err, ErrNoGuard)
				return
			}
			out[i].Status = &d
		})
	}
	wg.Wait()
	return out, nil
}

// statusAll is `vllm-guard status --all`.
func statusAll(ctx context.Context, dir string, asJSON bool, stdout, stderr io.Writer) int {
	insts, err := findInstances(ctx, dir)
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard status --all: %v\n", err)
		return ExitNoGuard
	}
	if len(insts) == 0 {
		fmt.Fprintf(stderr, "vllm-guard status --all: no guard socket (*.sock) in %s: no guard runs on this host, or its sockets are elsewhere (--runtime-dir, $%s)\n", dir, RuntimeDirEnv)
		return ExitNoGuard
	}
	if asJSON {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		for i := range insts {
			if insts[i].Status != nil {
				r := Redacted(*insts[i].Status)
				insts[i].Status = &r
			}
		}
		if err := enc.Encode(insts); err != nil {
			fmt.Fprintf(stderr, "vllm-guard status --all: encode: %v\n", err)
			return ExitNotReady
		}
		stdout.Write(terminalSafeJSON(buf.Bytes()))
	} else {
		WriteInstances(stdout, insts)
	}
	return allCode(insts)
}

// allCode is --all's exit status: 0 when every instance is ready, 3 when
// none answers, else 1.
func allCode(insts []Instance) int {
	answered, ready := 0, 0
	for _, in := range insts {
		if in.answered {
			answered++
		}
		if in.Status == nil {
			continue
		}
		answered++
		if in.Status.Guard.State == status.StateReady {
			ready++
		}
	}
	switch {
	case answered == 0:
		return ExitNoGuard
	case ready == len(insts):
		return ExitReady
	default:
		return ExitNotReady
	}
}

// WriteInstances writes the --all table: instance, state, rung, GPUs
// used/total, last incident; a socket nobody answers on says why.
func WriteInstances(w io.Writer, insts []Instance) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tSTATE\tRUNG\tGPUS (used/total)\tLAST INCIDENT")
	for _, in := range insts {
		if in.Status == nil {
			what := "no answer"
			if in.answered {
				what = "bad answer"
			}
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t%s\n", clean(in.Name), what, clean(in.Error))
			continue
		}
		d := Bound(Redacted(*in.Status))
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", clean(in.Name), clean(string(d.Guard.State)), d.Guard.Rung.Index, gpusCell(d), lastIncidentCell(d))
	}
	tw.Flush()
}

func gpusCell(d Doc) string {
	if !d.GPU.Up {
		return "unavailable"
	}
	if len(d.GPU.Devices) == 0 {
		return "none watched"
	}
	var cells []string
	for _, dev := range d.GPU.Devices {
		cells = append(cells, fmt.Sprintf("%d: %.1f/%.1f GiB", dev.Index, float64(dev.Used)/(1<<30), float64(dev.Total)/(1<<30)))
	}
	return strings.Join(cells, ", ")
}

func lastIncidentCell(d Doc) string {
	inc := d.LastIncident
	if inc == nil {
		return "none"
	}
	return clean(fmt.Sprintf("%s %s (rung %d → %d)", stamp(d.Now, inc.Time), inc.Cause, inc.RungBefore.Index, inc.RungAfter.Index))
}
