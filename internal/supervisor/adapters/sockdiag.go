package adapters

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// The kernel's socket diagnostics (sock_diag(7), NETLINK_SOCK_DIAG) answer
// the two questions VLLMOnly asks of each new connection — which sockets
// listen, and which socket accepted this one — without reading
// /proc/net/tcp, whose cost grows with every socket of the namespace (the
// proxy's own clients included): a dump of listening sockets walks only
// the listening hash, and a connection is looked up by its four-tuple.

const (
	sockDiagByFamily = 20 // SOCK_DIAG_BY_FAMILY
	tcpListen        = 10 // TCP_LISTEN
	diagReqLen       = 56 // struct inet_diag_req_v2
	diagMsgLen       = 72 // struct inet_diag_msg
)

// diagSockets is what sock_diag says about a connection from local to
// remote: every listening TCP socket (both families), and the socket that
// accepted the connection (Inode 0 while it waits in the listener's
// queue; none when the kernel has no such socket).
func diagSockets(local, remote *net.TCPAddr) ([]Listener, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []Listener
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		ls, err := diagAsk(fd, diagRequest(fam, 1<<tcpListen, nil, nil, true), true)
		if err != nil {
			return nil, err
		}
		out = append(out, ls...)
	}
	// The accepted side: vLLM's address as its local one. A dual-stack
	// listener accepts an IPv4 client on an AF_INET6 socket (v4-mapped).
	fams := []uint8{unix.AF_INET6}
	if remote.IP.To4() != nil {
		fams = []uint8{unix.AF_INET, unix.AF_INET6}
	}
	for _, fam := range fams {
		ls, err := diagAsk(fd, diagRequest(fam, ^uint32(0), remote, local, false), false)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, err
		}
		if len(ls) > 0 {
			return append(out, ls...), nil
		}
	}
	return out, nil
}

// diagRequest is a netlink message holding an inet_diag_req_v2 for TCP in
// family fam: a dump of the sockets in states, or (dump false) the one
// socket whose local end is src and remote end dst.
func diagRequest(fam uint8, states uint32, src, dst *net.TCPAddr, dump bool) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN+diagReqLen)
	flags := uint16(unix.NLM_F_REQUEST)
	if dump {
		flags |= unix.NLM_F_DUMP
	}
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:], sockDiagByFamily)
	binary.NativeEndian.PutUint16(b[6:], flags)
	binary.NativeEndian.PutUint32(b[8:], 1) // seq
	r := b[unix.NLMSG_HDRLEN:]
	r[0], r[1] = fam, unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(r[4:], states)
	id := r[8:]
	if src != nil {
		binary.BigEndian.PutUint16(id[0:], uint16(src.Port))
		binary.BigEndian.PutUint16(id[2:], uint16(dst.Port))
		putDiagIP(id[4:20], fam, src.IP)
		putDiagIP(id[20:36], fam, dst.IP)
	}
	binary.NativeEndian.PutUint32(id[40:], ^uint32(0)) // INET_DIAG_NOCOOKIE
	binary.NativeEndian.PutUint32(id[44:], ^uint32(0))
	return b
}

func putDiagIP(dst []byte, fam uint8, ip net.IP) {
	if fam == unix.AF_INET {
		copy(dst, ip.To4())
		return
	}
	copy(dst, ip.To16()) // an IPv4 address as v4-mapped
}

// diagAsk sends req and reads the answers to its end: NLMSG_DONE after a
// dump, the one answer (or an error) to a lookup.
func diagAsk(fd int, req []byte, dump bool) ([]Listener, error) {
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out []Listener
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("sock_diag: a short error")
				}
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					return nil, unix.Errno(-e)
				}
				return out, nil
			case sockDiagByFamily:
				l, err := parseDiagMsg(m.Data)
				if err != nil {
					return nil, err
				}
				out = append(out, l)
			}
		}
		if !dump && len(out) > 0 {
			return out, nil // one answer to a lookup, no NLMSG_DONE
		}
	}
}

// parseDiagMsg reads an inet_diag_msg as a Listener (the state written as
// /proc/net/tcp writes it: "0A" for LISTEN).
func parseDiagMsg(b []byte) (Listener, error) {
	if len(b) < diagMsgLen {
		return Listener{}, fmt.Errorf("sock_diag: an answer of %d bytes, want %d", len(b), diagMsgLen)
	}
	fam := b[0]
	ip := func(p []byte) net.IP {
		if fam == unix.AF_INET {
			return net.IP(append([]byte(nil), p[:4]...)).To4()
		}
		return net.IP(append([]byte(nil), p[:16]...))
	}
	id := b[4:52]
	return Listener{
		State: fmt.Sprintf("%02X", b[1]),
		Port:  int(binary.BigEndian.Uint16(id[0:])),
		Rport: int(binary.BigEndian.Uint16(id[2:])),
		Ip:    ip(id[4:20]),
		Rip:   ip(id[20:36]),
		Uid:   int(binary.NativeEndian.Uint32(b[64:])),
		Inode: uint64(binary.NativeEndian.Uint32(b[68:])),
	}, nil
}
