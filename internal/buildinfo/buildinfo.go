// Package buildinfo owns what a build of vllm-guard says about itself: the
// version and revision stamped by the build (the Makefile and the
// Dockerfile pass them with -ldflags -X), else what the Go toolchain
// recorded (the VCS revision of a plain `go build` in a checkout).
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Set at build time:
//
//	go build -ldflags "-X github.com/vllm-guard/vllm-guard/internal/buildinfo.Version=v1.2.0 \
//	  -X github.com/vllm-guard/vllm-guard/internal/buildinfo.Revision=$(git rev-parse HEAD)"
var (
	Version  = "dev"
	Revision = ""
)

// Info is the build's identity, as `vllm-guard version` and the
// vllm_guard_build_info metric show it.
type Info struct {
	Version   string `json:"version"`
	Revision  string `json:"revision"`
	GoVersion string `json:"goversion"`
}

// Get returns the stamped version and revision; a revision not stamped is
// the VCS revision Go recorded (with "-dirty" for uncommitted changes),
// else "unknown".
func Get() Info {
	return get(Version, Revision, debug.ReadBuildInfo)
}

func get(version, revision string, read func() (*debug.BuildInfo, bool)) Info {
	if revision == "" {
		revision = "unknown"
		if bi, ok := read(); ok {
			var rev, modified string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if rev != "" {
				revision = rev
				if modified == "true" {
					revision += "-dirty"
				}
			}
		}
	}
	if version == "" {
		version = "dev"
	}
	return Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
}
