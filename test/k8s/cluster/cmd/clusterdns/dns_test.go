package main

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// testZone is a zone over these objects, as the informers would list them.
func testZone(t *testing.T, objs ...any) zone {
	t.Helper()
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	svcs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Pod:
			err = pods.Add(o)
		case *corev1.Service:
			err = svcs.Add(o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return zone{domain: "cluster.local", pods: listersv1.NewPodLister(pods), services: listersv1.NewServiceLister(svcs)}
}

func pod(ns, name, host, sub, ip string, lbl map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec: corev1.PodSpec{Hostname: host, Subdomain: sub}, Status: corev1.PodStatus{PodIP: ip}}
}

// serve answers on a loopback UDP port as main does; Go's own resolver,
// dialled there, is the oracle for what a pod's resolver reads.
func serve(t *testing.T, z zone) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := answer(buf[:n], z.lookup); out != nil {
				pc.WriteTo(out, from)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

func TestAPodByHostnameAndSubdomainAndAService(t *testing.T) {
	z := testZone(t,
		pod("default", "group-0", "group-0", "group", "10.244.0.7", map[string]string{"app": "g"}),
		pod("default", "group-0-1", "group-0-1", "group", "10.244.0.8", map[string]string{"app": "g"}),
		pod("other", "group-0", "group-0", "group", "10.244.0.9", nil),
		pod("default", "loading", "loading", "group", "", nil), // no IP yet
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "api"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.4.5"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "group"}, Spec: corev1.ServiceSpec{ClusterIP: "None", Selector: map[string]string{"app": "g"}}},
	)
	r := serve(t, z)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		q    string
		want []string
	}{
		{"group-0.group.default.svc.cluster.local.", []string{"10.244.0.7"}},
		{"GROUP-0-1.Group.default.svc.cluster.local", []string{"10.244.0.8"}},
		{"group-0.group.other.svc.cluster.local.", []string{"10.244.0.9"}},
		{"api.default.svc.cluster.local.", []string{"10.96.4.5"}},
		{"group.default.svc.cluster.local.", []string{"10.244.0.7", "10.244.0.8"}},
	} {
		got, err := r.LookupHost(ctx, c.q)
		slices.Sort(got)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("LookupHost(%q) = %v, %v; want %v", c.q, got, err, c.want)
		}
	}
	for _, q := range []string{
		"group-1.group.default.svc.cluster.local.", // no such pod
		"loading.group.default.svc.cluster.local.", // no IP yet: exists, no record
		"nope.default.svc.cluster.local.",
		"group-0.group.default.cluster.local.",     // no svc label
		"group-0.group.default.pod.cluster.local.", // pod, not svc
		"api.default.pod.cluster.local.",
		"example.com.", // outside: refused
	} {
		if got, err := r.LookupHost(ctx, q); err == nil {
			t.Errorf("LookupHost(%q) = %v, want an error", q, got)
		}
	}
}

// ask sends one question and parses the reply.
func ask(t *testing.T, z zone, q string, typ dnsmessage.Type) (dnsmessage.Header, []dnsmessage.Resource) {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 4242, RecursionDesired: true})
	b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(q), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	req, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(answer(req, z.lookup)); err != nil {
		t.Fatalf("the reply to %s does not parse: %v", q, err)
	}
	if m.ID != 4242 || !m.Response {
		t.Fatalf("reply header %+v: want the request's ID, a response", m.Header)
	}
	return m.Header, m.Answers
}

func TestRCodes(t *testing.T) {
	gone := pod("ns", "old", "old", "s", "10.244.0.4", nil) // being deleted: a recreated group's old leader
	gone.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	z := testZone(t, pod("ns", "p", "p", "s", "10.244.0.3", nil), pod("ns", "q", "q", "s", "", nil), gone)
	for _, c := range []struct {
		q     string
		typ   dnsmessage.Type
		rcode dnsmessage.RCode
		n     int
	}{
		{"p.s.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1},
		{"p.s.ns.svc.cluster.local.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, 0},
		{"q.s.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 0},
		{"x.s.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"old.s.ns.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"a.b.c.d.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"localcluster.local.", dnsmessage.TypeA, dnsmessage.RCodeRefused, 0},
		{"p.s.ns.svc.cluster.local.example.", dnsmessage.TypeA, dnsmessage.RCodeRefused, 0},
	} {
		h, rr := ask(t, z, c.q, c.typ)
		if h.RCode != c.rcode || len(rr) != c.n {
			t.Errorf("%s %v: rcode %v with %d records; want %v with %d", c.q, c.typ, h.RCode, len(rr), c.rcode, c.n)
		}
	}
}

func TestNoRequestNoReply(t *testing.T) {
	lookup := func(string) ([]netip.Addr, bool, bool) { t.Fatal("looked up"); return nil, false, false }
	for _, req := range [][]byte{nil, {1, 2, 3}, make([]byte, 11)} {
		if out := answer(req, lookup); out != nil {
			t.Errorf("answer(%x) = %x; want no reply to what is no DNS header", req, out)
		}
	}
	// A header with no question: FORMERR.
	var m dnsmessage.Message
	if err := m.Unpack(answer([]byte{0, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, lookup)); err != nil || m.RCode != dnsmessage.RCodeFormatError || m.ID != 7 {
		t.Errorf("no question: %+v, %v; want FORMERR with ID 7", m.Header, err)
	}
}

// The name's parts come back as they were asked (lowercased), and only
// names in the domain are known.
func FuzzParseName(f *testing.F) {
	for _, s := range []string{"a.b.c.svc.cluster.local.", "b.c.svc.cluster.local", "cluster.local", ".cluster.local", "x..svc.cluster.local", "example.com", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		n := parseName(q, "cluster.local")
		if n.known && !n.inDomain {
			t.Fatalf("%q: known outside the domain", q)
		}
		if !n.known {
			return
		}
		parts := []string{n.sub, n.namespace, "svc", "cluster", "local"}
		if n.host != "" {
			parts = append([]string{n.host}, parts...)
		}
		if got, want := strings.Join(parts, "."), strings.TrimSuffix(strings.ToLower(q), "."); got != want {
			t.Fatalf("%q read as %q", q, got)
		}
	})
}

// Whatever arrives, answer does not panic, and what it sends back parses
// and carries the request's ID.
func FuzzAnswer(f *testing.F) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 1})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("p.s.ns.svc.cluster.local."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	seed, _ := b.Finish()
	f.Add(seed)
	f.Add([]byte{0, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	lookup := func(q string) ([]netip.Addr, bool, bool) {
		n := parseName(q, "cluster.local")
		return []netip.Addr{netip.MustParseAddr("10.244.0.3")}, n.known, n.inDomain
	}
	f.Fuzz(func(t *testing.T, req []byte) {
		out := answer(req, lookup)
		if out == nil {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(out); err != nil {
			t.Fatalf("the reply to %x does not parse: %v", req, err)
		}
		if len(req) < 2 || m.ID != uint16(req[0])<<8|uint16(req[1]) || !m.Response {
			t.Fatalf("reply %+v to %x", m.Header, req)
		}
	})
}
