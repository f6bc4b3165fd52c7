package proctree

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vllm-guard/vllm-guard/internal/procmark"
)

// readyWriter is an output sink that closes seen once a line equal to want
// has been written (an event to wait on, instead of polling).
type readyWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
}

func newReadyWriter(want string) *readyWriter {
	return &readyWriter{want: want + "\n", seen: make(chan struct{})}
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	select {
	case <-w.seen:
	default:
		if strings.Contains(w.buf.String(), w.want) {
			close(w.seen)
		}
	}
	return len(p), nil
}

func (w *readyWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// marked lists the live processes whose environment holds mark: the tree's
// processes, wherever they were reparented.
func marked(mark string) []string {
	var out []string
	for _, pid := range procmark.Live(mark) {
		info, _ := readStat(pid)
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		out = append(out, fmt.Sprintf("%d(ppid %d): %s", pid, info.ppid, strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	return out
}

// spawnerScript is a "vLLM" that ignores SIGTERM and keeps starting
// processes that leave its session (setsid), each of which keeps starting
// children of its own; it prints "ready" once five are out.
const spawnerScript = `trap '' TERM
i=0
while :; do
	setsid sh -c 'trap "" TERM; while :; do sleep 1000 & sleep 0.005; done' &
	i=$((i+1))
	[ "$i" = 5 ] && echo ready
	sleep 0.02
done`

func startSpawner(t *testing.T) (*Child, string) {
	t.Helper()
	mark := fmt.Sprintf("VLLM_GUARD_TREE_TEST=%s-%d", t.Name(), time.Now().UnixNano())
	out := newReadyWriter("ready")
	c, err := Start(Spec{Keeper: testKeeper(t), Argv: []string{"sh", "-c", spawnerScript},
		Env: append(os.Environ(), mark), Grace: 100 * time.Millisecond, Stdout: out, Stderr: out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever a failed test left: by the mark, never by name.
		for range 3 {
			for _, l := range marked(mark) {
				pid, _ := strconv.Atoi(strings.SplitN(l, "(", 2)[0])
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		select {
		case <-c.doneC:
		case <-time.After(30 * time.Second):
		}
	})
	select {
	case <-out.seen:
	case <-c.doneC:
		t.Fatalf("the spawner ended before it was ready: %q", out.String())
	case <-time.After(30 * time.Second):
		t.Fatal("the spawner did not start five setsid children")
	}
	return c, mark
}

func waitDone(t *testing.T, c *Child) {
	t.Helper()
	select {
	case <-c.doneC:
	case <-time.After(60 * time.Second):
		t.Fatal("the keeper did not exit")
	}
}

// Issue 15 item 4: a stop that comes to the kill (SIGTERM ignored) leaves
// nothing of a tree that keeps escaping its session. On the old code the
// guard SIGKILLed the group, keeper included, after one snapshot: what was
// forked after the snapshot went to init and lived on.
func TestKillEmptiesATreeThatKeepsCallingSetsid(t *testing.T) {
	c, mark := startSpawner(t)
	c.Stop()
	c.Kill()
	waitDone(t, c)
	// The keeper exits only once the tree is empty: nothing to wait for.
	if left := marked(mark); len(left) != 0 {
		t.Fatalf("%d processes of the tree survived the kill: %v", len(left), left)
	}
	if e := c.Exit(); e.Signal != "SIGKILL" || len(e.Survivors) != 0 {
		t.Fatalf("exit %+v, want the API server killed by SIGKILL and no survivors", e)
	}
	if left, _ := c.KillLeftovers(); len(left) != 0 {
		t.Fatalf("leftovers %v after the keeper emptied the tree", left)
	}
}

// The same tree when the guard dies: the kernel sends the keeper its
// parent-death signal, and the keeper alone must empty the tree.
func TestKeeperEmptiesTheTreeWhenTheGuardDies(t *testing.T) {
	c, mark := startSpawner(t)
	c.signalKeeper(keeperDeathSignal)
	waitDone(t, c)
	if left := marked(mark); len(left) != 0 {
		t.Fatalf("%d processes of the tree survived the guard's death: %v", len(left), left)
	}
}

// A keeper that cannot do its work (stopped here) must not keep the tree
// alive: after keeperKillWait the guard kills everything below the keeper
// while the keeper is still there to take the orphans of setsid back, and
// the keeper last. Killing the keeper first (the old fallback) sent what
// the walk had not reached yet to init.
func TestAStoppedKeepersTreeIsKilledBelowItFirst(t *testing.T) {
	c, mark := startSpawner(t)
	c.signalKeeper(syscall.SIGSTOP)
	c.backstopAfter = 100 * time.Millisecond
	c.Stop()
	c.Kill()
	waitDone(t, c)
	if left := marked(mark); len(left) != 0 {
		t.Fatalf("%d processes of the tree outlived a stopped keeper: %v", len(left), left)
	}
}

// Issue 15 item 11: vLLM starts with /dev/null on fd 0, not a closed fd 0.
func TestVLLMGetsDevNullOnStdin(t *testing.T) {
	var out bytes.Buffer
	c, err := Start(Spec{Keeper: testKeeper(t), Argv: []string{"readlink", "/proc/self/fd/0"}, Env: os.Environ(),
		Grace: time.Second, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, c)
	if got := strings.TrimSpace(out.String()); got != "/dev/null" || c.Exit().Code != 0 {
		t.Fatalf("fd 0 of vLLM: %q (exit %+v), want /dev/null", got, c.Exit())
	}
}

// sleeper starts an unrelated process (never in any tree of ours).
func sleeper(t *testing.T) (*exec.Cmd, procInfo) {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	info, ok := readStat(cmd.Process.Pid)
	if !ok {
		t.Fatal("no /proc/PID/stat for the sleeper")
	}
	return cmd, info
}

// Issue 15 item 2: a PID the tree once had, now held by an unrelated
// process (same PID, another start time), is never signalled: not by the
// release wait (killIfOurs), not by the cleanup after the keeper
// (killLeftovers, from the PIDs seen and from the keeper's survivors
// report), not by the pidfd helper itself.
func TestAReusedPIDIsNeverSignalled(t *testing.T) {
	cmd, info := sleeper(t)
	pid := cmd.Process.Pid
	reused := procID{pid: pid, start: info.start + 1} // what the tree had under this PID
	c := &Child{doneC: make(chan struct{}), apiGoneC: make(chan struct{})}
	c.seenPIDs.start = map[int]uint64{pid: reused.start}
	c.seenPIDs.order = []int{pid}
	c.exit.Survivors = []procID{reused}

	if c.KillIfOurs(pid) {
		t.Fatal("killIfOurs signalled a reused PID")
	}
	if left, _ := c.KillLeftovers(); len(left) != 0 {
		t.Fatalf("killLeftovers took the reused PID %v for a survivor", left)
	}
	if signalProc(reused, syscall.SIGKILL) {
		t.Fatal("signalProc signalled a reused PID")
	}
	if left := killTree(func() []int { return nil }, nil); left != nil {
		t.Fatalf("killTree of nothing: %v", left)
	}
	if p, ok := readStat(pid); !ok || p.state == 'Z' || p.start != info.start {
		t.Fatal("the unrelated process was killed")
	}
	// The control: under its true start time the same process is ours.
	c.seenPIDs.start[pid] = info.start
	if !c.KillIfOurs(pid) {
		t.Fatal("killIfOurs did not kill the very process seen")
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the process seen ended with %v, want SIGKILL", err)
	}
}

// The PIDs remembered per run are capped: at the cap, the entries of
// processes gone are dropped, oldest first; when every entry is alive, a
// new process is not remembered (and counted).
func TestTreeSeenIsCapped(t *testing.T) {
	var ts treeSeen
	ts.start = map[int]uint64{}
	// seenCap entries of processes that cannot exist (above the largest pid_max).
	for i := range seenCap {
		p := 1<<23 + i
		ts.start[p] = 1
		ts.order = append(ts.order, p)
	}
	_, info := sleeper(t)
	ts.add([]int{info.pid})
	if !ts.same(info.pid) || len(ts.start) != 1 || len(ts.order) != 1 || ts.dropped != 0 {
		t.Fatalf("after the cap: %d entries (%d in order), dropped %d; want the dead dropped and the live one kept",
			len(ts.start), len(ts.order), ts.dropped)
	}

	// Every entry alive at the cap: the newcomer is not remembered.
	full := treeSeen{limit: 1}
	full.add([]int{os.Getpid()})
	full.add([]int{info.pid})
	if full.same(info.pid) || !full.same(os.Getpid()) || full.dropped != 1 {
		t.Fatalf("full of live entries: %v, dropped %d", full.pids(), full.dropped)
	}
}

// Issue 32 item 6: a process of the tree dies while the walk reads it (the
// API server ending by itself as the guard dies) and its child is handed
// to the keeper after the roots were read. The pass that found the death
// and stopped nothing new ended the walk: the tree was called empty and
// the child (the EngineCore) lived on. Here the shell A is dead (a zombie)
// when the walk reaches it, and the roots the walk reads first are from
// before A's child E was handed over; later reads name E, as the keeper's
// children do once A has died.
func TestKillTreeFindsAChildHandedOverDuringTheWalk(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 300 & echo $!")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	var line string
	if _, err := fmt.Fscanln(out, &line); err != nil {
		t.Fatal(err)
	}
	e, err := strconv.Atoi(line)
	if err != nil {
		t.Fatalf("sleep's pid %q: %v", line, err)
	}
	defer syscall.Kill(e, syscall.SIGKILL)
	a := cmd.Process.Pid
	// A has exited and stays a zombie: waited for without being reaped.
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, a, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	if !alive(e) {
		t.Fatal("sleep is not running")
	}
	reads := 0
	roots := func() []int {
		reads++
		if reads == 1 {
			return []int{a} // read just before A died
		}
		return []int{a, e} // the keeper's children since
	}
	if left := killTree(roots, nil); len(left) != 0 {
		t.Fatalf("killTree left %v", left)
	}
	if alive(e) {
		t.Fatalf("the child handed over during the walk (pid %d) is still alive after killTree (roots read %d times)", e, reads)
	}
}
