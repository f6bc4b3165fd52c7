package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Item 9: `run --events FIFO` with nobody reading the FIFO: the guard does
// not wait in open() (where SIGTERM would not be handled); it says so and
// exits 1.
func TestHostileEventsFIFOWithoutAReaderDoesNotHang(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	fifo := filepath.Join(s.dir, "events.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	s.start("--events", fifo)
	if code := s.WaitExit(60 * time.Second); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	s.WaitLog("the error naming the FIFO", 1, time.Second, func(m map[string]any) bool {
		e, _ := m["error"].(string)
		return strings.Contains(e, fifo) && strings.Contains(e, "nobody reads")
	})
}

// Item 9: `run --events LINK`: the symlink is not followed, its target is
// left alone, and the guard says why it does not start.
func TestHostileEventsSymlinkIsNotFollowed(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	victim := filepath.Join(s.dir, "victim")
	os.WriteFile(victim, []byte("keep\n"), 0o600)
	link := filepath.Join(s.dir, "events.jsonl")
	os.Symlink(victim, link)
	s.start("--events", link)
	if code := s.WaitExit(60 * time.Second); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	s.WaitLog("the error naming the symlink", 1, time.Second, func(m map[string]any) bool {
		e, _ := m["error"].(string)
		return strings.Contains(e, link) && strings.Contains(e, "is a symlink")
	})
	if b, _ := os.ReadFile(victim); string(b) != "keep\n" {
		t.Errorf("the symlink's target was written: %q", b)
	}
}

// Item 9: the FIFO's reader stopped reading (its pipe is full): the guard
// still serves, and SIGTERM still stops it with exit 0; the events that
// did not fit are dropped, not waited for.
func TestHostileEventsFIFOWhoseReaderStoppedStillStops(t *testing.T) {
	t.Parallel()
	s := quick(newScene(t))
	fifo := filepath.Join(s.dir, "events.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// A reader that never reads, and the smallest pipe, filled up.
	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fill, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := fill.SyscallConn()
	raw.Control(func(fd uintptr) {
		unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 4096)
		for {
			if _, err := unix.Write(int(fd), make([]byte, 4096)); err != nil {
				return
			}
		}
	})
	fill.Close()

	s.start("--events", fifo)
	s.WaitLog("vLLM ready", 1, 60*time.Second, msg("vLLM ready"))
	s.stopCleanly(60*time.Second, 10*time.Second)
}
