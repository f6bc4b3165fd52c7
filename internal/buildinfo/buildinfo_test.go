package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestGet(t *testing.T) {
	vcs := func(rev, modified string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}}, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	for _, c := range []struct {
		version, revision string
		read              func() (*debug.BuildInfo, bool)
		want              Info
	}{
		{"v1.2.0", "abc123", vcs("zzz", "false"), Info{"v1.2.0", "abc123", runtime.Version()}}, // stamped wins
		{"dev", "", vcs("def456", "false"), Info{"dev", "def456", runtime.Version()}},
		{"dev", "", vcs("def456", "true"), Info{"dev", "def456-dirty", runtime.Version()}},
		{"", "", none, Info{"dev", "unknown", runtime.Version()}},
	} {
		if got := get(c.version, c.revision, c.read); got != c.want {
			t.Errorf("get(%q, %q) = %+v, want %+v", c.version, c.revision, got, c.want)
		}
	}
}
