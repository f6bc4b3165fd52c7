package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCompareTokens(t *testing.T) {
	const want = " the quick brown. fox"
	for _, c := range []struct {
		name, got         string
		repeated, missing int
		exact             bool
		cut               bool
	}{
		{"the same", want, 0, 0, true, false},
		{"cut after two", " the quick", 0, 3, false, false},
		{"a token repeated at the cut", " the quick quick brown. fox", 1, 0, false, false},
		{"a token lost at the cut", " the quick. fox", 0, 1, false, false},
		{"a wrong token", " the quick lazy. fox", 1, 1, false, false},
		{"two tokens again", " the quick brown. brown. fox", 2, 0, false, false},
		{"a period again", " the quick brown.. fox", 1, 0, false, false},
		{"nothing", "", 0, 5, false, false},
		{"cut mid-token: the piece is not counted", " the quick bro", 0, 3, false, true},
		{"cut, then a wrong token before the piece", " the lazy bro", 1, 4, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := compareTokens(c.got, want, c.cut)
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
	analyse(&res, recs, []time.Time{at(10.3), at(30)}, 1, oracle{answers: ref})
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

// A sampled answer is judged by its own ids: each way it can be wrong is
// named, and a consistent one passes.
func TestSampledAnswerConsistency(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q struct{ Tokens []int }
		json.NewDecoder(r.Body).Decode(&q)
		var b strings.Builder
		for _, id := range q.Tokens {
			if id == 99 {
				b.WriteString(" wn. fox")
				continue
			}
			fmt.Fprintf(&b, " w%d", id)
		}
		json.NewEncoder(w).Encode(map[string]string{"prompt": b.String()})
	}))
	defer srv.Close()
	o := oracle{base: srv.URL}
	full := make([]int, maxTokens)
	var fullText strings.Builder
	for i := range full {
		full[i] = i
		fmt.Fprintf(&fullText, " w%d", i)
	}
	for _, c := range []struct {
		name string
		r    record
		want string
	}{
		{"consistent", record{ids: []int{1, 2}, text: " w1 w2", usage: 2, finish: "stop"}, ""},
		{"consistent at max_tokens", record{ids: full, text: fullText.String(), usage: maxTokens, finish: "length"}, ""},
		{"spliced text", record{ids: []int{1, 2}, text: " w1 w1 w2", usage: 2, finish: "stop"}, "not its ids"},
		{"usage off", record{ids: []int{1, 2}, text: " w1 w2", usage: 3, finish: "stop"}, "usage"},
		{"no usage", record{ids: []int{1, 2}, text: " w1 w2", usage: -1, finish: "stop"}, "usage"},
		{"length early", record{ids: []int{1, 2}, text: " w1 w2", usage: 2, finish: "length"}, "finish_reason"},
		{"too many", record{ids: append(slices.Clone(full), 1), usage: maxTokens + 1}, "more than max_tokens"},
		{"text without ids", record{text: " w1", usage: 0}, "without ids"},
		{"ended before its stop string", record{req: requestFor(2), ids: []int{1, 99}, text: " w1 ", usage: 2, finish: "stop"}, ""},
		{"a stop string it was not asked", record{req: requestFor(0), ids: []int{1, 99}, text: " w1 ", usage: 2, finish: "stop"}, "not its ids"},
		{"stopped before a stop string", record{req: requestFor(2), ids: []int{1, 2}, text: " w", usage: 2, finish: "stop"}, "not its ids"},
		{"cut short of a stop string", record{req: requestFor(2), ids: []int{1, 2}, text: " w1", usage: 2, finish: "stop"}, "not its ids"},
	} {
		if got := o.consistent(c.r); (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
