package main

import "testing"

func TestCompareTokens(t *testing.T) {
	const want = " the quick brown. fox"
	for _, c := range []struct {
		name, got         string
		repeated, missing int
		exact             bool
	}{
		{"the same", want, 0, 0, true},
		{"cut after two", " the quick", 0, 3, false},
		{"a token repeated at the cut", " the quick quick brown. fox", 1, 0, false},
		{"a token lost at the cut", " the quick. fox", 0, 1, false},
		{"a wrong token", " the quick lazy. fox", 1, 1, false},
		{"two tokens again", " the quick brown. brown. fox", 2, 0, false},
		{"a period again", " the quick brown.. fox", 1, 0, false},
		{"nothing", "", 0, 5, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := compareTokens(c.got, want)
			if r.Repeated != c.repeated || r.Missing != c.missing || r.Exact != c.exact || r.Want != 5 {
				t.Fatalf("compareTokens(%q) = %+v; want %d repeated, %d missing, exact %v of 5", c.got, r, c.repeated, c.missing, c.exact)
			}
		})
	}
}
