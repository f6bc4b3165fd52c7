package control

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/vllm-guard/vllm-guard/internal/state"
)

func FuzzIncidentsQuery(f *testing.F) {
	for _, q := range []string{"", "n=5", "n=0", "n=-1", "n=abc", "n=1&n=2", "m=1", "n=%zz", "n=99999999999999999999", "n=+3", "n=1;x=2"} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q string) {
		n, err := ParseIncidentsQuery(q)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if n < 0 || n > maxIncidentsN {
			t.Fatalf("ParseIncidentsQuery(%q) = %d, out of range", q, n)
		}
		// What was accepted reads back the same.
		if again, err := ParseIncidentsQuery("n=" + strconv.Itoa(n)); err != nil || again != n {
			t.Fatalf("n=%d does not round-trip: %d %v", n, again, err)
		}
	})
}

func FuzzDecodeDoc(f *testing.F) {
	fixture, err := json.Marshal(fixtureDoc())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(fixture)
	for _, s := range []string{"{}", "null", "[]", `{"guard":{"restarts_by_cause":{"oom":"x"}}}`,
		`{"gpu":{"up":true,"devices":[{"history":[1e308,-1e308,0.5],"seconds_to_critical":1e300,"trend":"climbing"}]}}`,
		`{"now":"0001-01-01T00:00:00Z","guard":{"state":"backoff","next_start_at":"9999-12-31T23:59:59Z"}}`,
		`{"last_incident":{"delay":"bogus"}}`, `{"alerts":[{"name":"\u001b[2J"}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := DecodeDoc(bytes.NewReader(data))
		if err != nil {
			return
		}
		// Whatever decodes renders, without panicking or writing escapes.
		var b strings.Builder
		WriteStatus(&b, d)
		if strings.Contains(b.String(), "\x1b") {
			t.Fatalf("escape sequence in the view of %q", data)
		}
		WriteStatus(io.Discard, d)
	})
}

// FuzzDecodeIncidents: any answer decodes to records or an error, never a
// panic, and the records handed on are whole.
func FuzzDecodeIncidents(f *testing.F) {
	f.Add(`[]`)
	f.Add(`[{"id":"a","cause":"oom","last_lines":["x"]},{"id":"b","unreadable":"torn"}]`)
	f.Add(`[{"id":"a"},`)
	f.Add(`{"error":"x"}`)
	f.Add(`[{"delay":"5q"}]`)
	f.Fuzz(func(t *testing.T, s string) {
		n := 0
		err := DecodeIncidents(strings.NewReader(s), func(state.Incident) error { n++; return nil })
		if err == nil && !strings.Contains(s, "[") {
			t.Errorf("decoded %q without an array", s)
		}
	})
}
