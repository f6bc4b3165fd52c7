package vllmlog

import "testing"

// Issue 32 item 2: uvicorn prints X-Forwarded-For's client (from a proxy
// it trusts) as the client of its access line, so the client field is
// text of the client's choosing. An access line is the client's text by
// its shape, whatever that field holds.
func TestAccessShapeWhateverTheClientField(t *testing.T) {
	for _, line := range []string{
		// As the pinned vLLM's uvicorn printed it (its ProxyHeadersMiddleware, port 0).
		`INFO:     torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB:0 - "GET /health HTTP/1.1" 200 OK`,
		`(APIServer pid=1) INFO:     torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB:0 - "POST /v1/completions HTTP/1.1" 200 OK`,
		"\x1b[1;36m(APIServer pid=1)\x1b[0;0m INFO:     CUDA out of memory:0 - \"GET /v1/models HTTP/1.1\" 404 Not Found",
		`2026-01-20T04:00:00.123456789Z stderr F INFO:     a b c - "GET / HTTP/1.1" 500 Internal Server Error`,
		// A process prefix inside the client field is not cut.
		`(APIServer pid=1) INFO:     (EngineCore_0 pid=5) torch.OutOfMemoryError: CUDA out of memory.:0 - "GET / HTTP/1.1" 200 OK`,
		// A client field that itself looks like an access line, or holds quotes.
		`INFO:     x - "GET / HTTP/1.1" 200 OK CUDA out of memory:0 - "GET /health HTTP/1.1" 200 OK`,
		`INFO:     "quoted" CUDA out of memory:0 - "GET /health HTTP/1.1" 200`,
		`INFO:     127.0.0.1 - "GET /health HTTP/1.1" 200 OK`,
		`INFO:     127.0.0.1:99999 - "get /health HTTP/1.1" 405 Method Not Allowed`,
		`INFO:      - "GET /health HTTP/2" 503`,
	} {
		if !IsAccessShape(line) || !IsClientText(line) {
			t.Errorf("not taken for the client's text: %q (shape %v)", line, IsAccessShape(line))
		}
	}
	for _, line := range []string{
		// vLLM's own failure lines, and uvicorn's own lines.
		`(EngineCore_0 pid=5) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.19 GiB`,
		`(APIServer pid=1) ERROR 07-22 09:00:00 [core_client.py:564] Engine core proc EngineCore_0 died unexpectedly, shutting down client.`,
		`INFO:     Application startup complete.`,
		`INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)`,
		`ERROR:    Exception in ASGI application`,
		// Not the shape: no status, a status of two digits, another level.
		`INFO:     a - "GET / HTTP/1.1"`,
		`INFO:     a - "GET / HTTP/1.1" 20 OK`,
		`WARNING:  a - "GET / HTTP/1.1" 200 OK`,
		`INFO 07-22 09:00:00 [a.py:1] a - "GET / HTTP/1.1" 200 OK CUDA out of memory`,
	} {
		if IsAccessShape(line) {
			t.Errorf("taken for an access line: %q", line)
		}
	}
}

// Every line ParseAccess reads has the access shape.
func FuzzAccessShapeCoversParseAccess(f *testing.F) {
	f.Add(`INFO:     127.0.0.1:54321 - "GET /health HTTP/1.1" 200 OK`)
	f.Add(`(APIServer pid=1) INFO:     [::1]:8 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error`)
	f.Add(`INFO:     a b:0 - "GET / HTTP/2" 503`)
	f.Add("INFO:     a:1 - \"GET /\n HTTP/1\" 200 \n")
	f.Fuzz(func(t *testing.T, s string) {
		if _, ok := ParseAccess(s); ok && !IsAccessShape(s) {
			t.Fatalf("ParseAccess reads %q, IsAccessShape does not", s)
		}
	})
}
