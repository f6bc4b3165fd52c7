package helm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	guardOnce sync.Once
	guardBin  string
	guardErr  error
)

// builtGuard builds the guard from the repository (the main module) once,
// into a folder every user may read, for tests that run it as the pod's
// user.
func builtGuard(t *testing.T) string {
	t.Helper()
	guardOnce.Do(func() {
		dir, err := os.MkdirTemp("", "vg-helm-bin")
		if err != nil {
			guardErr = err
			return
		}
		os.Chmod(dir, 0o755)
		guardBin = filepath.Join(dir, "vllm-guard")
		cmd := exec.Command("go", "build", "-o", guardBin, "./cmd/vllm-guard")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -Wno-deprecated-declarations")
		if out, err := cmd.CombinedOutput(); err != nil {
			guardErr = fmt.Errorf("go build ./cmd/vllm-guard: %v\n%s", err, out)
		}
	})
	if guardErr != nil {
		t.Fatal(guardErr)
	}
	return guardBin
}

// kubeletFolders makes, under root, each of the pod's volume mounts as
// the kubelet makes it: an emptyDir root-owned 0777, with the setgid bit
// and the fsGroup as its group when the pod sets one (02777); a claim's
// root root-owned with the fsGroup's write and setgid bits (02775); other
// volumes (the ConfigMap) root's 0755.
func kubeletFolders(t *testing.T, root string, p guardPod) {
	t.Helper()
	gid := -1
	if sc := p.spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		gid = int(*sc.FSGroup)
	}
	for _, m := range p.container.VolumeMounts {
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		v := p.volumes[m.Name]
		mode := os.FileMode(0o755)
		switch {
		case v.EmptyDir != nil:
			mode = 0o777
		case v.PersistentVolumeClaim != nil:
			mode = 0o755
			if gid >= 0 {
				mode = 0o775
			}
		}
		if gid >= 0 && (v.EmptyDir != nil || v.PersistentVolumeClaim != nil) {
			mode |= os.ModeSetgid
			if err := os.Chown(dir, 0, gid); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
}

// podUser is who the pod's container runs as: runAsUser, runAsGroup, and
// the fsGroup as a supplementary group (root when the pod names nobody).
func podUser(p guardPod) *syscall.Credential {
	c := &syscall.Credential{Groups: []uint32{}}
	if sc := p.spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			c.Uid = uint32(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			c.Gid = uint32(*sc.RunAsGroup)
		}
		if sc.FSGroup != nil {
			c.Groups = append(c.Groups, uint32(*sc.FSGroup))
		}
	}
	return c
}

// The guard starts in the folders the kubelet makes: for the chart (as
// uid 1000 with fsGroup, and as root) and the plain manifests, the guard
// is run as the pod's user with the socket and state_dir the pod's TOML
// names, in folders made as the kubelet makes the volumes, and
// `vllm-guard status` with the pod's --config answers. With the socket
// directly in the emptyDir (0777) the guard exited 78.
func TestGuardStartsInTheKubeletsFolders(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("making folders as the kubelet does and running the guard as the pod's user needs root; run the tests as root (CI does)")
	}
	bin := builtGuard(t)
	for _, tc := range []struct {
		name string
		o    func(t *testing.T) objects
	}{
		{"chart", func(t *testing.T) objects { return decodeAll(t, render(t).Manifests) }},
		{"chart as root", func(t *testing.T) objects { return decodeAll(t, render(t, "nonRoot.enabled=false").Manifests) }},
		{"manifests", func(t *testing.T) objects { return decodeAll(t, readManifests(t, manifestsDir)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := checkGuardPod(t, tc.o(t))
			root, err := os.MkdirTemp("", "vg-pod")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(root) })
			if err := os.Chmod(root, 0o755); err != nil {
				t.Fatal(err)
			}
			kubeletFolders(t, root, p)
			runGuardInPod(t, bin, root, p)
		})
	}
}

// runGuardInPod runs the guard as the pod's user with the pod's socket
// and state_dir under root, vLLM a sleeping stand-in; it waits for the
// control socket, asks `status`, and stops the guard with SIGTERM.
func runGuardInPod(t *testing.T, bin, root string, p guardPod) {
	t.Helper()
	// A free port for the stand-in, which never listens: the guard stays
	// in starting. The pod's own ports (0.0.0.0:9461, :8080) are left out,
	// so that the test takes no fixed port on a shared machine.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	socket := filepath.Join(root, p.cfg.Control.Socket)
	toml := fmt.Sprintf(`[vllm]
command = ["/bin/sh", "-c", "exec sleep 600", "vllm"]
port = %d

[control]
socket = %q
http_listen = ""
state_dir = %q

[log]
format = "json"
`, port, socket, filepath.Join(root, p.cfg.Control.StateDir))
	cfgFile := filepath.Join(root, "etc", "pod.toml")
	os.MkdirAll(filepath.Dir(cfgFile), 0o755)
	if err := os.WriteFile(cfgFile, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	user := podUser(p)
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + root}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	guard := exec.CommandContext(ctx, bin, "run", "--config", cfgFile)
	guard.Dir = root
	guard.Env = env
	guard.SysProcAttr = &syscall.SysProcAttr{Credential: user}
	// Its log comes through a pipe of our own (not StderrPipe, which Wait
	// would close under the reader); it ends when the guard's tree is gone.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	guard.Stderr = w
	err = guard.Start()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	// The guard says when its socket listens; if it ends first, its log
	// says why.
	listening := make(chan struct{})
	logDone := make(chan string, 1)
	go func() {
		defer r.Close()
		var log strings.Builder
		lines := bufio.NewScanner(r)
		for lines.Scan() {
			log.WriteString(lines.Text() + "\n")
			if strings.Contains(lines.Text(), `"control socket listening"`) {
				close(listening)
			}
		}
		logDone <- log.String()
	}()
	exited := false
	defer func() {
		if !exited {
			guard.Process.Kill()
			guard.Wait()
		}
		if log := <-logDone; t.Failed() {
			t.Logf("the guard's log:\n%s", log)
		}
	}()
	select {
	case <-listening:
	case log := <-logDone:
		err := guard.Wait()
		exited = true
		logDone <- log
		t.Fatalf("the guard as uid %d gid %d %v ended before its socket listened (%v), in folders made as the kubelet makes them", user.Uid, user.Gid, user.Groups, err)
	}
	if info, err := os.Lstat(filepath.Dir(socket)); err != nil {
		t.Error(err)
	} else if info.Mode().Perm() != 0o750 || info.Sys().(*syscall.Stat_t).Uid != user.Uid {
		t.Errorf("the socket's folder: %v, uid %d; want the guard's own (uid %d), 0750", info.Mode(), info.Sys().(*syscall.Stat_t).Uid, user.Uid)
	}

	// `kubectl exec deploy/vllm -- vllm-guard status`: the pod's user,
	// the socket found through --config.
	st := exec.CommandContext(ctx, bin, "status", "--json", "--config", cfgFile)
	st.Dir = root
	st.Env = env
	st.SysProcAttr = &syscall.SysProcAttr{Credential: user}
	out, err := st.Output()
	var doc struct {
		Guard struct {
			State string `json:"state"`
		} `json:"guard"`
	}
	if jerr := json.Unmarshal(out, &doc); jerr != nil || doc.Guard.State != "starting" {
		t.Errorf("vllm-guard status --json: %v, %v:\n%s", err, jerr, out)
	}

	if err := guard.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = guard.Wait()
	exited = true
	if err != nil {
		t.Errorf("the guard after SIGTERM: %v; want exit 0", err)
	}
}
