package main

import (
	"encoding/json"
	"strconv"
	"testing"
)

func TestLaxNumbers(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{{`5`, 5, true}, {`"5"`, 5, true}, {`" 7 "`, 7, true}, {`5.0`, 5, true}, {`-3`, -3, true},
		{`5.5`, 0, false}, {`"five"`, 0, false}, {`"5.5"`, 0, false}, {`true`, 0, false}, {`[1]`, 0, false}} {
		var n laxInt
		err := json.Unmarshal([]byte(c.in), &n)
		if (err == nil) != c.ok || c.ok && int64(n) != c.want {
			t.Errorf("%s: %d %v, want %d ok=%v", c.in, n, err, c.want, c.ok)
		}
	}
	var f laxFloat
	if err := json.Unmarshal([]byte(`"0.5"`), &f); err != nil || f != 0.5 {
		t.Errorf(`"0.5": %v %v`, f, err)
	}
	var req completionRequest
	if err := json.Unmarshal([]byte(`{"max_tokens":null,"min_tokens":null,"stop_token_ids":["7",8]}`), &req); err != nil ||
		req.MaxTokens != nil || req.MinTokens != 0 || len(req.StopTokenIDs) != 2 || req.StopTokenIDs[0] != 7 {
		t.Errorf("%+v %v", req, err)
	}
	e := &laxError{}
	if json.Unmarshal([]byte(`{"prompt":"x","max_tokens":5.5}`), &req) == nil {
		t.Fatal("5.5 accepted")
	}
	e.locate([]byte(`{"prompt":"x","seed":1,"max_tokens":5.5}`))
	if e.loc != "body.max_tokens" {
		t.Errorf("located %q", e.loc)
	}
}

// A lax integer never panics, and what it accepts is the integer the
// input spells.
func FuzzLaxInt(f *testing.F) {
	for _, s := range []string{`5`, `"5"`, `5.0`, `5.5`, `"x"`, `null`, `1e3`, `"-0"`, `99999999999999999999`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var n laxInt
		if err := n.UnmarshalJSON([]byte(in)); err != nil {
			if _, ok := err.(*laxError); !ok {
				t.Fatalf("%q: an error that is not pydantic's: %v", in, err)
			}
			return
		}
		if i, err := strconv.ParseInt(in, 10, 64); err == nil && int64(n) != i {
			t.Fatalf("%q read as %d", in, n)
		}
	})
}
