package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// vLLM's request models are pydantic models in lax mode: a number field
// takes a JSON number or a string holding one ("max_tokens": "5",
// "temperature": "0"), and an integer field a float without a fraction
// (5.0); 5.5 is refused with pydantic's error (400, checked on vLLM
// 0.32.0). JSON null leaves the field unset.

// laxInt is an integer field read as pydantic reads it.
type laxInt int64

func (n *laxInt) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if s == "null" {
		return nil
	}
	if strings.HasPrefix(s, `"`) {
		unq, err := strconv.Unquote(s)
		if err != nil {
			return &laxError{kind: "int_parsing", msg: "Input should be a valid integer, unable to parse string as an integer", input: s}
		}
		i, err := strconv.ParseInt(strings.TrimSpace(unq), 10, 64)
		if err != nil {
			return &laxError{kind: "int_parsing", msg: "Input should be a valid integer, unable to parse string as an integer", input: unq}
		}
		*n = laxInt(i)
		return nil
	}
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		*n = laxInt(i)
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil:
		return &laxError{kind: "int_type", msg: "Input should be a valid integer", input: s}
	case f != math.Trunc(f) || math.Abs(f) > 1<<62:
		return &laxError{kind: "int_from_float", msg: "Input should be a valid integer, got a number with a fractional part", input: s}
	}
	*n = laxInt(f)
	return nil
}

// laxFloat is a float field read as pydantic reads it.
type laxFloat float64

func (f *laxFloat) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if s == "null" {
		return nil
	}
	if strings.HasPrefix(s, `"`) {
		unq, err := strconv.Unquote(s)
		if err == nil {
			s = strings.TrimSpace(unq)
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return &laxError{kind: "float_parsing", msg: "Input should be a valid number, unable to parse string as a number", input: s}
	}
	*f = laxFloat(v)
	return nil
}

// laxError is pydantic's refusal of one field's value; loc names the
// field ("body.max_tokens") once known.
type laxError struct{ kind, msg, input, loc string }

func (e *laxError) Error() string {
	return fmt.Sprintf("1 validation error:\n  {'type': '%s', 'loc': '%s', 'msg': '%s', 'input': '%s'}", e.kind, e.loc, e.msg, e.input)
}

// locate names the field of a request body that e refused (encoding/json
// does not say which field an Unmarshaler failed on).
func (e *laxError) locate(body []byte) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return
	}
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		var n laxInt
		var f laxFloat
		var target json.Unmarshaler = &n
		if name == "temperature" {
			target = &f
		}
		if !slices.Contains(laxFields, name) {
			continue
		}
		if target.UnmarshalJSON(fields[name]) != nil {
			e.loc = "body." + name
			return
		}
	}
}

// laxFields are the request fields read as lax numbers.
var laxFields = []string{"max_tokens", "max_completion_tokens", "stream_interval", "min_tokens", "seed", "temperature"}

// intPtr is a lax integer field as an int, nil when unset.
func intPtr(n *laxInt) *int {
	if n == nil {
		return nil
	}
	v := int(*n)
	return &v
}
