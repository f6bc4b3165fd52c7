package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/control"
)

// Two guards on one host, as two instances of vllm-guard@.service would
// run: one GPU each (disjoint CUDA_VISIBLE_DEVICES over the same stand-in
// NVML state), their sockets side by side in one runtime folder. Each
// watches and attributes only its own GPU and vLLM, answers only for
// itself (a restart through one socket restarts that vLLM alone), and
// `status --all` lists both.
func TestTwoInstancesOnOneHost(t *testing.T) {
	t.Parallel()
	rt, err := os.MkdirTemp("", "vgi") // short: a socket path has 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rt) })

	a, b := newScene(t), newScene(t)
	b.gpuDir = a.gpuDir // one host: one NVML view
	const uuid0, uuid1 = "GPU-5e1f0000-0000-4000-8000-000000000001", "GPU-5e1f0000-0000-4000-8000-000000000002"
	a.writeDevices(uuid0+" 85899345920 536870912 NVIDIA H100 80GB HBM3", uuid1+" 85899345920 536870912 NVIDIA H100 80GB HBM3")
	for name, s := range map[string]*scene{"a": a, "b": b} {
		dev := map[string]string{"a": "0", "b": "1"}[name]
		s.env["CUDA_VISIBLE_DEVICES"] = dev
		s.extra = "\n[gpu]\nsample_interval = \"100ms\"\n"
		own := strconv.Quote(filepath.Join(s.dir, "guard.sock"))
		sock := strconv.Quote(filepath.Join(rt, name+".sock"))
		s.editConfig = func(text string) string { return strings.Replace(text, "socket = "+own, "socket = "+sock, 1) }
	}
	a.start("--instance", "a")
	b.start("--instance", "b")
	a.WaitEvent("a ready", 1, 60*time.Second, isReady)
	b.WaitEvent("b ready", 1, 60*time.Second, isReady)
	a.WaitLog("a's instance line", 1, 10*time.Second, func(m map[string]any) bool {
		return m["msg"] == "running as an instance" && m["instance"] == "a" && m["socket"] == filepath.Join(rt, "a.sock")
	})

	status := func(name string) control.Doc {
		t.Helper()
		out, err := exec.Command(bins.guard, "status", "--json", "--socket", filepath.Join(rt, name+".sock")).Output()
		if err != nil {
			t.Fatalf("status of %s: %v\n%s", name, err, out)
		}
		d, err := control.DecodeDoc(strings.NewReader(string(out)))
		if err != nil {
			t.Fatalf("status of %s: %v\n%s", name, err, out)
		}
		return d
	}
	// Each watches only its own GPU, and on it counts only its own tree:
	// read each guard's --watch stream until it has sampled its vLLM's
	// memory (one document a second; the bound is not a measurement).
	da, db := watchUntil(t, filepath.Join(rt, "a.sock"), 30*time.Second), watchUntil(t, filepath.Join(rt, "b.sock"), 30*time.Second)
	for _, c := range []struct {
		name     string
		d, other control.Doc
		index    int
		uuid     string
	}{{"a", da, db, 0, uuid0}, {"b", db, da, 1, uuid1}} {
		devs := c.d.GPU.Devices
		if len(devs) != 1 || devs[0].Index != c.index || devs[0].UUID != c.uuid {
			t.Fatalf("guard %s watches %+v, want only GPU %d (%s)", c.name, devs, c.index, c.uuid)
		}
		if c.d.Guard.PID == 0 || c.d.Guard.PID == c.other.Guard.PID {
			t.Fatalf("guard %s reports vLLM pid %d (the other's: %d)", c.name, c.d.Guard.PID, c.other.Guard.PID)
		}
		for _, p := range devs[0].Processes {
			if !p.Ours || !isTreeOf(p.PID, c.d.Guard.PID) {
				t.Errorf("guard %s lists pid %d (ours %v) on its GPU: only its own vLLM holds memory there", c.name, p.PID, p.Ours)
			}
			if p.Device != c.index {
				t.Errorf("guard %s lists pid %d on GPU %d, which it does not watch", c.name, p.PID, p.Device)
			}
			if p.PID == c.other.Guard.PID || (p.Ours && isTreeOf(p.PID, c.other.Guard.PID)) {
				t.Errorf("guard %s counts pid %d of the other instance's vLLM as its own", c.name, p.PID)
			}
		}
	}

	// status --all: both, one line each, exit 0 (both ready).
	all := exec.Command(bins.guard, "status", "--all", "--runtime-dir", rt)
	out, err := all.Output()
	if err != nil {
		t.Fatalf("status --all: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "a ") || !strings.HasPrefix(lines[2], "b ") ||
		!strings.Contains(lines[1], "ready") || !strings.Contains(lines[2], "ready") ||
		!strings.Contains(lines[1], "  0: ") || strings.Contains(lines[1], "1: ") ||
		!strings.Contains(lines[2], "  1: ") || strings.Contains(lines[2], "0: ") {
		t.Fatalf("status --all:\n%s", out)
	}

	// A restart through a's socket restarts a's vLLM only.
	if out, err := exec.Command(bins.guard, "restart", "--socket", filepath.Join(rt, "a.sock")).CombinedOutput(); err != nil {
		t.Fatalf("restart a: %v\n%s", err, out)
	}
	a.WaitEvent("a ready again", 2, 60*time.Second, isReady)
	if n := b.CountEvents(isStarting); n != 1 {
		t.Fatalf("a restart of a started b's vLLM too (%d starts)", n)
	}
	if d := status("b"); d.Guard.PID != db.Guard.PID {
		t.Fatalf("b's vLLM changed (pid %d → %d) after a restart of a", db.Guard.PID, d.Guard.PID)
	}

	// b stops cleanly and removes its socket: --all lists a alone.
	b.stopCleanly(30*time.Second, 30*time.Second)
	out, _ = exec.Command(bins.guard, "status", "--all", "--runtime-dir", rt).Output()
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "a ") {
		t.Fatalf("status --all after b stopped:\n%s", out)
	}
}

// watchUntil reads `status --watch --json` on sock until a document
// attributes memory on a GPU to the guard's own vLLM, and returns it.
func watchUntil(t *testing.T, sock string, timeout time.Duration) control.Doc {
	t.Helper()
	cmd := exec.Command(bins.guard, "status", "--watch", "--json", "--socket", sock)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	timer := time.AfterFunc(timeout, func() { cmd.Process.Kill() })
	defer timer.Stop()
	dec := json.NewDecoder(stdout)
	var last control.Doc
	for {
		var d control.Doc
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("status --watch on %s ended (%v) before the guard attributed its vLLM's memory; last: %+v", sock, err, last.GPU)
		}
		if oursOn(d) > 0 {
			return d
		}
		last = d
	}
}

// oursOn is how many processes the document attributes to its own vLLM.
func oursOn(d control.Doc) int {
	n := 0
	for _, dev := range d.GPU.Devices {
		for _, p := range dev.Processes {
			if p.Ours {
				n++
			}
		}
	}
	return n
}

// isTreeOf says whether pid is root or one of its descendants.
func isTreeOf(pid, root int) bool {
	for i := 0; pid > 1 && i < 64; i++ {
		if pid == root {
			return true
		}
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		s := string(st)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 {
			return false
		}
		pid, _ = strconv.Atoi(f[1])
	}
	return false
}
