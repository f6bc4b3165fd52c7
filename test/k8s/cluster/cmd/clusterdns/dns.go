package main

import (
	"net/netip"

	"golang.org/x/net/dns/dnsmessage"
)

// ttl is how long a resolver may keep an answer, in seconds: short, since a
// recreated pod comes back on another IP.
const ttl = 5

// answer is the reply to the DNS request req, from lookup (zone.lookup);
// nil for what is no request at all (a reply, or bytes that are no DNS
// header). A request it cannot read, or with other than one question, is
// answered FORMERR; a name outside the cluster's domain REFUSED; a name
// that does not exist NXDOMAIN; an existing name's A records, or none for
// another type.
func answer(req []byte, lookup func(string) (addrs []netip.Addr, exists, inDomain bool)) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil || h.Response {
		return nil
	}
	reply := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, Authoritative: true}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 || h.OpCode != 0 {
		reply.RCode = dnsmessage.RCodeFormatError
		if h.OpCode != 0 {
			reply.RCode = dnsmessage.RCodeNotImplemented
		}
		return build(reply, nil, nil)
	}
	q := qs[0]
	addrs, exists, inDomain := lookup(q.Name.String())
	switch {
	case !inDomain:
		reply.RCode, reply.Authoritative = dnsmessage.RCodeRefused, false
		return build(reply, &q, nil)
	case !exists:
		reply.RCode = dnsmessage.RCodeNameError
		return build(reply, &q, nil)
	case q.Class != dnsmessage.ClassINET || (q.Type != dnsmessage.TypeA && q.Type != dnsmessage.TypeALL):
		addrs = nil
	}
	return build(reply, &q, addrs)
}

func build(h dnsmessage.Header, q *dnsmessage.Question, addrs []netip.Addr) []byte {
	b := dnsmessage.NewBuilder(nil, h)
	b.EnableCompression()
	if q != nil {
		b.StartQuestions()
		if b.Question(*q) != nil {
			return nil
		}
	}
	b.StartAnswers()
	for _, a := range addrs {
		rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: ttl}
		if b.AResource(rh, dnsmessage.AResource{A: a.As4()}) != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}
