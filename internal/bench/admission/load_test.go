package main

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestSSELine(t *testing.T) {
	for line, want := range map[string]sseKind{
		`data: {"choices":[{"finish_reason":null,"index":0,"text":" the"}],"id":"cmpl-1","object":"text_completion"}`: sseToken,
		`data: [DONE]`: sseDone,
		`data: {"code":500,"message":"EngineCore encountered an issue.","object":"error","type":"InternalServerError"}`: sseError,
		`data: {"error":{"message":"vLLM exited","type":"ServiceUnavailableError","code":503}}`:                         sseError,
		`data: {"choices":[],"usage":{"prompt_tokens":2}}`:                                                              sseOther,
		``:             sseOther,
		`: keep-alive`: sseOther,
		`data: {trunc`: sseOther,
	} {
		if got := sseLine(line); got != want {
			t.Errorf("sseLine(%q) = %d, want %d", line, got, want)
		}
	}
}

func TestCount(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	recs := []record{
		{start: at(1), first: at(1.1), end: at(2), outcome: completed, tokens: 10},
		{start: at(2), first: at(2.3), end: at(3), outcome: completed, tokens: 10},
		{start: at(9), first: at(9.2), end: at(11), outcome: completed, tokens: 10}, // ends after the phase: no goodput
		{start: at(3), first: at(3.1), end: at(3.5), outcome: cut, tokens: 4},
		{start: at(4), end: at(4), outcome: refused, retryAfter: "1"},
		{start: at(4), end: at(4), outcome: refused},
		{start: at(5), end: at(5), outcome: failed, why: "no answer"},
		{start: at(6), end: at(6), outcome: aborted},
		{start: at(-1), first: at(0), end: at(1), outcome: completed, tokens: 10}, // before the phase
	}
	c := count(recs, t0, at(10))
	want := Counts{Requests: 7, Completed: 3, StreamsCut: 1, Refused: 2, RefusedNoRetryAfter: 1, Failed: 1, GoodputTokS: 2,
		TTFTP50Ms: 100, TTFTP99Ms: 300}
	if c.FailedBy["no answer"] != 1 || len(c.FailedBy) != 1 {
		t.Errorf("failed by %v, want one with no answer", c.FailedBy)
	}
	c.FailedBy = nil
	if !reflect.DeepEqual(c, want) {
		t.Errorf("count\n got %+v\nwant %+v", c, want)
	}
}

func TestPercentile(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100 … 1, unsorted
	}
	if p := percentile(xs, 0.5); p != 50 {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(xs, 0.99); p != 99 {
		t.Errorf("p99 = %v", p)
	}
	if p := percentile(nil, 0.5); p != 0 {
		t.Errorf("p50 of nothing = %v", p)
	}
	if p := percentile([]float64{7}, 0.99); p != 7 {
		t.Errorf("p99 of one = %v", p)
	}
}

func TestGoals(t *testing.T) {
	rs := []Result{
		{Front: "direct", Shape: "ramp", OOMs: 5},
		{Front: "guard", Sample: "1s", Shape: "ramp", OOMs: 1, Counts: Counts{StreamsCut: 3},
			Admitted: &Admitted{InflightP50: 30, InflightMax: 41, Limit: 41, Bound: "memory"}},
		{Front: "guard", Sample: "100ms", Shape: "burst", Admitted: &Admitted{InflightP50: 107, Limit: 108, Bound: "memory"}},
		{Front: "guard", Sample: "100ms", Shape: "ramp", Error: "could not start"},
	}
	gs := goals(rs)
	var got []string
	for _, g := range gs {
		v := "met"
		if !g.Met {
			v = "missed"
		}
		got = append(got, v+": "+g.What)
	}
	want := []string{
		"missed: ramp past the point of failure, guard (1s): 0 OOMs, 0 streams cut, excess clients queued or refused with Retry-After",
		"missed: ramp, guard (1s): admitted concurrency at steady state ≥ 90 % of the true safe 118",
		"met: burst after warm-up, guard (100ms): 0 OOMs",
		"met: burst, guard (100ms): admitted concurrency at steady state ≥ 90 % of the true safe 118", // 107 ≥ 106.2
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("goals:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestTrueSafe(t *testing.T) {
	// 15 616 MiB above the budget; 131.25 MiB a request: 118 fit, 119 do not.
	per := float64(seqMiB) + float64(promptTokens*tokenKiB)/1024
	room := float64(deviceMiB - reservedMiB - apiMiB - 65536)
	if trueSafe != 118 || float64(trueSafe)*per > room || float64(trueSafe+1)*per <= room {
		t.Errorf("trueSafe %d: %d × %.2f MiB against %.0f MiB of room", trueSafe, trueSafe, per, room)
	}
}
