package adapters

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// vLLM's port, read from the operating system (off the machine's loop):
// whether vLLM can bind it, who holds it when not, and whether the listener
// a connection reaches belongs to vLLM's own process tree.
//
// Two instance configs that share vLLM's port (a copy-paste mistake) made
// the second guard call the first instance's vLLM ready (issue 32 item 4);
// a listener of user nobody started on the port while vLLM loaded received
// the guard's probes, API key included, and one that bound the port during
// a backoff stopped the service with exit 78 (issue 41). So: "in use" is
// decided by the bind vLLM will make, tried before each launch (not by
// reading /proc/net/tcp, which cannot tell an IPV6_V6ONLY listener on [::]
// from a dual-stack one); /proc/net/tcp only names the holder; and a
// probe reaches vLLM only over a connection whose listeners, and whose
// accepting process once there is one, are of vLLM's tree.

// listener is one socket of /proc/net/tcp or tcp6: a listening one
// (state 0A), or with its peer (rip, rport) one end of a connection.
type Listener struct {
	Ip    net.IP
	Port  int
	Uid   int
	Inode uint64 // 0 for a connection not accepted yet (in a listener's queue)
	State string
	Rip   net.IP
	Rport int
}

// portHolder tries the bind vLLM will make for host:port and returns ""
// when it works, else who holds the port. vLLM 0.32.0
// (vllm/entrypoints/launchers/launcher.py create_server_socket) makes an
// AF_INET6 socket when host is an IPv6 literal and AF_INET otherwise
// ("" is 0.0.0.0, a name is resolved to its first IPv4 address), sets
// SO_REUSEADDR (a port in TIME_WAIT is free), leaves IPV6_V6ONLY at the
// system's default, and binds; so does the trial. SO_REUSEPORT, which
// vLLM sets only with --api-server-count > 1, is not: a second instance
// of the same user could then share the port, which is what the trial
// is for. Only EADDRINUSE is "held": any other error (a name that does
// not resolve, an address not of this host, a port below 1024) is vLLM's
// to report, and it will.
func PortHolder(host string, port int) string {
	family, sa, ok := BindAddr(host, port)
	if !ok {
		return ""
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer syscall.Close(fd)
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		return ""
	}
	if err := syscall.Bind(fd, sa); !errors.Is(err, syscall.EADDRINUSE) {
		return ""
	}
	return NameHolder(family, sa, port)
}

// bindAddr is the family and address vLLM binds for host; ok is false when
// vLLM itself would fail before the bind (a name that does not resolve).
func BindAddr(host string, port int) (family int, sa syscall.Sockaddr, ok bool) {
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		s := &syscall.SockaddrInet6{Port: port, Addr: a.As16()}
		if z := a.Zone(); z != "" {
			if ifi, err := net.InterfaceByName(z); err == nil {
				s.ZoneId = uint32(ifi.Index)
			}
		}
		return syscall.AF_INET6, s, true
	}
	s := &syscall.SockaddrInet4{Port: port}
	if host != "" {
		a, err := netip.ParseAddr(host)
		if err != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			addrs, lerr := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
			if lerr != nil || len(addrs) == 0 {
				return 0, nil, false
			}
			a = addrs[0]
		}
		s.Addr = a.Unmap().As4()
	}
	return syscall.AF_INET, s, true
}

// nameHolder names who holds the port that the bind of sa (family) met:
// the listeners in its way, by pid and command, or a bound socket the
// guard cannot see when none listens.
func NameHolder(family int, sa syscall.Sockaddr, port int) string {
	var ours net.IP
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		ours = net.IP(a.Addr[:])
	case *syscall.SockaddrInet6:
		ours = net.IP(a.Addr[:])
	}
	// A listener of vLLM's own family is named first; a [::] is named only
	// when nothing else can be in the way (it may be IPV6_V6ONLY, and then
	// an IPv4 bind does not meet it).
	var same, other []string
	for _, l := range ReadListeners() {
		if l.Port != port {
			continue
		}
		switch InTheWay(family, ours, l.Ip) {
		case 1:
			same = append(same, DescribeHolder(l))
		case 2:
			other = append(other, DescribeHolder(l))
		}
	}
	if len(same) == 0 {
		same = other
	}
	if len(same) == 0 {
		return fmt.Sprintf("a socket bound to port %d that does not listen yet (another vLLM loading?)", port)
	}
	return strings.Join(same, "; ")
}

// inTheWay says whether a listener on ip may be what stopped a bind of
// ours (family): 1 for the same address or a wildcard of the same family
// on either side, 2 for a [::] in the way of an IPv4 bind (only when it
// is dual-stack), 0 for none.
func InTheWay(family int, ours, ip net.IP) int {
	v4 := ip.To4() != nil
	switch {
	case ours.Equal(ip):
		return 1
	case family == syscall.AF_INET && v4:
		if ours.IsUnspecified() || ip.IsUnspecified() {
			return 1
		}
	case family == syscall.AF_INET:
		if ip.IsUnspecified() {
			return 2
		}
	case ours.IsUnspecified() || ip.IsUnspecified() && !v4:
		return 1 // a dual-stack [::] meets every listener; any [::] meets an IPv6 bind
	}
	return 0
}

// readSockets is every TCP socket of this network namespace, as
// /proc/net/tcp and tcp6 list them (the kernel writes the whole table: a
// read costs milliseconds on a busy host, so it is made per connection,
// never per refused attempt).
func ReadSockets() []Listener {
	var ls []Listener
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		ls = append(ls, ParseSockets(b)...)
	}
	return ls
}

// readListeners is every listening TCP socket of this network namespace.
func ReadListeners() []Listener { return Listening(ReadSockets()) }

func Listening(ls []Listener) []Listener {
	var out []Listener
	for _, l := range ls {
		if l.State == "0A" {
			out = append(out, l)
		}
	}
	return out
}

// parseListeners reads the LISTEN (state 0A) sockets of a /proc/net/tcp or
// tcp6 table.
func ParseListeners(b []byte) []Listener { return Listening(ParseSockets(b)) }

// parseSockets reads a /proc/net/tcp or tcp6 table: "sl local_address
// rem_address st … uid timeout inode".
func ParseSockets(b []byte) []Listener {
	var out []Listener
	sc := bufio.NewScanner(bytes.NewReader(b))
	first := true
	for sc.Scan() {
		if first { // the header
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			continue
		}
		ip, port, ok := ProcAddr(f[1])
		rip, rport, rok := ProcAddr(f[2])
		if !ok || !rok {
			continue
		}
		uid, _ := strconv.Atoi(f[7])
		inode, _ := strconv.ParseUint(f[9], 10, 64)
		out = append(out, Listener{Ip: ip, Port: port, Uid: uid, Inode: inode, State: f[3], Rip: rip, Rport: rport})
	}
	return out
}

// procAddr decodes "HEXIP:HEXPORT".
func ProcAddr(s string) (net.IP, int, bool) {
	addr, portHex, ok := strings.Cut(s, ":")
	if !ok {
		return nil, 0, false
	}
	ip := ProcIP(addr)
	p, err := strconv.ParseUint(portHex, 16, 16)
	if ip == nil || err != nil {
		return nil, 0, false
	}
	return ip, int(p), true
}

// procIP decodes the kernel's hex address: 32-bit words in host (little
// endian) order, one for IPv4, four for IPv6.
func ProcIP(s string) net.IP {
	b, err := hex.DecodeString(s)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return nil
	}
	for i := 0; i+4 <= len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	return net.IP(b)
}

// takers are the listeners that may take a connection to dst, as the
// kernel picks one: a listener on dst's own address first, then, for an
// IPv4 dst, one on 0.0.0.0 before a dual-stack [::] (an IPv4 socket scores
// higher, and a [::] that coexists with a 0.0.0.0 on the same port is
// IPV6_V6ONLY and takes no IPv4 at all), then [::].
func Takers(ls []Listener, dst *net.TCPAddr) []Listener {
	var exact, any4, any6 []Listener
	for _, l := range ls {
		switch {
		case l.Port != dst.Port:
		case l.Ip.Equal(dst.IP):
			exact = append(exact, l)
		case l.Ip.Equal(net.IPv4zero) && len(l.Ip) == net.IPv4len:
			if dst.IP.To4() != nil {
				any4 = append(any4, l)
			}
		case l.Ip.Equal(net.IPv6unspecified):
			any6 = append(any6, l)
		}
	}
	for _, set := range [][]Listener{exact, any4, any6} {
		if len(set) > 0 {
			return set
		}
	}
	return nil
}

// notVLLMs is a connection refused before a byte was sent: the listener it
// reached is not held by vLLM's process tree.
type NotVLLMs struct{ Why string }

func (e *NotVLLMs) Error() string { return e.Why }

// servedByTree says whether the connection from local to remote (just
// made) reaches vLLM's tree, from one read of the socket tables: every
// listener that may have taken it is held by a process of tree, and if a
// process has accepted it already, that process is one of tree (a
// listener that accepted and closed, replaced by vLLM's since, is caught
// by its accepted end). Not yet accepted (inode 0), it waits in the queue
// of a listener that is there now: one of the tree's. When not, an error
// that names the holder.
func ServedByTree(local, remote *net.TCPAddr, tree []int) error {
	return servedBy(local, remote, func(inode uint64) bool { return TreeHolds(tree, inode) })
}

// servedBy judges the connection from local to remote with ours: the
// sockets from sock_diag, or from /proc/net/tcp where the kernel does not
// answer it.
func servedBy(local, remote *net.TCPAddr, ours func(inode uint64) bool) error {
	socks, err := diagSockets(local, remote)
	if err != nil {
		socks = ReadSockets()
	}
	return JudgeConn(socks, local, remote, ours)
}

func JudgeConn(socks []Listener, local, remote *net.TCPAddr, ours func(inode uint64) bool) error {
	ls := Takers(Listening(socks), remote)
	if len(ls) == 0 {
		return &NotVLLMs{fmt.Sprintf("no listener on %s is in /proc/net/tcp: cannot tell that it is vLLM's", remote)}
	}
	for _, l := range ls {
		if !ours(l.Inode) {
			return &NotVLLMs{fmt.Sprintf("the listener on %s is not vLLM's: %s", remote, DescribeHolder(l))}
		}
	}
	for _, c := range socks {
		if c.State != "0A" && c.Port == remote.Port && c.Rport == local.Port && c.Ip.Equal(remote.IP) && c.Rip.Equal(local.IP) &&
			c.Inode != 0 && !ours(c.Inode) {
			return &NotVLLMs{fmt.Sprintf("the connection to %s was accepted by a process that is not vLLM's: %s", remote, DescribeHolder(c))}
		}
	}
	return nil
}

// treeHolds says whether a process of tree has a descriptor on socket
// inode. Only the tree's own descriptors are read: a handful of processes,
// not the whole of /proc.
func TreeHolds(tree []int, inode uint64) bool {
	if inode == 0 {
		return false
	}
	want := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	for _, pid := range tree {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if t, err := os.Readlink(dir + fd.Name()); err == nil && t == want {
				return true
			}
		}
	}
	return false
}

// describeHolder names the process that holds l: "pid 123 (python3 -m
// vllm…)", with secrets masked; or its uid when the guard cannot see its
// descriptors (another user's process).
func DescribeHolder(l Listener) string {
	addr := net.JoinHostPort(l.Ip.String(), strconv.Itoa(l.Port))
	on := "listening on "
	if l.State != "0A" {
		on = "on "
	}
	if pid := SocketOwner(l.Inode); pid > 0 {
		return fmt.Sprintf("pid %d (%s), %s%s", pid, CommandLine(pid), on, addr)
	}
	return fmt.Sprintf("a process of uid %d that the guard cannot see into, %s%s", l.Uid, on, addr)
}

// socketOwner finds the process with a descriptor on socket inode.
func SocketOwner(inode uint64) int {
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
func CommandLine(pid int) string {
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
