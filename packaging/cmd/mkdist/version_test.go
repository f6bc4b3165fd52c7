package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

func TestPackageVersion(t *testing.T) {
	for _, c := range []struct{ stamped, want string }{
		{"v1.2.3", "1.2.3"},
		{"1.2.3", "1.2.3"},
		{"v2.0", "2.0"},
		{"v1.2.3-rc.1", "1.2.3~rc.1"},
		{"v1.2.3-beta-2", "1.2.3~beta.2"},
		{"v1.2.3-dirty", "1.2.3+0.dirty"},
		{"v1.2.3-4-gabc1234", "1.2.3+4.gabc1234"},
		{"v1.2.3-4-gabc1234-dirty", "1.2.3+4.gabc1234.dirty"},
		{"v1.2.3-rc.1-4-gabc1234", "1.2.3~rc.1+4.gabc1234"},
		{"v1.2.3-rc.1-dirty", "1.2.3~rc.1+0.dirty"},
		{"f0a881c", "0.0.0+gf0a881c"},
		{"f0a881c-dirty", "0.0.0+gf0a881c.dirty"},
		{"dev", "0.0.0+dev"},
	} {
		got, err := packageVersion(c.stamped)
		if err != nil || got != c.want {
			t.Errorf("packageVersion(%q) = %q, %v; want %q", c.stamped, got, err, c.want)
		}
	}
}

func TestPackageVersionRefusesWhatIsNoVersion(t *testing.T) {
	for _, bad := range []string{"", "latest", "v1.2.3 beta", "v1..2", "release-1", "abc", "v1.2.3_1", "-dirty"} {
		got, err := packageVersion(bad)
		if err == nil {
			t.Errorf("packageVersion(%q) = %q; want an error", bad, got)
		} else if !strings.Contains(err.Error(), "VERSION=vX.Y.Z") {
			t.Errorf("packageVersion(%q): %v; want the error to say how to set a version", bad, err)
		}
	}
}

// The versions order as the releases do, for dpkg and for rpm alike.
func TestPackageVersionsOrderAsReleases(t *testing.T) {
	ordered := []string{"f0a881c", "f0a881c-dirty", "v0.9.0", "v1.2.3-rc.1", "v1.2.3-rc.1-2-gabc1234",
		"v1.2.3", "v1.2.3-dirty", "v1.2.3-4-gabc1234", "v1.2.3-10-gdef5678", "v1.2.3-10-gdef5678-dirty", "v1.2.4"}
	var versions []string
	for _, s := range ordered {
		v, err := packageVersion(s)
		if err != nil {
			t.Fatal(err)
		}
		versions = append(versions, v)
	}
	for i := 1; i < len(versions); i++ {
		a, b := versions[i-1], versions[i]
		if out, err := exec.Command("dpkg", "--compare-versions", a, "lt", b).CombinedOutput(); err != nil {
			t.Errorf("dpkg: %s is not before %s (%s from %s, %s from %s): %v %s", a, b, a, ordered[i-1], b, ordered[i], err, out)
		}
		lua := fmt.Sprintf(`%%{lua: print(rpm.vercmp(%q, %q))}`, a, b)
		out, err := exec.Command("rpm", "--eval", lua).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "-1" {
			t.Errorf("rpm: %s is not before %s: vercmp says %q (%v)", a, b, strings.TrimSpace(string(out)), err)
		}
	}
}
