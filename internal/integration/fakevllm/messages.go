package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// The two processes talk in lines "<kind> key=value key=value":
//
//	API → engine (engine's stdin):  load running=N prompt_tokens=T
//	                                ready
//	engine → API (fd 3):            loaded kv_tokens=N
//	                                mem device_used=B engine_used=B safe_seqs=N
//	                                dead reason=oom|crash|startup
//
// Values never hold spaces.

type msg struct {
	Kind   string
	Fields map[string]string
}

func parseMsg(line string) (msg, error) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return msg{}, fmt.Errorf("empty message")
	}
	m := msg{Kind: f[0], Fields: map[string]string{}}
	for _, kv := range f[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return msg{}, fmt.Errorf("message %q: field %q is not key=value", line, kv)
		}
		m.Fields[k] = v
	}
	return m, nil
}

func (m msg) int(key string) (int64, error) {
	v, ok := m.Fields[key]
	if !ok {
		return 0, fmt.Errorf("message %q lacks %s", m.Kind, key)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("message %q: %s=%q is not an integer", m.Kind, key, v)
	}
	return n, nil
}

func formatMsg(kind string, kv ...any) string {
	var b strings.Builder
	b.WriteString(kind)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	b.WriteByte('\n')
	return b.String()
}

// String renders m back; keys sorted, for tests.
func (m msg) String() string {
	keys := make([]string, 0, len(m.Fields))
	for k := range m.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(m.Kind)
	for _, k := range keys {
		b.WriteString(" " + k + "=" + m.Fields[k])
	}
	return b.String()
}
