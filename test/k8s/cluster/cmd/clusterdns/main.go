// Command clusterdns is the test cluster's DNS server (make test-k8s): the
// cluster has no CoreDNS, and LeaderWorkerSet hands each pod its leader as
// a name (LWS_LEADER_ADDRESS=<lws>-<group>.<subdomain>.<namespace>). It runs
// on the host, the kubelet's --cluster-dns, and answers A records for what
// the API server knows, nothing else:
//
//	<hostname>.<subdomain>.<namespace>.svc.<domain>  a pod with that
//	                                                 spec.hostname and
//	                                                 spec.subdomain: its IP
//	<service>.<namespace>.svc.<domain>               a Service's cluster IP;
//	                                                 a headless one: the IPs
//	                                                 of the pods it selects
//
// Another name in the domain, or a type other than A for a name that
// exists, is answered without records (NXDOMAIN, or NOERROR for the type);
// a name outside the domain is refused: nothing is forwarded.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the kubeconfig to watch pods and services with")
	listen := flag.String("listen", "127.0.0.1:53", "the UDP address to answer on")
	domain := flag.String("domain", "cluster.local", "the cluster's domain (the kubelet's --cluster-domain)")
	flag.Parse()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("clusterdns: %v", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Fatalf("clusterdns: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	f := informers.NewSharedInformerFactory(client, 0)
	pods, services := f.Core().V1().Pods(), f.Core().V1().Services()
	pi, si := pods.Informer(), services.Informer()
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), pi.HasSynced, si.HasSynced) {
		log.Fatalf("clusterdns: the pods and services were not listed")
	}
	pc, err := net.ListenPacket("udp", *listen)
	if err != nil {
		log.Fatalf("clusterdns: %v", err)
	}
	go func() { <-ctx.Done(); pc.Close() }()
	z := zone{domain: *domain, pods: pods.Lister(), services: services.Lister()}
	log.Printf("clusterdns: answering for %s on %s", *domain, *listen)
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				os.Exit(0)
			}
			log.Printf("clusterdns: %v", err)
			continue
		}
		if out := answer(buf[:n], z.lookup); out != nil {
			pc.WriteTo(out, from)
		}
	}
}
