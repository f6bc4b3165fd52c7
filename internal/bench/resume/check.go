package main

import "strings"

// tokenCheck is what a client received against the same request's
// uninterrupted greedy answer. The simulator writes each generated token
// as one of ten pieces (" the", " quick", ..., "."), so the text splits
// back into its tokens (splitTokens); the client does not ask for token
// ids (the proxy adds and strips them itself), so the text is what can be
// checked.
type tokenCheck struct {
	Got, Want int // tokens received, tokens of the uninterrupted answer
	Repeated  int // received beyond the longest common subsequence
	Missing   int // of the uninterrupted answer, not received
	Exact     bool
}

// compareTokens compares the text a client received with the
// uninterrupted answer's. Matched tokens are the longest common
// subsequence of the two: a token received twice (a continuation that
// started too early) is repeated, one skipped (too late) is missing, a
// wrong token is both. In a cut stream the last piece may be part of a
// token (with stop strings vLLM streams text up to the length of the
// longest stop string behind, mid-token): it is not counted.
func compareTokens(got, want string, cut bool) tokenCheck {
	g, w := splitTokens(got), splitTokens(want)
	if cut && len(g) > 0 {
		g = g[:len(g)-1]
	}
	m := lcs(g, w)
	return tokenCheck{Got: len(g), Want: len(w), Repeated: len(g) - m, Missing: len(w) - m, Exact: got == want}
}

// splitTokens cuts the simulator's text into its tokens: a "." alone, or a
// space and what follows up to the next space or ".".
func splitTokens(s string) []string {
	var out []string
	for s != "" {
		n := 1
		if s[0] != '.' {
			if i := strings.IndexAny(s[1:], " ."); i >= 0 {
				n = i + 1
			} else {
				n = len(s)
			}
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

func lcs(a, b []string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			switch {
			case a[i] == b[j]:
				cur[j+1] = prev[j] + 1
			case prev[j+1] >= cur[j]:
				cur[j+1] = prev[j+1]
			default:
				cur[j+1] = cur[j]
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
