package supervisor

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// Two instance configs that share vLLM's port (a copy-paste mistake) made
// the second guard call the first instance's vLLM ready: it answered the
// probes 0.27 s after the launch, and the second vLLM died 9 s later with
// "Address already in use" (issue 32 item 4). Before a launch the guard
// looks for a listener on the port in /proc/net/tcp and tcp6 and names its
// holder (pid and command, from the socket's inode in /proc/*/fd), and
// does not launch: vLLM would fail to bind, and meanwhile the holder would
// answer for it.

// listener is one listening socket of /proc/net/tcp or tcp6.
type listener struct {
	ip    net.IP
	port  int
	uid   int
	inode uint64
}

// portHolder says who listens where vLLM will bind host:port ("" when the
// port is free). host is vLLM's --host: "", 0.0.0.0 and :: are every
// address, a name is resolved.
func portHolder(host string, port int) string {
	var ls []listener
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		ls = append(ls, parseListeners(b)...)
	}
	for _, l := range ls {
		if l.port == port && clashes(host, l.ip) {
			return describeHolder(l)
		}
	}
	return ""
}

// listenerOwners are the processes that hold a listening socket on port.
func listenerOwners(port int) []int {
	var out []int
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range parseListeners(b) {
			if l.port == port {
				if pid := socketOwner(l.inode); pid > 0 {
					out = append(out, pid)
				}
			}
		}
	}
	return out
}

// parseListeners reads the LISTEN (state 0A) sockets of a /proc/net/tcp or
// tcp6 table: "sl local_address rem_address st … uid timeout inode".
func parseListeners(b []byte) []listener {
	var out []listener
	sc := bufio.NewScanner(bytes.NewReader(b))
	first := true
	for sc.Scan() {
		if first { // the header
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[3] != "0A" {
			continue
		}
		addr, portHex, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		ip := procIP(addr)
		p, err := strconv.ParseUint(portHex, 16, 16)
		if ip == nil || err != nil {
			continue
		}
		uid, _ := strconv.Atoi(f[7])
		inode, _ := strconv.ParseUint(f[9], 10, 64)
		out = append(out, listener{ip: ip, port: int(p), uid: uid, inode: inode})
	}
	return out
}

// procIP decodes the kernel's hex address: 32-bit words in host (little
// endian) order, one for IPv4, four for IPv6.
func procIP(s string) net.IP {
	b, err := hex.DecodeString(s)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return nil
	}
	for i := 0; i+4 <= len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	return net.IP(b)
}

// clashes says whether vLLM binding host would meet a listener on ip (the
// same port): either is a wildcard, or they are the same address.
func clashes(host string, ip net.IP) bool {
	if ip.IsUnspecified() {
		return true
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		return true
	}
	ours := []net.IP{net.ParseIP(host)}
	if ours[0] == nil {
		addrs, err := net.LookupIP(host)
		if err != nil {
			return true // vLLM will resolve it somehow; any listener may be in the way
		}
		ours = addrs
	}
	for _, o := range ours {
		if o.Equal(ip) {
			return true
		}
	}
	return false
}

// describeHolder names the process that holds l: "pid 123 (python3 -m
// vllm…)", with secrets masked; or its uid when the guard cannot see its
// descriptors (another user's process).
func describeHolder(l listener) string {
	addr := net.JoinHostPort(l.ip.String(), strconv.Itoa(l.port))
	if pid := socketOwner(l.inode); pid > 0 {
		return fmt.Sprintf("pid %d (%s), listening on %s", pid, commandLine(pid), addr)
	}
	return fmt.Sprintf("a process of uid %d that the guard cannot see into, listening on %s", l.uid, addr)
}

// socketOwner finds the process with a descriptor on socket inode.
func socketOwner(inode uint64) int {
	if inode == 0 {
		return 0
	}
	want := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(p + "/fd")
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if t, err := os.Readlink(p + "/fd/" + fd.Name()); err == nil && t == want {
				return pid
			}
		}
	}
	return 0
}

// commandLine is pid's command line, secrets masked, cut so that the
// decision's one-line reason still names the pid and the address.
func commandLine(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return "command unknown"
	}
	argv := vllmargs.MaskArgv(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil)
	s := strings.Join(argv, " ")
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return s
}
