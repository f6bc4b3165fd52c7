package main

import (
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	listersv1 "k8s.io/client-go/listers/core/v1"
)

// A name asked for, as the cluster's domain reads it.
type name struct {
	// inDomain: the name ends in the cluster's domain; nothing else is
	// answered.
	inDomain bool
	// A pod: hostname.subdomain.namespace.svc.<domain>.
	// A service: service.namespace.svc.<domain> (host empty).
	host, sub, namespace string
	// known: one of the two shapes above.
	known bool
}

// parseName reads a question's name (any case, with or without the final
// dot) against the cluster's domain.
func parseName(q, domain string) name {
	q = strings.TrimSuffix(strings.ToLower(q), ".")
	domain = strings.Trim(strings.ToLower(domain), ".")
	if q == domain {
		return name{inDomain: true}
	}
	rest, ok := strings.CutSuffix(q, "."+domain)
	if !ok || domain == "" {
		return name{}
	}
	labels := strings.Split(rest, ".")
	for _, l := range labels {
		if l == "" {
			return name{inDomain: true}
		}
	}
	n := len(labels)
	if n < 3 || n > 4 || labels[n-1] != "svc" {
		return name{inDomain: true}
	}
	if n == 3 {
		return name{inDomain: true, known: true, sub: labels[0], namespace: labels[1]}
	}
	return name{inDomain: true, known: true, host: labels[0], sub: labels[1], namespace: labels[2]}
}

// zone answers from the API server's pods and services.
type zone struct {
	domain   string
	pods     listersv1.PodLister
	services listersv1.ServiceLister
}

// lookup is answer's lookup: the name's IPv4 addresses, whether the name
// exists, and whether it is in the cluster's domain at all.
func (z zone) lookup(q string) (addrs []netip.Addr, exists, inDomain bool) {
	n := parseName(q, z.domain)
	if !n.known {
		return nil, false, n.inDomain
	}
	if n.host != "" {
		pods, _ := z.pods.Pods(n.namespace).List(labels.Everything())
		for _, p := range pods {
			if strings.EqualFold(p.Spec.Hostname, n.host) && strings.EqualFold(p.Spec.Subdomain, n.sub) && p.DeletionTimestamp == nil {
				exists = true
				addrs = appendIP(addrs, p.Status.PodIP)
			}
		}
		return addrs, exists, true
	}
	svc, err := z.services.Services(n.namespace).Get(n.sub)
	if err != nil {
		return nil, false, true
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		return appendIP(nil, svc.Spec.ClusterIP), true, true
	}
	if len(svc.Spec.Selector) == 0 {
		return nil, true, true
	}
	pods, _ := z.pods.Pods(n.namespace).List(labels.SelectorFromSet(svc.Spec.Selector))
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			addrs = appendIP(addrs, p.Status.PodIP)
		}
	}
	return addrs, true, true
}

func appendIP(addrs []netip.Addr, ip string) []netip.Addr {
	if a, err := netip.ParseAddr(ip); err == nil && a.Is4() {
		return append(addrs, a)
	}
	return addrs
}
