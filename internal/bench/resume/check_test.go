package main

import (
	"testing"
	"time"
)

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

// analyse attributes requests to the death they were in flight at, and
// counts failures, cuts and tokens against the uninterrupted answers.
func TestAnalyse(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	q := requestFor(0)
	ref := map[request]string{q: " the quick brown. fox"}
	recs := []record{
		{req: q, start: at(0), end: at(1), status: 200, done: true, text: " the quick brown. fox"},            // before: untouched
		{req: q, start: at(1), end: at(2), status: 200, done: true, text: " the quick brown. fox"},            // before: untouched
		{req: q, start: at(9), end: at(10.1), status: 200, done: true, errEvent: true, text: " the quick"},    // cut at the death
		{req: q, start: at(9.5), end: at(10.2), status: 503},                                                  // failed at the death
		{req: q, start: at(9.8), end: at(13.8), status: 200, done: true, text: " the quick quick brown. fox"}, // resumed, one repeated
		{req: q, start: at(9.9), end: at(12.9), status: 200, done: true, text: " the quick. fox"},             // resumed, one missing
	}
	var res Result
	analyse(&res, recs, []time.Time{at(10.3), at(30)}, 1, ref)
	d := res.Deaths
	if len(d) != 1 || res.LaterDeaths != 1 {
		t.Fatalf("deaths %+v, later %d; want one counted, one later", d, res.LaterDeaths)
	}
	if c := d[0]; c.Requests != 4 || c.Failed != 1 || c.Cut != 1 || c.Repeated != 1 || c.Missing != 1 {
		t.Fatalf("death 1: %+v; want 4 touched, 1 failed, 1 cut, 1 repeated, 1 missing", c)
	}
	if res.BaselineMs != 1000 || d[0].AddedP50Ms != 2000 || d[0].AddedP99Ms != 3000 {
		t.Fatalf("baseline %d ms, added %d/%d ms; want 1000, 2000/3000", res.BaselineMs, d[0].AddedP50Ms, d[0].AddedP99Ms)
	}
	if res.Total.Requests != 6 || res.Total.Failed != 1 || res.Total.Cut != 1 {
		t.Fatalf("total %+v", res.Total)
	}
}
