// Stop strings as vLLM holds them back, kept by the proxy so that the held
// text is part of what a cut rolls back or forward (stopText).

package proxy

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// stopText holds back, as vLLM does, the text that may be the start of a
// stop string, and finds a stop string that spans a cut.
//
// vLLM (0.32.0, BaseIncrementalDetokenizer) holds back the last
// max(len(stop))−1 characters of the output while streaming, unless
// include_stop_str_in_output; the token ids of that text go out at once. At
// a cut that text would be lost: the delivered ids are in the
// continuation's prompt, so vLLM does not generate their text again. So the
// proxy asks vLLM for everything (include_stop_str_in_output: true, which
// also ends the output right after a stop string instead of before it) and
// holds back the same characters itself: the client sees the same text in
// the same chunks. At the finish by a stop string the client did not want
// in its output, the proxy drops it from the end. A continuation's vLLM
// looks for stop strings only in its own output, so one that begins before
// the cut and ends after it is found here, and the proxy ends the stream
// there with finish_reason "stop" (its last chunk's token ids are all
// counted as delivered: vLLM does not say which token ended the string).
type stopText struct {
	stops   []string
	keep    bool   // the client wants the stop string in its output
	hold    int    // characters held back (keep: remembered): max(len(stop)) − 1
	pending string // received, not yet given to the client (not keep)
	recent  string // the last hold characters received
	seam    string // recent at the last cut, while a stop string may span it
	after   string // text received since that cut, while seam is set
}

func (t *stopText) init() {
	for _, s := range t.stops {
		t.hold = max(t.hold, utf8.RuneCountInString(s)-1)
	}
}

// rest is what was held back, given out at an end the proxy writes.
func (t *stopText) rest() string {
	if t == nil {
		return ""
	}
	r := t.pending
	t.pending = ""
	return r
}

// cut marks a cut: what comes next continues from here.
func (t *stopText) cut() { t.seam, t.after = t.recent, "" }

func lastRunes(s string, n int) string {
	if n <= 0 {
		return ""
	}
	i := len(s)
	for ; n > 0 && i > 0; n-- {
		_, w := utf8.DecodeLastRuneInString(s[:i])
		i -= w
	}
	return s[i:]
}

// feed takes a chunk's text and returns what the client gets of it, and
// the stop string when the proxy found one across a cut.
func (t *stopText) feed(text string, finished bool, stopReason json.RawMessage) (string, *string) {
	if t.seam != "" {
		prev := t.after
		t.after += text
		w := t.seam + t.after
		if at, s := firstStop(w, t.stops); at >= 0 && at < len(t.seam) && at+len(s) > len(t.seam)+len(prev) {
			end := at + len(s) - len(t.seam) - len(prev) // of text, up to the stop string's end
			var out string
			if t.keep {
				out = text[:end]
			} else {
				// Up to where the stop string begins, of what is held.
				out = t.pending[:len(t.pending)-len(t.seam)-len(prev)+at]
			}
			t.pending, t.seam, t.after = "", "", ""
			return out, &s
		}
		if utf8.RuneCountInString(t.after) >= t.hold {
			t.seam, t.after = "", "" // every string that began before the cut has ended
		}
	}
	t.recent = lastRunes(t.recent+text, t.hold)
	if t.keep {
		return text, nil
	}
	t.pending += text
	if finished {
		var s string
		if json.Unmarshal(stopReason, &s) == nil && s != "" {
			t.pending = strings.TrimSuffix(t.pending, s)
		}
		return t.rest(), nil
	}
	kept := lastRunes(t.pending, t.hold)
	out := t.pending[:len(t.pending)-len(kept)]
	t.pending = kept
	return out, nil
}

// firstStop is the stop string that ends first in s, and where it begins.
func firstStop(s string, stops []string) (int, string) {
	bestAt, bestEnd, best := -1, len(s)+1, ""
	for _, st := range stops {
		if i := strings.Index(s, st); i >= 0 && i+len(st) < bestEnd {
			bestAt, bestEnd, best = i, i+len(st), st
		}
	}
	return bestAt, best
}
