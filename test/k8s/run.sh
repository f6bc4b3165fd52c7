#!/usr/bin/env bash
# make test-k8s: the chart on a real single-node Kubernetes, built here.
#
# Kubernetes' own components (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl) are built from the k8s.io/kubernetes Go
# module (test/k8s/cluster/go.mod names the release), etcd is embedded from
# the etcd server module Kubernetes names, containerd, runc and the CNI
# plugins come from Debian, and the images (a pause program; the guard with
# the vLLM simulator and the stand-in NVML) are made here and imported into
# containerd: nothing is pulled from a registry. LeaderWorkerSet's manager
# is built from its own module (test/k8s/lws) and runs on the host with its
# own webhook certificates; a small DNS server (test/k8s/cluster/cmd/
# clusterdns) is the cluster's DNS. The script starts the
# cluster, installs the chart (helm install through the Helm SDK), checks
# the pod through each scenario, and tears everything down (processes,
# mounts, interfaces, iptables chains, cgroups, pod logs), then checks that
# nothing is left. Needs root (it runs a kubelet); installs what it needs
# from Debian when missing. VLLM_GUARD_SKIP_K8S=1 skips it, saying so loudly.
set -euo pipefail
if [[ "${VLLM_GUARD_SKIP_K8S:-}" == 1 ]]; then
  printf '\n=== KUBERNETES: SKIPPED (VLLM_GUARD_SKIP_K8S=1): the chart is NOT being tested on a real cluster ===\n\n' >&2
  exit 0
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="$PATH:/usr/local/go/bin" CGO_CFLAGS="-O2 -Wno-deprecated-declarations"
mod="$root/test/k8s/cluster"
cache=${VLLM_GUARD_K8S_CACHE:-$HOME/.cache/vllm-guard/k8s}
K=$(mktemp -d /tmp/vllm-guard-k8s.XXXXXX)
trap 'rm -rf "$K"' EXIT # until the cluster's own teardown takes over
load_s=20 # the simulator's weight load: the pod must not be Ready before it ends
drain_s=15 # vLLM's --shutdown-timeout (the chart's shutdownTimeoutSeconds)

phase_t0=$SECONDS
phase() { echo "== [$((SECONDS - phase_t0)) s] $*"; }
fail() { echo "test-k8s FAILED: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root: the kubelet and containerd need it (VLLM_GUARD_SKIP_K8S=1 skips this tier, loudly)"

phase "packages: containerd, runc, CNI plugins, iptables, iproute2, openssl, curl, busybox (Debian)"
need=()
for p in containerd runc containernetworking-plugins iptables iproute2 openssl curl busybox-static util-linux; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
for p in containerd runc containernetworking-plugins; do echo "   $p $(dpkg-query -W -f='${Version}' $p)"; done

version=$(cd "$mod" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
bin="$cache/$version-$(sha256sum "$mod/go.sum" | cut -c1-12)"
phase "Kubernetes $version: components into $bin"
if [ ! -x "$bin/kubelet" ]; then
  mkdir -p "$bin.tmp"
  minor=$(cut -d. -f2 <<<"$version")
  ld="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
    s=$SECONDS; (cd "$mod" && go build -trimpath -ldflags "$ld" -o "$bin.tmp/$c" "k8s.io/kubernetes/cmd/$c")
    echo "   $c: $((SECONDS - s)) s"
  done
  (cd "$mod" && go build -trimpath -o "$bin.tmp/etcd" ./cmd/etcd && CGO_ENABLED=0 go build -trimpath -o "$bin.tmp/pause" ./cmd/pause && go build -o "$bin.tmp/ociimage" ./cmd/ociimage)
  rm -rf "$bin" && mv "$bin.tmp" "$bin"
fi
kc() { "$bin/kubectl" --kubeconfig "$K/pki/admin.kubeconfig" "$@"; }

# LeaderWorkerSet's controller manager, from its own module (test/k8s/lws:
# the release whose k8s.io modules match the cluster's), cached the same way.
lwsmod="$root/test/k8s/lws"
lwsversion=$(cd "$lwsmod" && go list -m -f '{{.Version}}' sigs.k8s.io/lws)
lwsbin="$cache/lws-$lwsversion-$(sha256sum "$lwsmod/go.sum" | cut -c1-12)"
phase "LeaderWorkerSet $lwsversion: its manager into $lwsbin; the cluster's DNS server (test/k8s/cluster/cmd/clusterdns)"
if [ ! -x "$lwsbin/manager" ]; then
  mkdir -p "$lwsbin.tmp"
  s=$SECONDS; (cd "$lwsmod" && go build -trimpath -o "$lwsbin.tmp/manager" sigs.k8s.io/lws/cmd)
  echo "   manager: $((SECONDS - s)) s"
  rm -rf "$lwsbin" && mv "$lwsbin.tmp" "$lwsbin"
fi
mkdir -p "$K/bin"
(cd "$mod" && go vet ./cmd/clusterdns && go test -count=1 ./cmd/clusterdns >/dev/null && go build -o "$K/bin/clusterdns" ./cmd/clusterdns)

phase "the guard, the simulator and the stand-in NVML (make build)"
make -C "$root" -s build >/dev/null

# One cluster at a time on a machine: its ports, bridge and iptables chains
# are fixed. The lock is held until this script exits (the processes it
# starts do not inherit it).
mkdir -p /run/lock # not every machine has it
exec 9>/run/lock/vllm-guard-k8s.lock
if ! flock -n 9; then
  echo "   another test-k8s runs its cluster here: waiting for it"
  flock 9
fi

# What is here before the cluster: teardown must leave nothing of the
# cluster's that was not here already (test/k8s/leftovers.sh says what is
# the cluster's; leftovers_test.go checks that comparison).
. "$root/test/k8s/leftovers.sh"
leftovers_dump "$K" > "$K/before.raw"
leftovers_view "$K" < "$K/before.raw" > "$K/before"
# The kernel settings the kubelet changes, to put back.
for s in $leftovers_sysctls; do if [ -r "/proc/sys/$s" ]; then echo "$s $(cat "/proc/sys/$s")"; fi; done > "$K/sysctls"
# The kubelet makes /var/log/containers when it is missing: remove it after
# if this run made it (empty).
[ -d /var/log/containers ] || made_containers_log=1

teardown() {
  set +e
  phase "teardown"
  kc delete leaderworkerset --all --wait=true --timeout=120s >/dev/null 2>&1
  kc delete deployment --all --wait=true --timeout=120s >/dev/null 2>&1
  kc wait --for=delete pod --all --timeout=120s >/dev/null 2>&1
  for n in lws clusterdns kubelet scheduler kcm apiserver; do [ -f "$K/run/$n.pid" ] && kill "$(cat "$K/run/$n.pid")" 2>/dev/null; done
  for n in lws clusterdns kubelet scheduler kcm apiserver; do [ -f "$K/run/$n.pid" ] && while kill -0 "$(cat "$K/run/$n.pid")" 2>/dev/null; do sleep 0.2; done; done
  S=$K/ctd/containerd.sock
  if [ -S "$S" ]; then
    for c in $(ctr -a "$S" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$S" -n k8s.io tasks kill -s KILL "$c"; done
    for c in $(ctr -a "$S" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$S" -n k8s.io tasks delete -f "$c" >/dev/null; done
  fi
  for n in containerd etcd; do [ -f "$K/run/$n.pid" ] && kill "$(cat "$K/run/$n.pid")"; done
  for n in containerd etcd; do [ -f "$K/run/$n.pid" ] && while kill -0 "$(cat "$K/run/$n.pid")" 2>/dev/null; do sleep 0.2; done; done
  # Shims outlive containerd; ours name our socket on their command line.
  for c in /proc/[0-9]*/cmdline; do grep -qaF "$K/ctd" "$c" 2>/dev/null && kill -9 "$(basename "$(dirname "$c")")" 2>/dev/null; done
  awk -v k="$K" 'index($2, k) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
  # The kubelet links each container's log into /var/log/containers (a
  # fixed folder) and unlinks it at its next container GC, which may not
  # come before it is stopped: remove the links into this cluster's logs.
  for l in /var/log/containers/*; do [ -L "$l" ] && case "$(readlink "$l")" in "$K"/*) rm -f "$l" ;; esac; done
  ip link del k8stest0 2>/dev/null
  [ -n "${forward:-}" ] && echo "$forward" > /proc/sys/net/ipv4/ip_forward
  for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do grep -qx "netns $ns" "$K/before" || ip netns del "$ns"; done
  # The kubelet's chains (KUBE-*) and the CNI plugins' (CNI-*): the rules
  # that jump to them, then the chains.
  for ipt in iptables ip6tables; do
    for t in filter nat mangle; do
      $ipt-save -t $t 2>/dev/null | grep -E '^-A .* -j (KUBE-|CNI-)' | sed 's/^-A/-D/' | while read -r r; do eval "$ipt -t $t $r"; done
      for c in $($ipt-save -t $t 2>/dev/null | grep -oE '^:(KUBE-|CNI-)[^ ]+' | tr -d :); do $ipt -t $t -F "$c"; done
      for c in $($ipt-save -t $t 2>/dev/null | grep -oE '^:(KUBE-|CNI-)[^ ]+' | tr -d :); do $ipt -t $t -X "$c"; done
    done
  done
  # The cgroups the kubelet (kubepods) and containerd (k8s.io) made.
  for d in /sys/fs/cgroup/kubepods* /sys/fs/cgroup/*/kubepods* /sys/fs/cgroup/k8s.io /sys/fs/cgroup/*/k8s.io; do [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; ; done
  # The kernel settings the kubelet changed, as they were.
  while read -r s v; do [ "$(cat "/proc/sys/$s")" = "$v" ] || echo "$v" > "/proc/sys/$s"; done < "$K/sysctls"
  [ -n "${made_containers_log:-}" ] && rmdir /var/log/containers 2>/dev/null
  leftovers_dump "$K" > "$K/after.raw"
  leftovers_view "$K" < "$K/after.raw" > "$K/after"
  if ! leftovers_left "$K/before" "$K/after" > "$K/left"; then
    echo "test-k8s: teardown left these (the cluster's, not here before):" >&2; cat "$K/left" >&2; status=1
  else
    echo "   nothing left: no process, mount, interface, iptables rule or chain, network namespace, cgroup, pod log or kernel setting of the cluster's"
  fi
  if [ "${status:-0}" != 0 ]; then echo "   logs kept in $K/log" >&2; else rm -rf "$K"; fi
}
trap 'status=$?; teardown; exit $status' EXIT

phase "images: localhost/pause:v1, localhost/vllm-guard:test"
r=$K/img/guard
mkdir -p "$K/img/pause" "$r"/{usr/local/bin,usr/lib/x86_64-linux-gnu,lib64,etc/vllm-guard,run/vllm-guard,var/lib/vllm-guard,gpu/procs,tmp,bin}
cp "$bin/pause" "$K/img/pause/pause"
cp "$root/bin/vllm-guard" "$r/usr/local/bin/"
cp "$root/bin/fakevllm" "$r/usr/local/bin/vllm"
cp "$root/build/lib/libnvidia-ml.so.1" /lib/x86_64-linux-gnu/libc.so.6 "$r/usr/lib/x86_64-linux-gnu/"
cp /lib64/ld-linux-x86-64.so.2 "$r/lib64/"
ln -s usr/lib "$r/lib"
cp /bin/busybox "$r/bin/busybox" && for a in sh id mkdir cp cat touch kill pidof; do ln -s busybox "$r/bin/$a"; done
echo "GPU-5e1f0000-0000-4000-8000-000000000001 85899345920 536870912 NVIDIA H100 80GB HBM3 (simulated)" > "$r/gpu/devices"
chmod 1777 "$r/gpu/procs" "$r/tmp"
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$r/etc/passwd"
"$bin/ociimage" -root "$K/img/pause" -name localhost/pause:v1 -config '{"Entrypoint":["/pause"]}' -o "$K/img/pause.tar"
# The root file system is read-only in the pod: the stand-in NVML's state
# (the GPU's devices, the processes holding its memory, its events and
# health) is copied to the pod's /tmp emptyDir, which outlives a container
# restart as a GPU's state does; then the guard is PID 1, as in the real image.
entry='mkdir -p /tmp/gpu/procs && cp /gpu/devices /tmp/gpu/ && exec vllm-guard run "$@"'
"$bin/ociimage" -root "$r" -name localhost/vllm-guard:test -o "$K/img/guard.tar" \
  -config '{"Entrypoint":["/bin/sh","-c","'"${entry//\"/\\\"}"'","vllm-guard"],"Cmd":["--config","/etc/vllm-guard/vllm-guard.toml"],"Env":["PATH=/usr/local/bin:/bin","FAKENVML_STATE=/tmp/gpu"]}'

phase "cluster: certificates, etcd, API server, controller manager, scheduler, containerd, kubelet"
ip=$(ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -1)
mkdir -p "$K"/{pki,etcd,ctd,cni,kubelet,log,run,pv/state}
(
  cd "$K/pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=vllm-guard-test-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
  echo "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:$ip,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost" > san.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 1 -extfile san.ext 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  # Tokens, one per component, in the groups RBAC's bootstrap roles name.
  t() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
  for u in admin:system:masters kubelet:system:nodes kcm: sched:; do
    tok=$(t); name=${u%%:*}; group=${u#*:}
    case $name in kubelet) user=system:node:node1 ;; kcm) user=system:kube-controller-manager ;; sched) user=system:kube-scheduler ;; *) user=admin ;; esac
    echo "$tok,$user,$name${group:+,$group}" >> tokens.csv
    printf 'apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: "https://127.0.0.1:16443", certificate-authority: %s}}]\nusers: [{name: u, user: {token: %s}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n' "$K/pki/ca.crt" "$tok" > "$name.kubeconfig"
  done
)
cat > "$K/cni/10-bridge.conflist" <<C
{"cniVersion":"1.0.0","name":"vllm-guard-test","plugins":[
 {"type":"bridge","bridge":"k8stest0","isGateway":true,"ipMasq":true,"hairpinMode":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":"$K/run/ipam"}},
 {"type":"portmap","capabilities":{"portMappings":true}}]}
C
cat > "$K/ctd/config.toml" <<C
version = 2
root = "$K/ctd/root"
state = "$K/ctd/state"
[grpc]
  address = "$K/ctd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:v1"
  # Where the process lacks CAP_SYS_RESOURCE (this sandbox) no score can go
  # below containerd's own; the kubelet asks -998 for every pod's sandbox.
  restrict_oom_score_adj = $(grep -q '^CapBnd:.*' /proc/self/status && [ $(( 0x$(awk '/^CapBnd/{print $2}' /proc/self/status) >> 24 & 1 )) = 0 ] && echo true || echo false)
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$K/cni"
C
cat > "$K/kubelet/config.yaml" <<C
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$K/ctd/containerd.sock
failSwapOn: false
failCgroupV1: false
readOnlyPort: 0
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
podLogsDir: $K/log/pods
clusterDNS: [$ip]
clusterDomain: cluster.local
C
start() { n=$1; shift; "$@" > "$K/log/$n.log" 2>&1 9>&- & echo $! > "$K/run/$n.pid"; }
forward=$(cat /proc/sys/net/ipv4/ip_forward) # put back in the teardown
echo 1 > /proc/sys/net/ipv4/ip_forward
start containerd containerd --config "$K/ctd/config.toml"
start etcd "$bin/etcd" -data-dir "$K/etcd" -listen-client-url http://127.0.0.1:23790 -listen-peer-url http://127.0.0.1:23800
# --enable-aggregator-routing: the API server calls webhooks (LeaderWorkerSet's)
# at their Service's endpoints; with no kube-proxy a cluster IP leads nowhere.
start apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:23790 --secure-port=16443 --bind-address=127.0.0.1 --advertise-address="$ip" \
  --tls-cert-file="$K/pki/apiserver.crt" --tls-private-key-file="$K/pki/apiserver.key" --client-ca-file="$K/pki/ca.crt" \
  --token-auth-file="$K/pki/tokens.csv" --authorization-mode=Node,RBAC --service-cluster-ip-range=10.96.0.0/16 \
  --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$K/pki/sa.pub" --service-account-signing-key-file="$K/pki/sa.key" \
  --allow-privileged=false --kubelet-preferred-address-types=InternalIP --enable-aggregator-routing=true
start kcm "$bin/kube-controller-manager" --kubeconfig="$K/pki/kcm.kubeconfig" --service-account-private-key-file="$K/pki/sa.key" --root-ca-file="$K/pki/ca.crt" \
  --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false --use-service-account-credentials=true '--controllers=*,-nodeipam'
# The cluster's DNS (the kubelet's clusterDNS) on the host's address: pods
# by hostname.subdomain.namespace, services; nothing forwarded.
start clusterdns "$K/bin/clusterdns" -kubeconfig "$K/pki/admin.kubeconfig" -listen "$ip:53" -domain cluster.local
start scheduler "$bin/kube-scheduler" --kubeconfig="$K/pki/sched.kubeconfig" --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false
for i in $(seq 1 240); do ctr -a "$K/ctd/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.5; done
ctr -a "$K/ctd/containerd.sock" -n k8s.io image import "$K/img/pause.tar" >/dev/null
ctr -a "$K/ctd/containerd.sock" -n k8s.io image import "$K/img/guard.tar" >/dev/null
start kubelet "$bin/kubelet" --config="$K/kubelet/config.yaml" --kubeconfig="$K/pki/kubelet.kubeconfig" --root-dir="$K/kubelet/root" \
  --cert-dir="$K/kubelet/pki" --hostname-override=node1 --node-ip="$ip"
kc wait --for=condition=Ready node/node1 --timeout=180s >/dev/null 2>&1 || { sleep 5; kc wait --for=condition=Ready node/node1 --timeout=120s; }
kc version | sed 's/^/   /'
# The GPU as the node's extended resource, the way a device plugin
# advertises it; a local volume for the state claim.
kc patch node node1 --subresource=status --type=json -p '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"1"}]' >/dev/null
kc apply -f - >/dev/null <<Y
apiVersion: v1
kind: PersistentVolume
metadata: {name: vllm-guard-state}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  local: {path: $K/pv/state}
  nodeAffinity: {required: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [node1]}]}]}}
Y

phase "the chart: helm install through the Helm SDK (examples/helm/cmd/install); vLLM's API key in a Secret"
key="sk-test-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
kc create secret generic vllm-api-key --from-literal=api-key="$key" >/dev/null
(cd "$root/examples/helm" && go run ./cmd/install --kubeconfig "$K/pki/admin.kubeconfig" --name vllm --set image.repository=localhost/vllm-guard --set image.tag=test --set image.pullPolicy=Never \
  --set apiKeySecret.name=vllm-api-key --set shutdownTimeoutSeconds=$drain_s \
  --set model=org/model --set resources.requests.cpu=100m --set resources.requests.memory=256Mi --set resources.limits.memory=1Gi --set shmSize=64Mi \
  --set 'env[0].name=FAKEVLLM_LOAD_WEIGHTS' --set "env[0].value=${load_s}s" \
  --set 'env[1].name=FAKEVLLM_SEQ_COST_MIB' --set 'env[1].value=64' --set 'env[2].name=FAKEVLLM_BACKGROUND_SEQS' --set 'env[2].value=200' \
  --set 'env[3].name=FAKEVLLM_BACKGROUND_AFTER' --set 'env[3].value=2s' --set 'env[4].name=FAKEVLLM_BACKGROUND_RAMP' --set 'env[4].value=3s' \
  --set 'env[5].name=FAKEVLLM_TOKEN_INTERVAL' --set 'env[5].value=25ms') | sed 's/^/   /'
kc get deployment,configmap,service,pvc -l app.kubernetes.io/managed-by=Helm -o name | sed 's/^/   /'

phase "scenario: the pod becomes Ready through the kubelet only after the model answers"
# The Deployment's pod exists only once the controllers made it.
podexists() { for i in $(seq 1 120); do kc get pod -l app.kubernetes.io/name=vllm-guard -o name | grep -q . && return; sleep 0.5; done; }
podexists
kc wait --for=condition=Ready pod -l app.kubernetes.io/name=vllm-guard --timeout=300s >/dev/null || {
  kc describe pod -l app.kubernetes.io/name=vllm-guard; fail "the pod did not become Ready"; }
pod=$(kc get pod -l app.kubernetes.io/name=vllm-guard -o name)
started=$(kc get "$pod" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}')
ready=$(kc get "$pod" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastTransitionTime}')
waited=$(( $(date -d "$ready" +%s) - $(date -d "$started" +%s) ))
echo "   container started $started, Ready $ready ($waited s; the model loads for $load_s s)"
[ "$waited" -ge "$load_s" ] || fail "the pod was Ready ${waited}s after its start, before the ${load_s}s load ended"
restarts=$(kc get "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')
[ "$restarts" = 0 ] || fail "the container restarted $restarts times during the load"

phase "scenario: vllm-guard status through kubectl exec"
kc exec "$pod" -- vllm-guard status > "$K/status.txt"
sed -n 1,3p "$K/status.txt" | sed 's/^/   /'
head -1 "$K/status.txt" | grep -q READY || fail "vllm-guard status does not say READY"

phase "scenario: a completion through the guard's proxy on the pod's IP"
podip=$(kc get "$pod" -o jsonpath='{.status.podIP}')
curl -fsS -m 30 "http://$podip:8080/v1/completions" -H 'Content-Type: application/json' -H "Authorization: Bearer $key" \
  -d '{"model":"org/model","prompt":"hello","max_tokens":4}' > "$K/completion.json" || fail "no completion through the proxy at $podip:8080"
grep -q '"choices"' "$K/completion.json" || fail "the completion has no choices: $(cat "$K/completion.json")"
echo "   $(head -c 160 "$K/completion.json")"

phase "scenario: the state claim is writable by the pod's user (fsGroup on a real volume)"
if kc logs "$pod" | grep -q 'running without persistence'; then
  kc logs "$pod" | grep 'running without persistence' >&2; fail "the guard cannot write its state on the claim"
fi
echo "   no 'running without persistence' in the guard's log"

phase "scenario: the API key comes from a Secret, never a ConfigMap; vLLM requires it through the proxy"
for what in configmap deployment pod; do
  ! kc get "$what" -o yaml | grep -qF "$key" || fail "the API key's text is in a $what"
done
kc get "$pod" -o jsonpath='{.spec.containers[0].env[?(@.name=="VLLM_API_KEY")].valueFrom.secretKeyRef.name}' | grep -qx vllm-api-key ||
  fail "VLLM_API_KEY does not come from the Secret vllm-api-key"
ask() { curl -sS -m 30 -o /dev/null -w '%{http_code}' "http://$podip:8080/v1/completions" -H 'Content-Type: application/json' "$@" \
  -d '{"model":"org/model","prompt":"hello","max_tokens":1}'; }
without=$(ask) with=$(ask -H "Authorization: Bearer $key") wrong=$(ask -H "Authorization: Bearer sk-wrong")
echo "   the key's text in no ConfigMap, Deployment or pod (kubectl get -o yaml); VLLM_API_KEY from secretKeyRef vllm-api-key"
echo "   through the proxy: without the key $without, a wrong key $wrong, with the key $with"
[ "$without" = 401 ] && [ "$wrong" = 401 ] && [ "$with" = 200 ] || fail "want 401 without the key and with a wrong one, 200 with it"

phase "scenario: the pod runs as uid 1000, not root, on a read-only root file system"
uid=$(kc exec "$pod" -- id -u)
[ "$uid" = 1000 ] || fail "the guard runs as uid $uid"
echo "   id -u in the container: $uid"
ro=$(kc get "$pod" -o jsonpath='{.spec.containers[0].securityContext.readOnlyRootFilesystem}')
[ "$ro" = true ] || fail "the container's securityContext.readOnlyRootFilesystem is '$ro'"
if kc exec "$pod" -- touch /written-by-the-test 2> "$K/touch.err"; then fail "a write to / succeeded in the container"; fi
grep -q 'Read-only file system' "$K/touch.err" || fail "a write to / failed, but not for a read-only root: $(cat "$K/touch.err")"
kc exec "$pod" -- touch /tmp/written-by-the-test || fail "/tmp is not writable in the container"
echo "   readOnlyRootFilesystem: $ro; touch /: $(head -1 "$K/touch.err" | sed 's/^touch: //'); touch /tmp/...: written; the guard serves (Ready, status, a completion above)"

# launches POD: the rung of each "launching vLLM" in the guard's log.
launches() { kc logs "$1" | grep '"launching vLLM"' | sed -n 's/.*"rung":\([0-9]*\).*/\1/p' | tr '\n' ' '; }
phase "scenario: a GPU OOM inside the pod is handled by the guard, without a container restart"
# The simulator's background demand outgrows rung 0 two seconds after Ready.
for i in $(seq 1 180); do [[ " $(launches "$pod")" == *" 1 "* ]] && break; sleep 1; done
[[ " $(launches "$pod")" == *" 1 "* ]] || { kc logs "$pod" | tail -20; fail "no relaunch on rung 1 after the OOM (launches on rungs: $(launches "$pod"))"; }
# The kubelet's Ready lags the guard by up to two probe periods: ask the
# guard itself that vLLM serves again, on the lighter rung.
for i in $(seq 1 180); do
  kc exec "$pod" -- vllm-guard status > "$K/status.txt" 2>/dev/null || true # not 0 while vLLM is down
  head -1 "$K/status.txt" | grep -q READY && grep -Eq 'profile +rung [1-9]' "$K/status.txt" && break; sleep 1
done
grep -E 'READY|profile' "$K/status.txt" | sed 's/^/   /'
head -1 "$K/status.txt" | grep -q READY && grep -Eq 'profile +rung [1-9]' "$K/status.txt" || fail "vLLM is not serving again on a lighter rung"
kc wait --for=condition=Ready "$pod" --timeout=60s >/dev/null || fail "the pod is not Ready after vLLM serves again"
restarts=$(kc get "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')
[ "$restarts" = 0 ] || fail "the container restarted $restarts times"
echo "   vLLM launched on rungs: $(launches "$pod"); serving again, the pod Ready; container restarts: $restarts"

phase "scenario: kubectl delete pod drains a stream in flight through the proxy; the rung survives it (state on the claim)"
grace=$(kc get "$pod" -o jsonpath='{.spec.terminationGracePeriodSeconds}')
ntok=300 # 7.5 s at 25 ms a token: in flight when the pod is deleted, done well within vLLM's $drain_s s drain
curl -sS -N -m 120 "http://$podip:8080/v1/completions" -H 'Content-Type: application/json' -H "Authorization: Bearer $key" \
  -d '{"model":"org/model","prompt":"hello","max_tokens":'$ntok',"stream":true}' > "$K/stream.txt" 2> "$K/stream.err" &
streamer=$!
for i in $(seq 1 200); do grep -q '^data: {' "$K/stream.txt" && break; sleep 0.1; done
grep -q '^data: {' "$K/stream.txt" || fail "the stream sent nothing: $(cat "$K/stream.err")"
before=$(grep -c '^data: {' "$K/stream.txt")
t0=$SECONDS
kc delete "$pod" --wait=true --timeout=120s >/dev/null
deleted=$((SECONDS - t0))
wait $streamer || fail "the stream failed: $(cat "$K/stream.err")"
chunks=$(grep -c '^data: {' "$K/stream.txt")
last=$(grep '^data:' "$K/stream.txt" | tail -1)
echo "   the stream: $before of $ntok tokens when the delete began, $chunks at its end, then '$last'; the pod was gone $deleted s after the delete (grace period $grace s)"
[ "$last" = "data: [DONE]" ] || fail "the stream in flight did not end with [DONE]: $(tail -3 "$K/stream.txt")"
! grep -q '"error"' "$K/stream.txt" || fail "the stream in flight ended with an error: $(grep '"error"' "$K/stream.txt")"
[ "$chunks" -ge "$ntok" ] || fail "the stream in flight ended after $chunks of $ntok tokens"
[ "$deleted" -le "$grace" ] || fail "the pod took $deleted s to stop, more than its $grace s grace period"
podexists
kc wait --for=condition=Ready pod -l app.kubernetes.io/name=vllm-guard --timeout=300s >/dev/null || fail "no new pod became Ready"
pod2=$(kc get pod -l app.kubernetes.io/name=vllm-guard -o name)
first=$(launches "$pod2" | awk '{print $1}')
[ "${first:-0}" -ge 1 ] || fail "the new pod $pod2 launched vLLM on rung ${first:-?}, not the rung its predecessor saved"
echo "   $pod2 launched vLLM first on rung $first"

phase "scenario: a GPU fault that needs a reset (XID 79) ends the guard with exit 69; what the pod does then"
# The driver's word, through the stand-in NVML's state in the pod's /tmp:
# XID 79 (fallen off the bus), and from then on the GPU lost, as NVML
# answers for such a GPU until it is reset.
# The guard watches for a fault while vLLM runs: wait until it serves.
for i in $(seq 1 120); do
  kc exec "$pod2" -- vllm-guard status > "$K/status.txt" 2>/dev/null || true
  head -1 "$K/status.txt" | grep -q READY && break; sleep 1
done
head -1 "$K/status.txt" | grep -q READY || fail "the guard of $pod2 does not serve: $(head -3 "$K/status.txt")"
kc exec "$pod2" -- sh -c 'echo "0 xid 79" >> /tmp/gpu/events && echo "0 lost 1" > /tmp/gpu/health'
for i in $(seq 1 120); do
  code=$(kc get "$pod2" -o jsonpath='{.status.containerStatuses[0].lastState.terminated.exitCode}')
  [ -n "$code" ] && break; sleep 1
done
[ "$code" = 69 ] || { kc describe "$pod2" | tail -30; fail "the container's last exit code is '${code:-none}', not 69 (GPU fault)"; }
kc logs "$pod2" --previous > "$K/previous.log" 2>/dev/null || true
# The XID and the lost GPU are written together: whichever the guard reads
# first (the event waiter or the next sample) is the fault it names, XID 79
# or the GPU fallen off the bus; both are this one fault.
grep -qE 'XID 79|fallen off the bus' "$K/previous.log" || { tail -20 "$K/previous.log"; fail "the guard's log before its exit names neither XID 79 nor the GPU fallen off the bus"; }
echo "   the guard exited 69; its log: $(grep -m1 -o '"gave up on vLLM".*"reason":"[^"]*"' "$K/previous.log" | head -c 300)"
# restartPolicy Always: the kubelet starts the container again, on the same
# node; the guard finds the GPU lost and does not start vLLM on it.
for i in $(seq 1 120); do
  kc exec "$pod2" -- vllm-guard status > "$K/status.txt" 2>/dev/null || true
  grep -q 'is lost' "$K/status.txt" && break; sleep 1
done
sed -n 1,3p "$K/status.txt" | sed 's/^/   /'
grep -q 'is lost' "$K/status.txt" || { kc logs "$pod2" | tail -20; fail "the restarted guard does not say the GPU is lost"; }
kc logs "$pod2" | grep -q '"launching vLLM"' && fail "the restarted guard launched vLLM on the lost GPU"
ready=$(kc get "$pod2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')
restarts=$(kc get "$pod2" -o jsonpath='{.status.containerStatuses[0].restartCount}')
phase_=$(kc get "$pod2" -o jsonpath='{.status.phase}')
echo "   the pod: phase $phase_, Ready $ready, container restarts $restarts, on node $(kc get "$pod2" -o jsonpath='{.spec.nodeName}'); vLLM not launched again"
[ "$ready" = False ] || fail "the pod is Ready on a lost GPU"
# The kubelet's probes: alive (no restart loop), not ready (no traffic).
podip2=$(kc get "$pod2" -o jsonpath='{.status.podIP}')
livez=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "http://$podip2:9461/livez") readyz=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "http://$podip2:9461/readyz")
echo "   the guard's /livez $livez, /readyz $readyz"
[ "$livez" = 200 ] && [ "$readyz" = 503 ] || fail "want /livez 200 (the kubelet keeps the container) and /readyz 503 on a lost GPU"


phase "LeaderWorkerSet $lwsversion: its CRD, RBAC and webhooks from the module's config/; the manager on the host, its own certificates"
# The module's kustomize bases, as its release does (namespace lws-system,
# names prefixed lws-); the webhook Service without a selector: its
# endpoint is the manager on the host, at port 9443.
lwscfg=$(cd "$lwsmod" && go list -m -f '{{.Dir}}' sigs.k8s.io/lws)/config
mkdir -p "$K/lws/kustomize/test" "$K/lws/certs"
cp -r "$lwscfg"/crd "$lwscfg"/rbac "$lwscfg"/webhook "$lwscfg"/internalcert "$K/lws/kustomize/" && chmod -R u+w "$K/lws/kustomize"
cat > "$K/lws/kustomize/test/kustomization.yaml" <<Y
namespace: lws-system
namePrefix: lws-
resources: [../crd, ../rbac, ../webhook, ../internalcert]
patches:
- target: {kind: Service, name: webhook-service}
  patch: '[{"op": "remove", "path": "/spec/selector"}]'
Y
kc create namespace lws-system >/dev/null
kc apply --server-side -k "$K/lws/kustomize/test" >/dev/null
kc apply -f - >/dev/null <<Y
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lws-webhook-service-host
  namespace: lws-system
  labels: {kubernetes.io/service-name: lws-webhook-service, endpointslice.kubernetes.io/managed-by: test-k8s}
addressType: IPv4
endpoints: [{addresses: ["$ip"], conditions: {ready: true}}]
ports: [{port: 9443, protocol: TCP}]
Y
cat > "$K/lws/config.yaml" <<Y
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
internalCertManagement: {enable: true}
webhook: {port: 9443, certDir: $K/lws/certs}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:18081"}
Y
# The manager runs as its service account, with the module's RBAC.
tok=$(kc -n lws-system create token lws-controller-manager --duration=2h)
sed "s/token: .*}/token: $tok}}/" "$K/pki/admin.kubeconfig" > "$K/pki/lws.kubeconfig"
start lws "$lwsbin/manager" --config "$K/lws/config.yaml" --kubeconfig "$K/pki/lws.kubeconfig" --zap-log-level=info
# Its certificate rotator writes the serving certificate into the Secret
# lws-webhook-server-cert and waits for it in certDir, where the kubelet
# would mount that Secret in its pod: here the script copies it there.
for i in $(seq 1 240); do
  crt=$(kc -n lws-system get secret lws-webhook-server-cert -o jsonpath='{.data.tls\.crt}' 2>/dev/null || true)
  [ -n "$crt" ] && break
  kill -0 "$(cat "$K/run/lws.pid")" 2>/dev/null || break; sleep 0.5
done
[ -n "$crt" ] || { tail -20 "$K/log/lws.log"; fail "LeaderWorkerSet's manager made no webhook certificate (Secret lws-webhook-server-cert)"; }
(umask 077 && base64 -d <<<"$crt" > "$K/lws/certs/tls.crt.tmp" &&
  kc -n lws-system get secret lws-webhook-server-cert -o jsonpath='{.data.tls\.key}' | base64 -d > "$K/lws/certs/tls.key" &&
  mv "$K/lws/certs/tls.crt.tmp" "$K/lws/certs/tls.crt")
# Ready once its certificates are made and injected: then an object goes
# through its webhooks (a dry run on the server).
cat > "$K/lws/probe.yaml" <<Y
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: probe}
spec: {leaderWorkerTemplate: {size: 2, workerTemplate: {spec: {containers: [{name: c, image: localhost/pause:v1}]}}}}
Y
for i in $(seq 1 240); do
  kc create --dry-run=server -f "$K/lws/probe.yaml" -o jsonpath='{.spec.leaderWorkerTemplate.restartPolicy}' > "$K/lws/probe.out" 2>&1 && break
  kill -0 "$(cat "$K/run/lws.pid")" 2>/dev/null || break # the manager stopped: its log says why
  sleep 0.5
done
[ "$(cat "$K/lws/probe.out")" = RecreateGroupOnPodRestart ] || { tail -20 "$K/log/lws.log"; fail "LeaderWorkerSet's webhooks do not answer (a dry run: $(cat "$K/lws/probe.out"))"; }
echo "   the mutating webhook defaults restartPolicy to $(cat "$K/lws/probe.out") (a dry run through the API server to $ip:9443)"

phase "scenario: a LeaderWorkerSet group of two pods (the chart's multiHost) becomes Ready, the follower's guard reaching the leader's by its DNS name"
kc delete deployment vllm --wait=true --timeout=120s >/dev/null
kc wait --for=delete pod -l app.kubernetes.io/instance=vllm --timeout=120s >/dev/null 2>&1 || true
# A GPU for each pod of the group; a state volume for the leader.
kc patch node node1 --subresource=status --type=json -p '[{"op":"replace","path":"/status/capacity/nvidia.com~1gpu","value":"2"}]' >/dev/null
mkdir -p "$K/pv/group-state"
kc apply -f - >/dev/null <<Y
apiVersion: v1
kind: PersistentVolume
metadata: {name: vllm-guard-group-state}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  local: {path: $K/pv/group-state}
  nodeAffinity: {required: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [node1]}]}]}}
Y
kc create secret generic vllm-group --from-literal=secret="$(head -c 32 /dev/urandom | base64)" >/dev/null
(cd "$root/examples/helm" && go run ./cmd/install --kubeconfig "$K/pki/admin.kubeconfig" --name group --set image.repository=localhost/vllm-guard --set image.tag=test --set image.pullPolicy=Never \
  --set multiHost.enabled=true --set multiHost.secret.name=vllm-group --set apiKeySecret.name=vllm-api-key \
  --set model=org/model --set resources.requests.cpu=100m --set resources.requests.memory=256Mi --set resources.limits.memory=1Gi --set shmSize=64Mi \
  --set 'guardConfig.group.heartbeat_interval=500ms' --set 'guardConfig.group.loss_timeout=3s' \
  --set 'guardConfig.restart.initial_delay=1s' --set 'guardConfig.restart.max_delay=2s' --set 'guardConfig.restart.give_up_after=4' \
  --set 'env[0].name=FAKEVLLM_LOAD_WEIGHTS' --set 'env[0].value=2s' \
  --set 'env[1].name=FAKEVLLM_SEQ_COST_MIB' --set 'env[1].value=64' --set 'env[2].name=FAKEVLLM_BACKGROUND_SEQS' --set 'env[2].value=200' \
  --set 'env[3].name=FAKEVLLM_BACKGROUND_AFTER' --set 'env[3].value=2s' --set 'env[4].name=FAKEVLLM_BACKGROUND_RAMP' --set 'env[4].value=3s') | sed 's/^/   /'
kc get leaderworkerset,configmap,service,pvc -l app.kubernetes.io/instance=group -o name | sed 's/^/   /'
leader=pod/group-0 follower=pod/group-0-1
for i in $(seq 1 240); do kc get "$leader" "$follower" >/dev/null 2>&1 && break; sleep 0.5; done
kc wait --for=condition=Ready "$leader" "$follower" --timeout=300s >/dev/null || {
  kc describe "$leader" "$follower" | tail -40; kc logs "$follower" | tail -20; fail "the group's pods did not become Ready"; }
addr=$(kc get "$follower" -o jsonpath='{.spec.containers[0].env[?(@.name=="LWS_LEADER_ADDRESS")].value}')
echo "   $leader and $follower Ready; the follower's LWS_LEADER_ADDRESS=$addr"
# gstatus POD: the Group line of `vllm-guard status` in POD ("" while the guard does not answer).
gstatus() { kc exec "$1" -- vllm-guard status 2>/dev/null > "$K/gstatus.txt" || true; grep -m1 '^Group:' "$K/gstatus.txt" || true; }
epoch() { sed -n 's/.*; epoch \([0-9]*\) .*/\1/p' <<<"$1"; }
rung() { sed -n 's/.* on rung \([0-9]*\);.*/\1/p' <<<"$1"; }
# settled POD RUNG: the group ready on RUNG, as POD's guard tells it.
settled() {
  for i in $(seq 1 240); do
    g=$(gstatus "$1"); [[ "$g" == *"the group is ready"* ]] && [ "$(rung "$g")" = "$2" ] && { echo "$g"; return 0; }; sleep 0.5
  done
  echo "$g"; return 1
}
# The simulator's background demand outgrows rung 0 on the leader two
# seconds after it is ready: the leader's guard restarts the group on rung 1.
g=$(settled "$leader" 1) || { kc logs "$leader" | tail -20; fail "the group is not ready on rung 1 after the leader's OOM: '$g'"; }
echo "   after the leader's GPU OOM, on the leader: $g"
# The follower's guard found the leader's by LWS_LEADER_ADDRESS (the
# cluster's DNS): it heard the group ready.
gf=$(settled "$follower" 1) || fail "the follower's guard does not see the group ready on rung 1: '$gf'"
echo "   on the follower: $gf"
uids() { kc get pod -l app.kubernetes.io/instance=group -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}/{.status.containerStatuses[0].restartCount} {end}'; }

phase "scenario: the follower's vLLM killed (kubectl exec kill -9): one in-place group restart, no pod recreated"
before=$(uids) e0=$(epoch "$g")
kc exec "$follower" -- sh -c 'kill -9 $(pidof vllm)'
for i in $(seq 1 240); do
  g=$(gstatus "$leader"); [ "$(epoch "$g")" != "$e0" ] && [[ "$g" == *"the group is ready"* ]] && break; sleep 0.5
done
gf=$(settled "$follower" 1) || fail "the follower's guard does not see the group ready on rung 1: '$gf'"
echo "   before: epoch $e0; after, on the leader: $g"
echo "   on the follower: $gf"
[[ "$g" == *"the group is ready"* ]] || fail "the group is not ready again after the follower's vLLM died: '$g'"
[ "$(epoch "$g")" = $((e0 + 1)) ] || fail "the leader's epoch went from $e0 to $(epoch "$g"), not by one: more or less than one group restart"
[ "$(epoch "$gf")" = $((e0 + 1)) ] || fail "the follower's epoch is $(epoch "$gf"), not $((e0 + 1))"
[ "$(uids)" = "$before" ] || fail "pods recreated or containers restarted: before '$before', after '$(uids)'"
echo "   pods (name=uid/container restarts) unchanged: $before"

phase "scenario: the follower's pod deleted: LeaderWorkerSet recreates the group once; the new guards start on the saved rung"
leaderuid=$(kc get "$leader" -o jsonpath='{.metadata.uid}')
kc delete "$follower" --wait=false >/dev/null
for i in $(seq 1 240); do
  u=$(kc get "$leader" -o jsonpath='{.metadata.uid}' 2>/dev/null || true); [ -n "$u" ] && [ "$u" != "$leaderuid" ] && break; sleep 0.5
done
[ -n "$u" ] && [ "$u" != "$leaderuid" ] || fail "the leader pod was not recreated after its follower's pod was deleted"
for i in $(seq 1 240); do kc get "$follower" >/dev/null 2>&1 && break; sleep 0.5; done
kc wait --for=condition=Ready "$leader" "$follower" --timeout=300s >/dev/null || { kc describe "$leader" "$follower" | tail -40; fail "the recreated group did not become Ready"; }
g=$(settled "$leader" 1) || { kc logs "$leader" | tail -20; fail "the recreated group is not ready on rung 1 (the leader's state claim): '$g'"; }
first=$(launches "$leader" | awk '{print $1}')
echo "   the recreated leader: $g; its first vLLM launched on rung $first"
[ "$first" = 1 ] || fail "the recreated leader launched vLLM first on rung ${first:-?}, not the saved rung 1"
gf=$(settled "$follower" 1) || fail "the recreated follower's guard does not see the group ready on rung 1: '$gf'"
ffirst=$(launches "$follower" | awk '{print $1}')
echo "   the recreated follower: $gf; its first vLLM launched on rung $ffirst"
[ "$ffirst" = 1 ] || fail "the recreated follower launched vLLM first on rung ${ffirst:-?}, not the leader's rung 1"
# Stable: a completion through the leader's proxy, then still one group,
# recreated once (LeaderWorkerSet's events), no container restarted.
after=$(uids)
lip=$(kc get "$leader" -o jsonpath='{.status.podIP}')
curl -fsS -m 30 "http://$lip:8080/v1/completions" -H 'Content-Type: application/json' -H "Authorization: Bearer $key" \
  -d '{"model":"org/model","prompt":"hello","max_tokens":4}' > "$K/completion.json" || fail "no completion through the recreated leader's proxy"
recreated=$(kc get events --field-selector reason=RecreateGroupOnPodRestart -o jsonpath='{range .items[*]}{.count}{"\n"}{end}' | awk '{n += ($1 ? $1 : 1)} END {print n + 0}')
kc get events --field-selector reason=RecreateGroupOnPodRestart -o jsonpath='{range .items[*]}   {.message} (x{.count}){"\n"}{end}'
echo "   pods now: $after"
[ "$recreated" = 1 ] || fail "LeaderWorkerSet recreated the group $recreated times, want once"
[ "$(uids)" = "$after" ] || fail "the group changed again after it was ready: '$after', then '$(uids)'"
[[ "$after" != *"/"[1-9]* ]] || fail "a container of the recreated group restarted: $after"


phase "scenario: a crash loop of the recreated group gives up and stays (on_give_up \"stay\"): no container restarted, no group recreated"
# give_up_after is 4 failed starts; the leader's claim kept those before the
# recreation (the OOM, the first kill, perhaps the deleted follower's end):
# the recreated group gives up after 2 more at most, not 4.
for k in 1 2 3 4; do
  e0=$(epoch "$(gstatus "$leader")")
  kc exec "$follower" -- sh -c 'kill -9 $(pidof vllm)'
  for i in $(seq 1 240); do
    g=$(gstatus "$leader"); head -1 "$K/gstatus.txt" | grep -q FAILED && break
    [ "$(epoch "$g")" != "$e0" ] && [[ "$g" == *"the group is ready"* ]] && break; sleep 0.5
  done
  head -1 "$K/gstatus.txt" | grep -q FAILED && break
  [[ "$g" == *"the group is ready"* ]] || fail "kill $k: the group neither gave up nor is ready again: '$g'"
done
sed -n 1,2p "$K/gstatus.txt" | sed 's/^/   /'
head -1 "$K/gstatus.txt" | grep -q FAILED || fail "the leader did not give up after $k failed starts of the recreated group"
echo "   the leader gave up after $k more failed starts (give_up_after 4)"
[ "$k" -le 2 ] || fail "the recreated group needed $k failures to give up: the failures before the recreation were not kept on the leader's claim"
kc wait --for=condition=Ready=false "$leader" --timeout=60s >/dev/null || fail "the leader pod is still Ready after its guard gave up"
recreated=$(kc get events --field-selector reason=RecreateGroupOnPodRestart -o jsonpath='{range .items[*]}{.count}{"\n"}{end}' | awk '{n += ($1 ? $1 : 1)} END {print n + 0}')
echo "   pods: $(uids); group recreations in all: $recreated"
[ "$(uids)" = "$after" ] || fail "a pod was recreated or a container restarted after the give-up: '$after', then '$(uids)'"
[ "$recreated" = 1 ] || fail "LeaderWorkerSet recreated the group $recreated times"

echo "test-k8s: Kubernetes $version, scenarios run: Ready only after the model answered; status through kubectl exec; a completion through the proxy; the state claim writable; the API key from a Secret, in no ConfigMap (401 without it, 200 with it); non-root on a read-only root file system; OOM handled without a container restart; kubectl delete pod drains a stream in flight ([DONE] within the grace period); the rung survives a pod delete; a GPU fault (XID 79) ends the guard with exit 69, the restarted guard waits on the lost GPU, the pod not Ready"
echo "test-k8s: LeaderWorkerSet $lwsversion, scenarios run: a group of two pods Ready (the leader by DNS); the follower's vLLM killed: one in-place group restart, no pod recreated; the follower's pod deleted: the group recreated once, on the saved rung 1, then stable; a crash loop after it gives up (the failures before the recreation counted) and stays, nothing recreated"
