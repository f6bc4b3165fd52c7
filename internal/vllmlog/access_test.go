package vllmlog

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseAccess(t *testing.T) {
	for in, want := range map[string]Access{
		`INFO:     127.0.0.1:54321 - "GET /health HTTP/1.1" 200 OK`:                                                   {"127.0.0.1", 54321, "GET", "/health", "HTTP/1.1", 200, "OK"},
		`(APIServer pid=1) INFO:     10.0.3.7:41512 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error`: {"10.0.3.7", 41512, "POST", "/v1/chat/completions", "HTTP/1.1", 500, "Internal Server Error"},
		"\x1b[1;36m(APIServer pid=1)\x1b[0;0m INFO:     127.0.0.1:1 - \"GET /metrics HTTP/1.1\" 200 OK":               {"127.0.0.1", 1, "GET", "/metrics", "HTTP/1.1", 200, "OK"},
		`2026-01-20T04:00:00.123456789Z stderr F INFO:     [::1]:8 - "GET /v1/models?x=1 HTTP/1.1" 404 Not Found`:     {"::1", 8, "GET", "/v1/models?x=1", "HTTP/1.1", 404, "Not Found"},
		`INFO:     ::1:8 - "GET /health HTTP/2" 503`:                                                                  {"::1", 8, "GET", "/health", "HTTP/2", 503, ""},
		`INFO:     127.0.0.1:54321 - "GET /a "b" HTTP/1.1" 200 OK`:                                                    {"127.0.0.1", 54321, "GET", `/a "b"`, "HTTP/1.1", 200, "OK"},
	} {
		got, ok := ParseAccess(in)
		if !ok || got != want {
			t.Errorf("ParseAccess(%q) = %+v, %v\nwant %+v", in, got, ok, want)
		}
	}
	for _, in := range []string{
		"INFO:     Application startup complete.",
		"INFO:     Started server process [1951]",
		`INFO:     127.0.0.1 - "GET /health HTTP/1.1" 200 OK`,
		`INFO:     127.0.0.1:x - "GET /health HTTP/1.1" 200 OK`,
		`INFO:     127.0.0.1:99999 - "GET /health HTTP/1.1" 200 OK`,
		`INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 20 OK`,
		`INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 2000`,
		`INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 000`,
		`INFO:127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK`,
		`INFO:     127.0.0.1:1 - "GET /health" 200 OK`,
		`INFO:     127.0.0.1:1 - "get /health HTTP/1.1" 200 OK`,
		`WARNING:  127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK`,
		`INFO 10-14 12:00:00 [a.py:1] 127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK`,
	} {
		if a, ok := ParseAccess(in); ok {
			t.Errorf("ParseAccess(%q) = %+v, want no access line", in, a)
		}
	}
}

func TestFormatAccessRoundTrips(t *testing.T) {
	s := FormatAccess("127.0.0.1:54321", "GET", "/health", "HTTP/1.1", 200, "OK")
	if s != `INFO:     127.0.0.1:54321 - "GET /health HTTP/1.1" 200 OK` {
		t.Fatalf("FormatAccess: %q", s)
	}
	if a, ok := ParseAccess(ProcessPrefix(EraV1ANSI, "APIServer pid=1") + s); !ok || a.Path != "/health" || a.Status != 200 || a.Port != 54321 {
		t.Fatalf("%+v %v", a, ok)
	}
}

func FuzzParseAccess(f *testing.F) {
	f.Add(`INFO:     127.0.0.1:54321 - "GET /health HTTP/1.1" 200 OK`)
	f.Add(`(APIServer pid=1) INFO:     [::1]:8 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error`)
	f.Add(`INFO:     ::1:8 - "GET / HTTP/2" 503`)
	f.Add(`INFO:     a:1 - "" 200`)
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := ParseAccess(s)
		if !ok {
			return
		}
		if a.Status < 0 || a.Status > 999 || a.Port < 0 || a.Port > 65535 || a.Method == "" || a.Path == "" || !strings.HasPrefix(a.Proto, "HTTP/") {
			t.Fatalf("ParseAccess(%q) = %+v", s, a)
		}
		// What was parsed, written again, parses to the same.
		line := FormatAccess(a.Client+":"+strconv.Itoa(a.Port), a.Method, a.Path, a.Proto, a.Status, a.Reason)
		b, ok := ParseAccess(line)
		if !ok || b != a {
			t.Fatalf("ParseAccess(%q) = %+v; written again %q parses to %+v, %v", s, a, line, b, ok)
		}
	})
}
