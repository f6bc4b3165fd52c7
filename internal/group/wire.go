package group

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
)

// Every message between two guards is one frame of FrameSize bytes: a
// fixed size, so nothing a peer sends makes a guard buffer more, and no
// text at all.
//
//	0  "VGG" magic, then the version (2)
//	4  type: 1 hello (the connection's nonce, unsigned), 2 report (signed)
//	5  the report's Kind
//	6  the sender's rank (uint16)
//	8  the sender's incarnation (uint64: a random number per guard start)
//	16 the epoch (uint64)
//	24 the counter (uint64: strictly increasing on one connection)
//	32 the rung (uint32)
//	36 the fault: the cause a follower's guard gave its own vLLM's end
//	   (a code of a closed table, Fault), with Idle only
//	37 zero
//	40 hello: the nonce (32 bytes); report: HMAC-SHA256 of bytes 0..40 under
//	   the connection's key, HMAC-SHA256(secret, label, the listener's
//	   nonce, the dialer's nonce): a frame of another connection, or of
//	   another secret, fails it.
const FrameSize = 72

const (
	version    = 2
	typeHello  = 1
	typeReport = 2
	macAt      = 40
	// MinSecret is the shortest shared secret the guards accept.
	MinSecret = 16
)

var magic = [3]byte{'V', 'G', 'G'}

// keyLabel separates this protocol's keys from any other use of the secret.
const keyLabel = "vllm-guard group v1"

// Frame is a decoded report.
type Frame struct {
	From        int
	Incarnation uint64
	Counter     uint64
	Report      Report
}

// Errors a frame is refused with.
var (
	ErrFrame   = errors.New("not a group frame")
	ErrMAC     = errors.New("signature does not match: another secret, or a frame of another connection")
	ErrReplay  = errors.New("counter not above the last one: a replay")
	ErrUnknown = errors.New("unknown kind")
)

// sessionKey is one connection's key: both nonces and the secret.
func sessionKey(secret, listenerNonce, dialerNonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(keyLabel))
	m.Write(listenerNonce)
	m.Write(dialerNonce)
	return m.Sum(nil)
}

func header(typ byte) []byte {
	b := make([]byte, FrameSize)
	copy(b, magic[:])
	b[3], b[4] = version, typ
	return b
}

// encodeHello is a connection's first frame: its nonce.
func encodeHello(nonce []byte) []byte {
	b := header(typeHello)
	copy(b[macAt:], nonce)
	return b
}

// decodeHello reads the peer's nonce.
func decodeHello(b []byte) ([]byte, error) {
	if err := checkHeader(b, typeHello); err != nil {
		return nil, err
	}
	for _, x := range b[5:macAt] {
		if x != 0 {
			return nil, fmt.Errorf("%w: a hello with data", ErrFrame)
		}
	}
	return append([]byte(nil), b[macAt:]...), nil
}

// encodeReport signs f under key.
func encodeReport(key []byte, f Frame) []byte {
	b := header(typeReport)
	b[5] = byte(f.Report.Kind)
	binary.BigEndian.PutUint16(b[6:], uint16(f.From))
	binary.BigEndian.PutUint64(b[8:], f.Incarnation)
	binary.BigEndian.PutUint64(b[16:], f.Report.Epoch)
	binary.BigEndian.PutUint64(b[24:], f.Counter)
	binary.BigEndian.PutUint32(b[32:], uint32(f.Report.Rung))
	b[36] = byte(f.Report.Fault)
	m := newMAC(key)
	m.Write(b[:macAt])
	copy(b[macAt:], m.Sum(nil))
	return b
}

func newMAC(key []byte) hash.Hash { return hmac.New(sha256.New, key) }

// decodeReport checks a report's form and signature under key; the
// counter and the sender's rank are the connection's to check.
func decodeReport(key, b []byte) (Frame, error) {
	if err := checkHeader(b, typeReport); err != nil {
		return Frame{}, err
	}
	m := newMAC(key)
	m.Write(b[:macAt])
	if !hmac.Equal(m.Sum(nil), b[macAt:]) {
		return Frame{}, ErrMAC
	}
	k := Kind(b[5])
	if k < Open || k > lastKind {
		return Frame{}, fmt.Errorf("%w %d", ErrUnknown, b[5])
	}
	fault := Fault(b[36])
	if fault > lastFault || (fault != 0 && k != Idle) {
		return Frame{}, fmt.Errorf("%w: fault %d with %s", ErrFrame, b[36], k)
	}
	for _, x := range b[37:macAt] {
		if x != 0 {
			return Frame{}, fmt.Errorf("%w: reserved bytes set", ErrFrame)
		}
	}
	rung := binary.BigEndian.Uint32(b[32:])
	if rung > 1<<16 {
		return Frame{}, fmt.Errorf("%w: rung %d", ErrFrame, rung)
	}
	return Frame{
		From:        int(binary.BigEndian.Uint16(b[6:])),
		Incarnation: binary.BigEndian.Uint64(b[8:]),
		Counter:     binary.BigEndian.Uint64(b[24:]),
		Report:      Report{Kind: k, Epoch: binary.BigEndian.Uint64(b[16:]), Rung: int(rung), Fault: fault},
	}, nil
}

func checkHeader(b []byte, typ byte) error {
	if len(b) != FrameSize {
		return fmt.Errorf("%w: %d bytes, not %d", ErrFrame, len(b), FrameSize)
	}
	if [3]byte(b[:3]) != magic || b[3] != version {
		return fmt.Errorf("%w: no vllm-guard group magic or version", ErrFrame)
	}
	if b[4] != typ {
		return fmt.Errorf("%w: type %d where %d was due", ErrFrame, b[4], typ)
	}
	return nil
}
