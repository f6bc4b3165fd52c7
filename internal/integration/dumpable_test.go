package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Issue 41: the guard and the keeper hold vLLM's API keys (its command
// line, its environment) and were dumpable: a process of the same user
// (vLLM running a model's remote code) could ptrace them or read their
// /proc/PID/environ. They are now non-dumpable, which the kernel shows by
// making their /proc/PID files root's; vLLM, which the keeper execs, is
// dumpable again. The guard runs as uid 65534, as under systemd with
// User=, so that the ownership tells, and so that everything the guard
// reads of its own and its tree's /proc (the keeper's stat and children,
// vLLM's listener, load progress) is shown to work without root: vLLM
// becomes ready and stops cleanly.
func TestGuardAndKeeperAreNotDumpable(t *testing.T) {
	t.Parallel()
	const uid = 65534
	s := quick(newScene(t))
	s.noNVML = true
	// The user reaches the binaries and owns the scene's folder.
	for _, d := range []string{filepath.Dir(bins.guard), filepath.Dir(bins.fakevllm), filepath.Dir(s.dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := filepath.Walk(s.dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	}); err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(filepath.Dir(s.dir), "as-nobody.sh")
	script := "#!/bin/sh\nexec setpriv --reuid=" + strconv.Itoa(uid) + " --regid=" + strconv.Itoa(uid) + " --clear-groups " + bins.guard + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	s.guardBin = wrapper
	s.start()
	s.WaitEvent("ready, as uid 65534", 1, 60*time.Second, isReady)
	api := s.WaitEvent("the launch", 1, time.Second, isStarting).PID

	guardPID := s.Cmd.Process.Pid
	keepers := childrenOf(guardPID)
	if len(keepers) != 1 {
		t.Fatalf("the guard (pid %d) has children %v; want one, the keeper", guardPID, keepers)
	}
	keeper := keepers[0]
	if kids := childrenOf(keeper); len(kids) != 1 || kids[0] != api {
		t.Fatalf("the keeper (pid %d) has children %v; want vLLM's API server %d", keeper, kids, api)
	}
	for _, p := range []struct {
		what string
		pid  int
		want uint32 // the owner of /proc/PID/environ: root when non-dumpable
	}{{"the guard", guardPID, 0}, {"the keeper", keeper, 0}, {"vLLM's API server", api, uid}} {
		for _, f := range []string{"environ", "fd"} {
			var st syscall.Stat_t
			if err := syscall.Stat("/proc/"+strconv.Itoa(p.pid)+"/"+f, &st); err != nil {
				t.Fatal(err)
			}
			if euid := procUID(t, p.pid); euid != uid {
				t.Fatalf("%s runs as uid %d; want %d", p.what, euid, uid)
			}
			if st.Uid != p.want {
				t.Errorf("%s (uid %d): /proc/%d/%s belongs to uid %d; want %d (%s)", p.what, uid, p.pid, f, st.Uid, p.want,
					map[bool]string{true: "non-dumpable", false: "dumpable: execve resets the flag"}[p.want == 0])
			}
		}
	}
	s.Signal(syscall.SIGTERM)
	if code := s.WaitExit(30 * time.Second); code != 0 {
		t.Errorf("the guard run as uid %d exited %d on SIGTERM; want 0", uid, code)
	}
	s.waitNoProcesses(10 * time.Second)
}

// childrenOf is pid's children, from every thread's children file (the
// keeper is started from a locked thread).
func childrenOf(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, w := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(w); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// procUID is pid's effective uid, from /proc/PID/status.
func procUID(t *testing.T, pid int) uint32 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
			f := strings.Fields(rest)
			n, _ := strconv.Atoi(f[1])
			return uint32(n)
		}
	}
	t.Fatalf("/proc/%d/status has no Uid line", pid)
	return 0
}
