package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmlog"
)

// streamWriter serialises writes to one stream and measures them: how long
// the longest single write blocked (a slow reader on the pipe shows here),
// how many lines and bytes went out. Write errors (closed stdout, a reader
// that went away) are swallowed: vLLM keeps running when its log is lost.
type streamWriter struct {
	mu       sync.Mutex
	w        io.Writer
	stats    *writeStats
	disabled bool
}

// writeStats is shared by both streams of one process.
type writeStats struct {
	mu sync.Mutex
	statsJSON
}

// statsJSON is FAKEVLLM_STATS_FILE's content.
type statsJSON struct {
	MaxBlockMS float64 `json:"max_write_block_ms"`
	Lines      int64   `json:"lines_written"`
	Bytes      int64   `json:"bytes_written"`
}

func (s *writeStats) snapshot() statsJSON {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statsJSON
}

func (w *streamWriter) write(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.disabled || w.w == nil {
		return
	}
	start := time.Now()
	n, _ := w.w.Write(b)
	blocked := time.Since(start)
	if w.stats != nil {
		w.stats.mu.Lock()
		if ms := float64(blocked) / float64(time.Millisecond); ms > w.stats.MaxBlockMS {
			w.stats.MaxBlockMS = ms
		}
		w.stats.Lines += int64(strings.Count(string(b[:n]), "\n"))
		w.stats.Bytes += int64(n)
		w.stats.mu.Unlock()
	}
}

func (w *streamWriter) disable() {
	w.mu.Lock()
	w.disabled = true
	w.mu.Unlock()
}

// logger prints in the format of one vLLM era (vllmlog writes it). vLLM's
// logger writes to stdout; uvicorn, tqdm bars and Python tracebacks go to
// stderr. In V1 every line a process writes, on either stream, carries its
// prefix ("(APIServer pid=N) "), ANSI-coloured until early 2026.
type logger struct {
	era    vllmlog.Era
	proc   string // "" in V0: no process prefix
	prefix string
	out    *streamWriter
	err    *streamWriter
	now    func() time.Time
}

// logEra is the log format of the simulated era.
func (e era) logEra() vllmlog.Era {
	switch e {
	case eraV0:
		return vllmlog.EraV0
	case eraV1Plain:
		return vllmlog.EraV1Plain
	}
	return vllmlog.EraV1ANSI
}

func newLogger(e era, proc string, pid int, out, errw *streamWriter) *logger {
	l := &logger{era: e.logEra(), out: out, err: errw, now: time.Now}
	if e != eraV0 && proc != "" { // "": vLLM's unprefixed lines (argparse warnings)
		l.proc = vllmlog.Proc(proc, pid)
	}
	l.prefix = vllmlog.ProcessPrefix(l.era, l.proc)
	return l
}

// format renders one logger line without the newline.
func (l *logger) format(level, src, msg string) string {
	return vllmlog.FormatLine(l.era, l.proc, level, l.now(), src, msg)
}

func (l *logger) log(level, src, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	// logger.exception and multi-line messages repeat the header per line.
	var b strings.Builder
	for _, line := range strings.Split(msg, "\n") {
		b.WriteString(l.format(level, src, line))
		b.WriteByte('\n')
	}
	l.out.write([]byte(b.String()))
}

func (l *logger) info(src, format string, args ...any)  { l.log("INFO", src, format, args...) }
func (l *logger) warn(src, format string, args ...any)  { l.log("WARNING", src, format, args...) }
func (l *logger) error(src, format string, args ...any) { l.log("ERROR", src, format, args...) }

// stderrLines prints raw lines (uvicorn, tracebacks) on stderr, each with
// the process prefix, in one write so that they stay together.
func (l *logger) stderrLines(lines ...string) {
	var b strings.Builder
	for _, s := range lines {
		for _, line := range strings.Split(s, "\n") {
			b.WriteString(l.prefix)
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	l.err.write([]byte(b.String()))
}

// uvicorn prints one of uvicorn's own lines ("INFO:     Started ...").
func (l *logger) uvicorn(msg string) { l.stderrLines(vllmlog.Uvicorn(msg)) }

// bar prints a tqdm progress bar state: tqdm rewrites the line with '\r'
// and ends it with '\n' when done.
func (l *logger) bar(text string, done bool) {
	end := "\r"
	if done {
		end = "\n"
	}
	l.err.write([]byte(l.prefix + text + end))
}

// tqdmBar renders "Desc:  50%|█████     | 1/2 [00:01<00:01,  1.00it/s]".
func tqdmBar(desc string, n, total int, elapsed time.Duration) string {
	pct := 0
	if total > 0 {
		pct = n * 100 / total
	}
	filled := pct / 10
	bar := strings.Repeat("█", filled) + strings.Repeat(" ", 10-filled)
	rate := "?"
	remaining := "?"
	if n > 0 && elapsed > 0 {
		per := elapsed / time.Duration(n)
		rate = fmt.Sprintf("%5.2f", float64(n)/elapsed.Seconds())
		remaining = clock(per * time.Duration(total-n))
	}
	return fmt.Sprintf("%s: %3d%%|%s| %d/%d [%s<%s, %sit/s]", desc, pct, bar, n, total, clock(elapsed), remaining, rate)
}

func clock(d time.Duration) string {
	s := int(d.Seconds())
	return fmt.Sprintf("%02d:%02d", s/60, s%60)
}

// gibStr formats bytes as GiB with vLLM's usual precision.
func gibStr(b int64) string { return fmt.Sprintf("%.2f", float64(b)/float64(gib)) }

// torchSize formats bytes the way torch's OOM message does.
func torchSize(b int64) string {
	switch {
	case b < kib:
		return fmt.Sprintf("%d bytes", b)
	case b < mib:
		return fmt.Sprintf("%.2f KiB", float64(b)/float64(kib))
	case b < gib:
		return fmt.Sprintf("%.2f MiB", float64(b)/float64(mib))
	}
	return fmt.Sprintf("%.2f GiB", float64(b)/float64(gib))
}

// withThousands renders 425424 as "425,424", as vLLM does.
func withThousands(n int64) string {
	s := fmt.Sprintf("%d", n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
