package events

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"
)

// fullDisk fails the writes whose number (from 1) it lists with ENOSPC,
// the first of them after writing part of the line, as a filling disk
// does.
type fullDisk struct {
	out   bytes.Buffer
	n     int
	fails map[int]bool
	cut   bool
}

func (d *fullDisk) Write(p []byte) (int, error) {
	d.n++
	if d.fails[d.n] {
		if !d.cut {
			d.cut = true
			d.out.Write(p[:len(p)/2])
			return len(p) / 2, syscall.ENOSPC
		}
		return 0, syscall.ENOSPC
	}
	return d.out.Write(p)
}

// A full disk loses the events written while it is full, says so once,
// and the stream goes on, whole lines only, once space is back.
func TestJSONLinesRecoversAfterAFullDisk(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	d := &fullDisk{fails: map[int]bool{2: true, 3: true}}
	j := NewJSONLines(d, zap.New(core))
	for i := 1; i <= 5; i++ {
		j.Put(Event{Seq: uint64(i), Kind: KindState})
	}
	j.Close()

	var seqs []uint64
	sc := bufio.NewScanner(&d.out)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue // the line the disk cut
		}
		seqs = append(seqs, e.Seq)
	}
	if len(seqs) != 3 || seqs[0] != 1 || seqs[1] != 4 || seqs[2] != 5 {
		t.Errorf("events written: %v; want 1, 4 and 5 (2 and 3 lost to the full disk), each on a line of its own:\n%s", seqs, d.out.String())
	}
	failed := logs.FilterMessageSnippet("writing the events file failed").All()
	again := logs.FilterMessageSnippet("writing the events file works again").All()
	if len(failed) != 1 || !strings.Contains(failed[0].ContextMap()["error"].(string), "no space left") {
		t.Errorf("failure logged %d times (%v); want once, with the error", len(failed), failed)
	}
	if len(again) != 1 || again[0].ContextMap()["events_lost"] != uint64(2) {
		t.Errorf("recovery logged: %v; want once, with events_lost 2", again)
	}
}

// A symlink is not followed: the file it points to is left alone.
func TestOpenFileRefusesASymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	os.WriteFile(victim, []byte("keep\n"), 0o644)
	link := filepath.Join(dir, "events.jsonl")
	os.Symlink(victim, link)
	f, err := OpenFile(link)
	if err == nil {
		f.Close()
		t.Fatal("opened through a symlink")
	}
	if !strings.Contains(err.Error(), "is a symlink") || !strings.Contains(err.Error(), link) {
		t.Errorf("error %v; want it to name %s as a symlink", err, link)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep\n" {
		t.Errorf("the symlink's target was changed: %q", b)
	}
}

// A FIFO nobody reads is refused at once, not waited on (the guard would
// hang before it handles SIGTERM); one with a reader is written to.
func TestOpenFileDoesNotBlockOnAFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "events.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	opened := make(chan error, 1)
	go func() {
		f, err := OpenFile(fifo)
		if err == nil {
			f.Close()
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		if err == nil || !strings.Contains(err.Error(), "nobody reads") {
			t.Fatalf("a FIFO without a reader: %v; want refused, saying nobody reads it", err)
		}
	case <-time.After(30 * time.Second): // a bound for the failure only: the open must not block at all
		t.Fatal("OpenFile blocked on a FIFO without a reader")
	}

	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := OpenFile(fifo)
	if err != nil {
		t.Fatalf("a FIFO with a reader: %v", err)
	}
	j := NewJSONLines(f, nil)
	j.Put(Event{Seq: 7, Kind: KindReady})
	j.Close()
	f.Close()
	r.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || !strings.Contains(line, `"seq":7`) {
		t.Errorf("read %q, %v; want the event", line, err)
	}
}

// A reader that stopped reading (its pipe full) does not hold up Close:
// the guard's exit after SIGTERM waits at most closeTimeout for it.
func TestJSONLinesCloseIsBoundedOnAStalledReader(t *testing.T) {
	old := closeTimeout
	closeTimeout = 50 * time.Millisecond
	defer func() { closeTimeout = old }()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	// The smallest pipe, filled up: the next write would wait for ever.
	// (Through the raw descriptor: w.Fd() would make it blocking.)
	raw, _ := w.SyscallConn()
	raw.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 4096) })
	raw.Write(func(fd uintptr) bool {
		for {
			if _, err := unix.Write(int(fd), make([]byte, 4096)); err != nil {
				return true
			}
		}
	})
	j := NewJSONLines(w, nil)
	j.Put(Event{Seq: 1, Kind: KindState})
	closed := make(chan struct{})
	go func() { j.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second): // a bound for the failure only
		t.Fatal("Close waited on a reader that never reads")
	}
}

// The guard's own stdout and stderr are named through symlinks
// (/dev/stdout is /proc/self/fd/1): they are its descriptors, not links
// to refuse; closing the events file leaves them open.
func TestOpenFileTakesStdoutAndStderr(t *testing.T) {
	for _, p := range []string{"/dev/stdout", "/dev/stderr", "/dev/fd/2"} {
		f, err := OpenFile(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		f.Close()
	}
	if _, err := unix.FcntlInt(2, unix.F_GETFD, 0); err != nil {
		t.Errorf("stderr was closed with the events file: %v", err)
	}
}
