package group

import (
	"bytes"
	"errors"
	"testing"
)

func TestReportRoundTrip(t *testing.T) {
	key := sessionKey(secret, []byte("listener-nonce"), []byte("dialer-nonce"))
	f := Frame{From: 3, Incarnation: 1 << 60, Counter: 42, Report: Report{Kind: Open, Epoch: 9, Rung: 2}}
	got, err := decodeReport(key, encodeReport(key, f))
	if err != nil || got != f {
		t.Fatalf("round trip: %+v %v, want %+v", got, err, f)
	}
	other := sessionKey(secret, []byte("listener-nonce"), []byte("another-nonce"))
	if _, err := decodeReport(other, encodeReport(key, f)); !errors.Is(err, ErrMAC) {
		t.Errorf("another connection's key: %v, want ErrMAC", err)
	}
	b := encodeReport(key, f)
	b[16]++ // the epoch, changed in flight
	if _, err := decodeReport(key, b); !errors.Is(err, ErrMAC) {
		t.Errorf("a changed epoch: %v, want ErrMAC", err)
	}
	bad := encodeReport(key, Frame{From: 1, Counter: 1, Report: Report{Kind: 99}})
	if _, err := decodeReport(key, bad); !errors.Is(err, ErrUnknown) {
		t.Errorf("a signed unknown kind: %v, want ErrUnknown", err)
	}
	if _, err := decodeReport(key, b[:40]); !errors.Is(err, ErrFrame) {
		t.Errorf("a short frame: %v, want ErrFrame", err)
	}
}

// A follower's Idle carries the cause its guard gave its own vLLM's end,
// as a code of the closed table: nothing else carries one, and a code
// past the table is refused even when signed.
func TestTheFaultTravelsOnlyWithIdle(t *testing.T) {
	key := sessionKey(secret, []byte("l"), []byte("d"))
	idle := Frame{From: 1, Counter: 7, Report: Report{Kind: Idle, Epoch: 4, Fault: FaultOf("oom")}}
	got, err := decodeReport(key, encodeReport(key, idle))
	if err != nil || got != idle || got.Report.Fault.Word() != "oom" {
		t.Fatalf("an Idle with an OOM: %+v %v", got, err)
	}
	for _, f := range []Frame{
		{From: 1, Counter: 8, Report: Report{Kind: Ended, Epoch: 4, Fault: FaultOf("oom")}},
		{From: 1, Counter: 9, Report: Report{Kind: Idle, Epoch: 4, Fault: lastFault + 1}},
	} {
		if _, err := decodeReport(key, encodeReport(key, f)); !errors.Is(err, ErrFrame) {
			t.Errorf("%+v: %v, want ErrFrame", f.Report, err)
		}
	}
	if FaultOf("group") != 0 || FaultOf("") != 0 || FaultOf("config_error").Word() != "config_error" {
		t.Error("the fault table: the group's own cause or nothing must have no code")
	}
}

// The decoders take any bytes: an error or a frame that encodes back to
// the same bytes, never a panic.
func FuzzDecode(f *testing.F) {
	key := sessionKey(secret, []byte("a"), []byte("b"))
	f.Add(encodeReport(key, Frame{From: 1, Counter: 1, Report: Report{Kind: Running, Epoch: 1}}))
	f.Add(encodeHello(bytes.Repeat([]byte{7}, 32)))
	f.Add([]byte("VGG"))
	f.Add(bytes.Repeat([]byte{0xff}, FrameSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		if fr, err := decodeReport(key, b); err == nil {
			if !bytes.Equal(encodeReport(key, fr), b) {
				t.Fatalf("%x decodes to %+v, which encodes otherwise", b, fr)
			}
		}
		if n, err := decodeHello(b); err == nil && !bytes.Equal(encodeHello(n), b) {
			t.Fatalf("%x: a hello that encodes otherwise", b)
		}
		// Past the signature: the frame's form alone (what an attacker
		// holding the secret could send).
		if len(b) == FrameSize {
			signed := append([]byte(nil), b...)
			signed = encodeReportRaw(key, signed)
			if fr, err := decodeReport(key, signed); err == nil && !bytes.Equal(encodeReport(key, fr), signed) {
				t.Fatalf("%x decodes to %+v, which encodes otherwise", signed, fr)
			}
		}
	})
}

// encodeReportRaw signs b's first 40 bytes as they are.
func encodeReportRaw(key, b []byte) []byte {
	copy(b, magic[:])
	b[3], b[4] = version, typeReport
	m := newMAC(key)
	m.Write(b[:macAt])
	copy(b[macAt:], m.Sum(nil))
	return b
}
