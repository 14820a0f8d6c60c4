#!/usr/bin/env bash
# Stops the test bed's node (what node-up.sh started) and leaves nothing behind for the next run: the
# pods' containers and their shims, the kubelet's mounts, the pod bridge, network namespaces, kube-proxy's
# and our iptables rules, the IPAM state. Images stay in containerd's content store.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/versions.sh"
. "$HERE/lib.sh"
. "$HERE/node/env.sh"
N="$TB_RUN/node"
stop_pid() { # name pid
  if kill -0 "$2" 2>/dev/null; then
    kill -TERM -- "-$2" 2>/dev/null || kill -TERM "$2" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$2" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$2" 2>/dev/null || kill -KILL "$2" 2>/dev/null
    tb_log "node: stopped $1 ($2)"
  fi
}
pid_of() { awk -v n="$1" '$1==n{print $2}' "$TB_RUN/node-pids" 2>/dev/null; }
[ -f "$TB_RUN/node-pids" ] || [ -S "$NODE_CONTAINERD_SOCK" ] || [ -d "$NODE_KUBELET_ROOT" ] || exit 0
# the kubelet first, so that it does not restart what is removed below
p="$(pid_of kubelet)"; [ -n "$p" ] && stop_pid kubelet "$p"
if [ -S "$NODE_CONTAINERD_SOCK" ]; then
  CTR=(ctr -a "$NODE_CONTAINERD_SOCK" -n k8s.io)
  for c in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s SIGKILL "$c" >/dev/null 2>&1; done
  sleep 1
  for c in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks rm -f "$c" >/dev/null 2>&1; done
  for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do "${CTR[@]}" containers rm "$c" >/dev/null 2>&1; done
fi
for name in kube-proxy coredns containerd; do p="$(pid_of "$name")"; [ -n "$p" ] && stop_pid "$name" "$p"; done
# shims of our containerd outlive it
pkill -KILL -f "containerd-shim-runc-v2 .*-address $NODE_CONTAINERD_SOCK" 2>/dev/null
[ -x "$TB_BIN/kube-proxy" ] && "$TB_BIN/kube-proxy" --cleanup >/dev/null 2>&1
iptables -D FORWARD -i "$NODE_BRIDGE" ! -o "$NODE_BRIDGE" -j DROP 2>/dev/null
if [ -d "$NODE_KUBELET_ROOT" ]; then
  findmnt -rn -o TARGET | grep "^$NODE_KUBELET_ROOT" | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  rm -rf "$NODE_KUBELET_ROOT"
fi
findmnt -rn -o TARGET | grep "^$NODE_RUNDIR" | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns delete "$ns" 2>/dev/null; done
ip link delete "$NODE_BRIDGE" 2>/dev/null
rm -rf "$NODE_RUNDIR" "$N" "$TB_RUN/node-pids"
tb_log "node: removed"
exit 0
