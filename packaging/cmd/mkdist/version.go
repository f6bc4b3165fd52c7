package main

import (
	"fmt"
	"regexp"
	"strings"
)

// packageVersion turns the version a build is stamped with (the
// Makefile's `git describe --tags --always --dirty`) into one that dpkg
// and rpm accept and order the way releases go:
//
//	v1.2.3                  1.2.3
//	v1.2.3-rc.1             1.2.3~rc.1             (before 1.2.3)
//	v1.2.3-dirty            1.2.3+0.dirty          (changes on the tag itself)
//	v1.2.3-4-gabc1234       1.2.3+4.gabc1234       (4 commits after 1.2.3, before 1.2.4)
//	v1.2.3-4-gabc1234-dirty 1.2.3+4.gabc1234.dirty
//	f0a881c, f0a881c-dirty  0.0.0+gf0a881c[.dirty] (no tag yet: below every release)
//	dev                     0.0.0+dev              (built outside git)
//
// Builds between two tags are ordered by their commit count; two untagged
// builds are not ordered at all (a hash says nothing about age): tag a
// release before shipping it.
func packageVersion(stamped string) (string, error) {
	s := strings.TrimSpace(stamped)
	if s == "dev" {
		return "0.0.0+dev", nil
	}
	var extra []string
	if rest, ok := strings.CutSuffix(s, "-dirty"); ok {
		s, extra = rest, []string{"dirty"}
	}
	if m := untagged.FindStringSubmatch(s); m != nil {
		return "0.0.0+" + strings.Join(append([]string{"g" + m[1]}, extra...), "."), nil
	}
	if m := afterTag.FindStringSubmatch(s); m != nil {
		s, extra = m[1], append([]string{m[2], "g" + m[3]}, extra...)
	} else if len(extra) > 0 {
		extra = append([]string{"0"}, extra...) // changes on the tag itself: 0 commits after it
	}
	m := tagged.FindStringSubmatch(s)
	if m == nil {
		return "", fmt.Errorf("version %q is neither a tag like v1.2.3 (or v1.2.3-rc.1) nor what "+
			"`git describe --tags --always --dirty` prints for one: tag the release vX.Y.Z, or set VERSION=vX.Y.Z", stamped)
	}
	v := m[1]
	if m[2] != "" {
		v += "~" + strings.ReplaceAll(m[2], "-", ".")
	}
	if len(extra) > 0 {
		v += "+" + strings.Join(extra, ".")
	}
	return v, nil
}

var (
	// f0a881c: describe on a commit with no tag behind it (git abbreviates
	// a hash to 7 characters at least).
	untagged = regexp.MustCompile(`^([0-9a-f]{7,40})$`)
	// v1.2.3-4-gabc1234: 4 commits after the tag v1.2.3.
	afterTag = regexp.MustCompile(`^(.+)-([0-9]+)-g([0-9a-f]{4,40})$`)
	// v1.2.3, 1.2, v1.2.3-rc.1: a release tag, with a pre-release part.
	tagged = regexp.MustCompile(`^v?([0-9]+(?:\.[0-9]+)*)(?:-([0-9A-Za-z][0-9A-Za-z.-]*))?$`)
)
