// Command etcd runs the test cluster's etcd, embedded from the etcd server
// module at the version Kubernetes' own go.mod names. Debian's etcd-server
// (3.4.23) is older than 3.4.31, the first 3.4 release whose watch progress
// requests the API server trusts, so its consistent reads and watch lists
// would fall back or fail; the embedded server is the one Kubernetes tests
// against.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dir := flag.String("data-dir", "", "folder for etcd's data (required)")
	client := flag.String("listen-client-url", "http://127.0.0.1:2379", "where the API server reaches etcd")
	peer := flag.String("listen-peer-url", "http://127.0.0.1:2380", "the peer address of this one-member cluster")
	flag.Parse()
	if *dir == "" {
		log.Fatal("etcd: give -data-dir, the folder etcd keeps its data in")
	}
	cu, err := url.Parse(*client)
	if err != nil {
		log.Fatalf("etcd: -listen-client-url %q: %v", *client, err)
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		log.Fatalf("etcd: -listen-peer-url %q: %v", *peer, err)
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "warn"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("etcd: start: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		log.Printf("etcd: ready on %s", cu)
	case <-time.After(2 * time.Minute):
		e.Close()
		log.Fatal("etcd: not ready after 2 minutes; see the log above")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-e.Err():
		log.Printf("etcd: %v", err)
	}
	e.Close()
}
