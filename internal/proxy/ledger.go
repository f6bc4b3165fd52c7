// What a stream's client has been given, in token ids (issue 40, Deliver 2):
// the ledger. vLLM says which ids are behind each chunk (several per chunk
// with --stream-interval or a lagging reader); the ledger keeps them, and
// where their text is known to be whole, so that at a cut the proxy knows
// exactly where a continuation starts and what it must not give again.

package proxy

import "slices"

// ledger is the generated ids a stream's client has been given (whether it
// sees them or not) and what is known of their text.
//
// vLLM's detokenizer writes a token's text only once its bytes make whole
// characters: a chunk of one id that carries text ends on a whole
// character, so a continuation whose prompt ends there gets the rest of the
// text right (one whose prompt ends inside a character makes vLLM 0.32.0
// write the prompt's text: docs/resume-facts.md). After a chunk without
// text, or of several ids, that is not known: the ids after whole are
// either generated again (greedy: the same ids, matched and not given
// again), rolled back (the client saw neither their ids nor any text), or
// the stream is not continued (split_character).
type ledger struct {
	ids      []int  // generated ids the client has been given
	whole    int    // ids[:whole] end on a whole character
	rawSince string // vLLM's text of ids[whole:] (before any stop-string hold)
	chunks   int    // chunks the client was given for ids[whole:]

	// A greedy continuation gives ids[whole:] again: regen and regenRaw are
	// what of them is still to come, checked against what arrives.
	regen    []int
	regenRaw string
	// phantom: chunks the client was given for ids rolled back (they had
	// no text and hid their ids); that many of the continuation's chunks
	// are merged into the next, so that chunks still count tokens. carry
	// is the text of the merged ones.
	phantom int
	carry   string
}

// add records a chunk's ids and text, given to the client (or matched, a
// greedy continuation's, as given before); one: vLLM's chunk held exactly
// one id.
func (l *ledger) add(ids []int, raw string, one bool) {
	l.ids = append(l.ids, ids...)
	if one && raw != "" && !l.regenerating() {
		l.whole, l.rawSince, l.chunks = len(l.ids), "", 0
		return
	}
	l.rawSince += raw
	l.chunks++
}

// match takes from a chunk what a greedy continuation gives again: the ids
// and text the client has. ok is false when they differ from it.
func (l *ledger) match(ids []int, raw string) (newIDs []int, newRaw string, ok bool) {
	k := min(len(ids), len(l.regen))
	if !slices.Equal(ids[:k], l.regen[:k]) {
		return nil, "", false
	}
	l.regen = l.regen[k:]
	switch {
	case len(raw) >= len(l.regenRaw) && raw[:len(l.regenRaw)] == l.regenRaw:
		raw, l.regenRaw = raw[len(l.regenRaw):], ""
	case len(raw) < len(l.regenRaw) && l.regenRaw[:len(raw)] == raw:
		l.regenRaw, raw = l.regenRaw[len(raw):], ""
	default:
		return nil, "", false
	}
	if len(l.regen) > 0 && raw != "" {
		return nil, "", false // new text before the ids it belongs to
	}
	return ids[k:], raw, true
}

// regenerating: a greedy continuation is still giving ids the client has.
func (l *ledger) regenerating() bool { return len(l.regen) > 0 || l.regenRaw != "" }

// cut decides where a continuation starts: len(l.ids) afterwards is the
// number of ids in its prompt. reason is why the stream cannot continue
// exactly ("": it can). greedy: the same prefix gives the same ids;
// shown: the client sees the ids.
func (l *ledger) cut(greedy, shown bool) (reason string) {
	if l.regenerating() {
		// Cut again before the ids the client has came back: they are
		// the client's all the same.
		l.ids = append(l.ids, l.regen...)
		l.rawSince += l.regenRaw
		l.regen, l.regenRaw = nil, ""
	}
	if l.whole == len(l.ids) {
		return ""
	}
	switch {
	case greedy:
		l.regen = slices.Clone(l.ids[l.whole:])
		l.regenRaw = l.rawSince
	case !shown && l.rawSince == "":
		// Nothing of these ids reached the client but empty chunks: a
		// sample of them from the whole point on is as valid.
		l.phantom += l.chunks
	default:
		return nrSplitChar
	}
	l.ids = l.ids[:l.whole]
	l.rawSince, l.chunks = "", 0
	return ""
}

// splitForSure: cut now, a sampled stream is refused split_character
// whatever vLLM's /detokenize would say: its client has ids after the last
// whole character (shown) and no text of theirs, so no shorter run of them
// can be found to end on a whole character (wholeCheck needs text to
// compare). Known at the cut, before any hold.
func (l *ledger) splitForSure(greedy, shown bool) bool {
	return !greedy && shown && !l.regenerating() && l.whole < len(l.ids) && l.rawSince == ""
}

// merge says whether a continuation's chunk (not the last) is merged into
// the next, and keeps its text until then.
func (l *ledger) merge(text string) bool {
	if l.phantom == 0 {
		return false
	}
	l.phantom--
	l.carry += text
	return true
}

// takeCarry is the text of merged chunks, written with the next one.
func (l *ledger) takeCarry() string {
	c := l.carry
	l.carry = ""
	return c
}
