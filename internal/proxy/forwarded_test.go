package proxy

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// spoofedXFF is issue 32's attack: uvicorn prints X-Forwarded-For as the
// client of its access line, and this one reads as vLLM's OOM.
const spoofedXFF = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB, 127.0.0.1"

// No client field is evidence (issue 32 item 2): a client's X-Forwarded-*
// and Forwarded headers reach vLLM only from a peer in [proxy]
// trusted_proxies, the peer appended; from anyone else X-Forwarded-For is
// the peer's address alone. For a pass-through request and an admitted
// inference request alike.
func TestForwardedHeadersOnlyFromTrustedProxies(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trusted []string
		want    map[string]string // header: value at vLLM ("" absent)
	}{
		{"untrusted by default", nil, map[string]string{
			"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "Forwarded": "", "X-Forwarded-Host": "<front>"}},
		{"a trusted list without the peer", []string{"10.0.0.0/8", "192.0.2.7"}, map[string]string{
			"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "Forwarded": "", "X-Forwarded-Host": "<front>"}},
		{"the peer trusted", []string{"10.0.0.0/8", "127.0.0.1"}, map[string]string{
			"X-Forwarded-For": spoofedXFF + ", 203.0.113.9, 127.0.0.1", "X-Forwarded-Proto": "https",
			"Forwarded": "for=203.0.113.9;proto=https, for=127.0.0.1", "X-Forwarded-Host": "api.example.com"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := proxyConfig()
			cfg.TrustedProxies = tc.trusted
			got := make(chan http.Header, 2)
			r := newRig(t, cfg, 4, func(w http.ResponseWriter, req *http.Request) {
				got <- req.Header.Clone()
				w.Write([]byte(`{}`))
			})
			front, _ := url.Parse(r.front.URL)
			for _, call := range []struct{ method, path, body string }{
				{http.MethodGet, "/health", ""},
				{http.MethodPost, "/v1/completions", `{"prompt":"hi"}`},
			} {
				req, _ := http.NewRequest(call.method, r.front.URL+call.path, strings.NewReader(call.body))
				req.Header["X-Forwarded-For"] = []string{spoofedXFF, "203.0.113.9"} // two header lines
				req.Header.Set("X-Forwarded-Proto", "https")
				req.Header.Set("X-Forwarded-Host", "api.example.com")
				req.Header.Set("Forwarded", "for=203.0.113.9;proto=https")
				resp, err := r.client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s %s: %d", call.method, call.path, resp.StatusCode)
				}
				h := <-got
				for name, want := range tc.want {
					if want == "<front>" {
						want = front.Host
					}
					if v := strings.Join(h.Values(name), ", "); v != want {
						t.Errorf("%s %s: vLLM got %s %q; want %q", call.method, call.path, name, v, want)
					}
				}
			}
		})
	}
}

func TestForwardedNode(t *testing.T) {
	for in, want := range map[string]string{
		"10.1.2.3:555":          "10.1.2.3",
		"[::ffff:10.1.2.3]:555": "10.1.2.3",
		"[2001:db8::1]:80":      `"[2001:db8::1]"`,
		"not an address":        "unknown",
	} {
		if got := forwardedNode(in); got != want {
			t.Errorf("forwardedNode(%q) = %s; want %s", in, got, want)
		}
	}
}
