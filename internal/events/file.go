package events

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// OpenFile opens what `run --events FILE` names, for appending. /dev/fd/N
// (N > 2) is the descriptor the guard inherited, kept from its children;
// /dev/stdout and /dev/stderr are the guard's own.
// Any other path is opened without following a symlink (whoever can change
// the link could make the guard append to a file of their choosing) and
// without blocking: a FIFO nobody reads yet is an error, not a guard that
// hangs before it handles SIGTERM. A FIFO or pipe is written through Go's
// poller, so Close can bound its wait (JSONLines.Close).
func OpenFile(path string) (*os.File, error) {
	if n, ok := stdStream(path); ok {
		// The guard's own stdout or stderr: a copy of the descriptor, left
		// as it is (blocking, shared with the terminal or the journal).
		fd, err := unix.FcntlInt(uintptr(n), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			return nil, fmt.Errorf("--events %s: %w", path, err)
		}
		return os.NewFile(uintptr(fd), path), nil
	}
	if n, ok := inheritedFD(path); ok {
		if _, err := unix.FcntlInt(uintptr(n), unix.F_GETFD, 0); err != nil {
			return nil, fmt.Errorf("--events %s: descriptor %d is not open: %w", path, n, err)
		}
		// Not passed on to the keeper, vLLM or alert commands: the reader
		// would wait for them to close it too.
		syscall.CloseOnExec(n)
		if st, err := fstatMode(n); err == nil && st != unix.S_IFREG {
			if err := unix.SetNonblock(n, true); err != nil {
				return nil, fmt.Errorf("--events %s: %w", path, err)
			}
		}
		return os.NewFile(uintptr(n), path), nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o640)
	switch {
	case err == nil:
	case errors.Is(err, syscall.ELOOP):
		return nil, fmt.Errorf("--events %s is a symlink; the guard does not follow one (whoever can change it chooses what the guard appends to): name the file itself", path)
	case errors.Is(err, syscall.ENXIO):
		return nil, fmt.Errorf("--events %s is a FIFO that nobody reads yet; start its reader first, or name a regular file", path)
	default:
		return nil, fmt.Errorf("--events %s: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("--events %s: %w", path, err)
	}
	if m := info.Mode(); !m.IsRegular() && m&(os.ModeNamedPipe|os.ModeCharDevice) == 0 {
		f.Close()
		return nil, fmt.Errorf("--events %s is a %s, not a file: name a regular file, a FIFO or /dev/fd/N", path, m.Type())
	}
	return f, nil
}

// stdStream reads /dev/stdout, /dev/stderr and their /dev/fd/N and
// /proc/self/fd/N names.
func stdStream(path string) (int, bool) {
	switch path {
	case "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1":
		return 1, true
	case "/dev/stderr", "/dev/fd/2", "/proc/self/fd/2":
		return 2, true
	}
	return 0, false
}

// inheritedFD reads /dev/fd/N and /proc/self/fd/N with N > 2.
func inheritedFD(path string) (int, bool) {
	for _, prefix := range []string{"/dev/fd/", "/proc/self/fd/"} {
		if rest, ok := strings.CutPrefix(path, prefix); ok {
			n, err := strconv.Atoi(rest)
			return n, err == nil && n > 2
		}
	}
	return 0, false
}

func fstatMode(fd int) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Mode & unix.S_IFMT, nil
}
