package redact

import (
	"regexp"
	"strings"
)

// Secrets found by their shape, whatever name they were given (an
// [vllm] env variable called MY_CREDS, a key pasted into an alert
// command): the prefixes of the usual issuers' keys, JWTs, and long
// random-looking strings.

// prefixRE are keys whose issuer marks them: Hugging Face (hf_), OpenAI
// and others (sk-), GitHub (ghp_, github_pat_), GitLab (glpat-), Slack
// (xoxb-), AWS access key ids (AKIA), and JWTs (eyJ…​.eyJ…​.…).
var prefixRE = regexp.MustCompile(`hf_[A-Za-z0-9]{16,}` +
	`|\bsk-[A-Za-z0-9_-]{16,}` +
	`|\bgh[pousr]_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{30,}` +
	`|\bglpat-[A-Za-z0-9_-]{20,}` +
	`|\bxox[abprs]-[A-Za-z0-9-]{10,}` +
	`|\bAKIA[0-9A-Z]{16}\b` +
	`|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*`)

// prefixTriggers: a line holds none of prefixRE's keys without one of
// these (lower case; mayHoldSecret ignores case).
var prefixTriggers = []string{"hf_", "sk-", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox", "akia", "eyj"}

// A random-looking run: at least minRandomRun characters of the alphabets
// keys are written in (letters, digits, + / _ -; a base64 key's = padding
// is left after the mask), holding upper case,
// lower case and digits, that change between those classes at least as
// often as changeRatio of its neighbouring pairs. A random key of 62
// symbols changes class at about 62 % of its pairs; words run together
// (Qwen2_5_VLForConditionalGeneration, /models--meta-llama--Llama-3)
// change far less. Hexadecimal (request ids, git commits) is left below
// minHexRun: a 32-byte key written in hex (openssl rand -hex 32) is 64.
const (
	minRandomRun = 20
	changeRatio  = 0.4
	minHexRun    = 64
)

func keyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '+' || c == '/' || c == '_' || c == '-'
}

// class of a byte: 1 lower, 2 upper, 3 digit, 0 other (+ / _ -).
func class(c byte) int {
	switch {
	case c >= 'a' && c <= 'z':
		return 1
	case c >= 'A' && c <= 'Z':
		return 2
	case c >= '0' && c <= '9':
		return 3
	}
	return 0
}

func hexByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// randomRun reports whether run looks like a key: random-looking, or long
// hexadecimal.
func randomRun(run string) bool {
	if len(run) < minRandomRun {
		return false
	}
	var seen [4]bool
	hex := true
	changes, pairs, prev := 0, 0, -1
	for i := 0; i < len(run); i++ {
		c := run[i]
		hex = hex && hexByte(c)
		k := class(c)
		seen[k] = true
		if k == 0 {
			continue
		}
		if prev >= 0 {
			pairs++
			if k != prev {
				changes++
			}
		}
		prev = k
	}
	if hex {
		return len(run) >= minHexRun
	}
	return seen[1] && seen[2] && seen[3] && float64(changes) >= changeRatio*float64(pairs)
}

// runs calls f with the start and end of each maximal run of key bytes
// that looks like a key, and stops when f returns false.
func runs(s string, f func(start, end int) bool) {
	for i := 0; i < len(s); {
		if !keyByte(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && keyByte(s[j]) {
			j++
		}
		if randomRun(trimEdges(s[i:j])) {
			start := i + (len(s[i:j]) - len(strings.TrimLeft(s[i:j], "-_+/")))
			end := i + len(strings.TrimRight(s[i:j], "-_+/"))
			if !f(start, end) {
				return
			}
		}
		i = j
	}
}

// trimEdges drops the punctuation a key does not start or end with (a
// flag's dashes, a path's slash).
func trimEdges(run string) string {
	return strings.TrimRight(strings.TrimLeft(run, "-_+/"), "-_+/")
}

// hasRandomRun is the cheap test mayHoldSecret makes: no allocation.
func hasRandomRun(s string) bool {
	found := false
	runs(s, func(int, int) bool { found = true; return false })
	return found
}

// maskShapes masks the keys prefixRE finds and every random-looking run.
func maskShapes(s string) string {
	s = prefixRE.ReplaceAllString(s, Mask)
	if !hasRandomRun(s) {
		return s
	}
	var b strings.Builder
	done := 0
	runs(s, func(start, end int) bool {
		b.WriteString(s[done:start])
		b.WriteString(Mask)
		done = end
		return true
	})
	b.WriteString(s[done:])
	return b.String()
}
