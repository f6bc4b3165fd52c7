#!/usr/bin/env bash
# What the test cluster of test/k8s/run.sh could leave on this machine, and
# the check that it left none. run.sh sources this file; the tests in
# leftovers_test.go run its commands on recorded dumps.
#
#   leftovers.sh dump K        everything below, read from the machine (raw)
#   leftovers.sh view K        the cluster's part of a raw dump on stdin
#   leftovers.sh left B A      what is in the view A and not in the view B;
#                              exit 1 when anything is
#
# The view keeps only what is the cluster's, so that another process that
# mounts or adds an interface meanwhile is not blamed on it, and so that
# what exists only because somebody used a tool (an empty built-in
# iptables table) is not a leftover:
#   iptables   rules and non-built-in chains that are the kubelet's or the
#              CNI plugins' (KUBE-*, CNI-*, the bridge, the pod and service
#              ranges); never a table header, COMMIT or a built-in chain
#   links      the cluster's bridge and the pods' host-side veths
#   mounts     under the cluster's folder K, and the CNI network namespaces
#   netns      the CNI plugins' (cni-*)
#   cgroups    the kubelet's (kubepods) and containerd's (k8s.io)
#   logs       entries in the kubelet's fixed folders
#   processes  any whose command line names a path under K (the cluster's
#              components, LeaderWorkerSet's manager, the DNS server), or in
#              a kubepods cgroup
#   sysctls    the kernel settings the kubelet changes (kernel.panic, ...)

leftovers_bridge=k8stest0
leftovers_ranges='10\.244\.|10\.96\.'
# The kubelet's kernel tunables (its setupKernelTunables): it writes these
# unless --protect-kernel-defaults; run.sh puts them back.
leftovers_sysctls="vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes"

leftovers_dump() (
  set +eo pipefail # an empty list is an answer, not an error
  k=$1
  echo "### iptables"; iptables-save 2>/dev/null
  echo "### ip6tables"; ip6tables-save 2>/dev/null
  echo "### links"; ip -o link 2>/dev/null
  echo "### mounts"; cat /proc/mounts
  echo "### netns"; ip netns list 2>/dev/null
  echo "### cgroups"; ls -d /sys/fs/cgroup/kubepods* /sys/fs/cgroup/*/kubepods* /sys/fs/cgroup/k8s.io /sys/fs/cgroup/*/k8s.io 2>/dev/null
  echo "### logs"; ls -d /var/log/pods/* /var/log/containers/* 2>/dev/null
  echo "### processes"
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = "$BASHPID" ] || [ "$pid" = "$$" ] && continue
    cmd=$(tr '\0' ' ' 2>/dev/null < "$p/cmdline") || continue
    [ -n "$cmd" ] || continue
    cg=$(grep -m1 -oE 'kubepods[^ ]*' "$p/cgroup" 2>/dev/null)
    case "$cmd" in *"$k/"*) echo "$pid ${cg:--} $cmd" ;; *) [ -n "$cg" ] && echo "$pid $cg $cmd" ;; esac
  done
  echo "### sysctls"
  for s in $leftovers_sysctls; do if [ -r "/proc/sys/$s" ]; then echo "$s $(cat "/proc/sys/$s")"; fi; done
  true
)

# The cluster's part of a raw dump, one sorted line per thing.
leftovers_view() (
  k=$1
  awk -v k="$k" -v br="$leftovers_bridge" -v ranges="$leftovers_ranges" '
    /^### / { sec = $2; table = ""; next }
    sec == "iptables" || sec == "ip6tables" {
      if ($0 ~ /^\*/) { table = substr($0, 2); next }
      # A chain line is ":NAME POLICY [counters]"; a built-in chain has a
      # policy (ACCEPT, DROP), a chain somebody added has "-".
      if ($0 ~ /^:/) {
        name = substr($1, 2)
        if ($2 == "-" && name ~ /^(KUBE-|CNI-)/) print sec " " table " chain " name
        next
      }
      if ($0 ~ /^-A /) {
        if ($0 ~ /(KUBE-|CNI-)/ || index($0, br) || $0 ~ ranges) {
          gsub(/\[[0-9]+:[0-9]+\] /, "")
          print sec " " table " rule " $0
        }
      }
      next
    }
    sec == "links" {
      # "7: vethab12cd34@if2: <BROADCAST,...> ..." → vethab12cd34
      split($0, f, ": "); name = f[2]; sub(/@.*/, "", name)
      if (name == br || name ~ /^veth/) print "link " name
      next
    }
    sec == "mounts" {
      if (index($2, k) == 1 || $2 ~ /^(\/var)?\/run\/netns\/cni-/) print "mount " $2
      next
    }
    sec == "netns" { if ($1 ~ /^cni-/) print "netns " $1; next }
    sec == "cgroups" || sec == "logs" { if ($0 != "") print sec " " $0; next }
    sec == "processes" { if ($0 != "") print "process " $0; next }
    sec == "sysctls" { if ($0 != "") print "sysctl " $1 "=" $2; next }
  ' | sort -u
)

# What view $2 has that view $1 has not; exit 1 when anything.
leftovers_left() {
  local left
  left=$(comm -13 <(sort -u "$1") <(sort -u "$2"))
  [ -z "$left" ] && return 0
  printf '%s\n' "$left"
  return 1
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  case "${1:-}" in
    dump) leftovers_dump "$2" ;;
    view) leftovers_view "$2" ;;
    left) leftovers_left "$2" "$3" ;;
    *) echo "usage: leftovers.sh dump K | view K < DUMP | left BEFORE AFTER" >&2; exit 2 ;;
  esac
fi
