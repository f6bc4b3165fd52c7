package gpumon

import (
	"fmt"
	"strconv"
	"strings"
)

// deviceInfo is one GPU as NVML enumerates it.
type deviceInfo struct {
	Index int
	UUID  string
	Name  string
}

// parseVisibleDevices splits a CUDA_VISIBLE_DEVICES value the way CUDA reads
// it: comma-separated entries, spaces trimmed, and the list ends at the first
// entry CUDA would reject (empty, negative, or neither a number nor a UUID),
// because CUDA ignores everything after it. Duplicates are dropped.
func parseVisibleDevices(s string) []string {
	var out []string
	seen := map[string]bool{}
	for e := range strings.SplitSeq(s, ",") {
		e = strings.TrimSpace(e)
		if !validEntry(e) {
			break
		}
		if !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	return out
}

func validEntry(e string) bool {
	if e == "" {
		return false
	}
	if n, err := strconv.Atoi(e); err == nil {
		return n >= 0
	}
	return strings.HasPrefix(e, "GPU-") || strings.HasPrefix(e, "MIG-")
}

// matchEntry finds the device an entry names: an NVML index, a full UUID,
// or a unique UUID prefix such as "GPU-1234" (CUDA accepts those too).
func matchEntry(all []deviceInfo, e string) (deviceInfo, error) {
	if n, err := strconv.Atoi(e); err == nil {
		for _, d := range all {
			if d.Index == n {
				return d, nil
			}
		}
		return deviceInfo{}, fmt.Errorf("GPU index %d does not exist (NVML sees %d GPUs)", n, len(all))
	}
	if strings.HasPrefix(e, "MIG-") {
		return deviceInfo{}, fmt.Errorf("%q is a MIG instance; vllm-guard watches whole GPUs: name the parent GPU by index or UUID", e)
	}
	var hits []deviceInfo
	for _, d := range all {
		if d.UUID == e {
			return d, nil
		}
		if strings.HasPrefix(d.UUID, e) {
			hits = append(hits, d)
		}
	}
	switch len(hits) {
	case 1:
		return hits[0], nil
	case 0:
		return deviceInfo{}, fmt.Errorf("no GPU has UUID %q (run `vllm-guard gpus` to list them)", e)
	default:
		return deviceInfo{}, fmt.Errorf("UUID prefix %q matches %d GPUs: give more of the UUID", e, len(hits))
	}
}

// selectDevices picks the GPUs to watch: [gpu] devices when set, else the
// child's CUDA_VISIBLE_DEVICES, else all. A [gpu] devices entry that matches
// nothing is an error (the operator named a GPU that is not there); an
// unusable CUDA_VISIBLE_DEVICES falls back to all GPUs with a note, since the
// child's own CUDA will complain about it more precisely.
func selectDevices(all []deviceInfo, configured []string, cudaVisible string) (chosen []deviceInfo, note string, err error) {
	pick := func(entries []string, what string) ([]deviceInfo, error) {
		seen := map[int]bool{}
		var out []deviceInfo
		for _, e := range entries {
			d, err := matchEntry(all, e)
			if err != nil {
				return nil, fmt.Errorf("%s entry %q: %w", what, e, err)
			}
			if !seen[d.Index] {
				seen[d.Index] = true
				out = append(out, d)
			}
		}
		return out, nil
	}
	if len(configured) > 0 {
		entries := make([]string, 0, len(configured))
		for _, e := range configured {
			entries = append(entries, strings.TrimSpace(e))
		}
		out, err := pick(entries, "[gpu] devices")
		return out, "", err
	}
	if cudaVisible != "" {
		out, err := pick(parseVisibleDevices(cudaVisible), "CUDA_VISIBLE_DEVICES")
		switch {
		case err != nil:
			return all, fmt.Sprintf("watching all GPUs: %v", err), nil
		case len(out) == 0:
			return all, fmt.Sprintf("watching all GPUs: CUDA_VISIBLE_DEVICES=%q names none", cudaVisible), nil
		}
		return out, "", nil
	}
	return all, "", nil
}
