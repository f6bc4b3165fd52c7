package group

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := ReadSecret(write("ok", "  c2VjcmV0LXNlY3JldC1zZWNyZXQ=\n"))
	if err != nil || string(got) != "c2VjcmV0LXNlY3JldC1zZWNyZXQ=" {
		t.Errorf("trimmed secret: %q %v", got, err)
	}
	for _, tc := range []struct{ name, path, want string }{
		{"missing", filepath.Join(dir, "none"), "cannot read the secret file"},
		{"short", write("short", "abc\n"), "has 3 bytes; write at least 16"},
		{"huge", write("huge", strings.Repeat("x", maxSecret+1)), "larger than 4096 bytes"},
	} {
		if _, err := ReadSecret(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
