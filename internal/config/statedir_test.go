package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A state_dir that is missing or the guard's is fine; a symlink, a file or
// another user's folder is refused, naming the key and what to do.
func TestCheckStateDir(t *testing.T) {
	dir := t.TempDir()
	mine := filepath.Join(dir, "mine")
	os.Mkdir(mine, 0o750)
	link := filepath.Join(dir, "link")
	os.Symlink(mine, link)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	euid := os.Geteuid()
	// Another user's folder: as root, one chowned to nobody; else ours,
	// checked as if the guard ran as another user.
	other, otherEUID := mine, euid+1
	if euid == 0 {
		other, otherEUID = filepath.Join(dir, "other"), 0
		os.Mkdir(other, 0o750)
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		dir  string
		euid int
		want string // "" for accepted
	}{
		{filepath.Join(dir, "missing"), euid, ""},
		{mine, euid, ""},
		{link, euid, "is a symlink (to " + mine + ")"},
		{file, euid, "is not a folder"},
		{other, otherEUID, "not to the guard's user"},
	} {
		err := checkStateDir("g.toml", c.dir, c.euid)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.dir, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "g.toml: [control] state_dir: ")):
			t.Errorf("%s (euid %d): %v, want an error saying %q", c.dir, c.euid, err, c.want)
		}
	}
}
