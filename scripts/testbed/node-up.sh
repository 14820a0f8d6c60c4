#!/usr/bin/env bash
# Starts the test bed's node (testbed.md §7) next to the running control plane: containerd (Debian's, with
# runc and the CNI bridge plugin), the pause image imported without a registry, kubelet, kube-proxy
# (iptables mode) and CoreDNS on the node's address, so that pods run as in a cluster and Service names
# resolve in them. Pods get routes to the Service range and the node only: nothing leaves this machine
# (and the FORWARD chain drops anything from the pod bridge to another interface).
# Idempotent: when the node's recorded processes are alive and the Node is Ready it prints its steps'
# state only. Called by ensure.sh after up.sh; records PIDs in $TB_RUN/node-pids (down.sh stops them).
#
#   TESTBED_NODE=0   skip the node (the bed's other tests do not need it)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/versions.sh"
. "$HERE/lib.sh"
. "$HERE/node/env.sh"
[ "${TESTBED_NODE:-1}" = 0 ] && { tb_log "node: skipped (TESTBED_NODE=0)"; exit 0; }
exec 8> "$TB_CACHE_ROOT/.node.lock"; flock 8

KCFG="$TB_RUN/admin.kubeconfig"; CERTS="$TB_RUN/certs"; N="$TB_RUN/node"
KUBECTL=("$TB_BIN/kubectl" --kubeconfig "$KCFG")
node_ready() { [ "$("${KUBECTL[@]}" get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
alive() {
  [ -f "$TB_RUN/node-pids" ] || return 1
  local name pid
  while read -r name pid; do kill -0 "$pid" 2>/dev/null || return 1; done < "$TB_RUN/node-pids"
}
node_env() { # what tests read (pko_testbed::TestBed::node); ensure.sh prints it after the bed's
  printf 'export PKO_TESTBED_NODE=%s\nexport PKO_TESTBED_NODE_IP=%s\nexport PKO_TESTBED_CONTAINERD=%s\n' "$NODE_NAME" "$NODE_IP" "$NODE_CONTAINERD_SOCK" > "$N/env.sh"
}
# A Node whose processes run but that is not Ready (a busy machine) gets 60 s before it is restarted:
# a restart kills every pod, and tests may be running some.
if alive; then
  for _ in $(seq 1 120); do node_ready && break; sleep 0.5; done
  if node_ready; then node_env; tb_log "node: $NODE_NAME already Ready"; exit 0; fi
  WHY="the Node is not Ready after 60 s"
else
  WHY="a node process is not running"
fi
if [ -f "$TB_RUN/node-pids" ]; then
  tb_log "node: stale or partial node found ($WHY); stopping it first"
  echo "$(date -u +%FT%TZ) node: $WHY" >> "$TB_CACHE_ROOT/restarts.log"
  mkdir -p "$TB_CACHE_ROOT/previous-run"; cp -r "$N/logs" "$TB_CACHE_ROOT/previous-run/node" 2>/dev/null || true
  "$HERE/node-down.sh"
fi

for b in kubelet kube-proxy coredns; do
  [ -x "$TB_BIN/$b" ] || { echo "missing $TB_BIN/$b: run scripts/testbed/build.sh (make testbed)" >&2; exit 1; }
done
for b in containerd ctr runc umoci iptables; do
  command -v "$b" >/dev/null || { echo "missing $b: run scripts/testbed/packages.sh (make testbed)" >&2; exit 1; }
done
has_node_ip || { echo "no $NODE_IP on $NODE_IFACE: up.sh adds it, which needs root (TESTBED_NODE=0 skips the node)" >&2; exit 1; }

T0=$SECONDS
mkdir -p "$N" "$N/logs" "$NODE_STATE" "$NODE_IMAGES"
: > "$TB_RUN/node-pids"
start() { tb_start "$TB_RUN/node-pids" "$N/logs" "$@"; }              # name cmd...
wait_for() { local w="$1" t="$2"; shift 2; tb_wait_for "node: $w" "$t" "$N/logs" "$@"; }   # what seconds cmd...

# --- containerd ---
t=$SECONDS
mkdir -p "$N/cni"
cat > "$N/containerd.toml" <<TOML
version = 2
root = "$NODE_STATE/containerd"
state = "$NODE_RUNDIR/containerd"
[grpc]
  address = "$NODE_CONTAINERD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  # this VM's root lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below its own (the sandbox asks -998)
  restrict_oom_score_adj = true
  sandbox_image = "$PAUSE_IMAGE"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$N/cni"
TOML
# Pods reach the node and the Service range through the bridge's gateway, and nothing else.
cat > "$N/cni/10-podnet.conflist" <<JSON
{ "cniVersion": "0.4.0", "name": "podnet", "plugins": [
  { "type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": { "type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$N/cni-ipam",
              "routes": [{"dst": "$SERVICE_CIDR"}, {"dst": "$NODE_IP/32"}] } },
  { "type": "portmap", "capabilities": {"portMappings": true} } ] }
JSON
start containerd containerd --config "$N/containerd.toml"
wait_for containerd 30 ctr -a "$NODE_CONTAINERD_SOCK" version
tb_log "node: containerd up in $((SECONDS - t)) s"

# --- the pause image, without a registry (testbed.md §7.3) ---
t=$SECONDS
"$HERE/node/import-image.sh" pause
tb_log "node: pause image in $((SECONDS - t)) s"

# --- network guards: pods reach nothing off this machine; the API server only the node and pods ---
iptables -C FORWARD -i "$NODE_BRIDGE" ! -o "$NODE_BRIDGE" -j DROP 2>/dev/null || iptables -I FORWARD -i "$NODE_BRIDGE" ! -o "$NODE_BRIDGE" -j DROP

# --- CoreDNS on the node's address ---
cat > "$N/Corefile" <<CORE
.:53 {
    bind $NODE_IP
    errors
    kubernetes $CLUSTER_DOMAIN in-addr.arpa {
        kubeconfig $KCFG pko-testbed
        pods insecure
        fallthrough in-addr.arpa
    }
    cache 5
}
CORE
start coredns "$TB_BIN/coredns" -conf "$N/Corefile"

# --- kube-proxy ---
cat > "$N/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KCFG}
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
metricsBindAddress: 127.0.0.1:20249
healthzBindAddress: 127.0.0.1:20256
mode: iptables
clusterCIDR: $POD_CIDR
conntrack: {maxPerCore: 0}
YAML
start kube-proxy "$TB_BIN/kube-proxy" --config "$N/kube-proxy.yaml"

# --- kubelet ---
t=$SECONDS
if [ ! -f "$CERTS/node.crt" ]; then
  ( cd "$CERTS"
    printf 'extendedKeyUsage=clientAuth\n' > node.ext
    openssl req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj "/O=system:nodes/CN=system:node:$NODE_NAME" 2>/dev/null
    openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out node.crt -days 3650 -extfile node.ext 2>/dev/null
    rm -f node.csr )
fi
SERVER="$(awk '/server:/{print $2; exit}' "$KCFG")"
cat > "$N/kubelet.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: pko-testbed
  cluster: {server: $SERVER, certificate-authority: $CERTS/ca.crt}
users:
- name: node
  user: {client-certificate: $CERTS/node.crt, client-key: $CERTS/node.key}
contexts:
- name: node
  context: {cluster: pko-testbed, user: node}
current-context: node
KC
cat > "$N/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$NODE_CONTAINERD_SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $CERTS/ca.crt}}
authorization: {mode: AlwaysAllow}
clusterDNS: [$NODE_IP]
clusterDomain: $CLUSTER_DOMAIN
resolvConf: ""
localStorageCapacityIsolation: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
YAML
# The kubelet sets three kernel sysctls at start (testbed.md §7.5); the shared VM gets its own back after.
# A Node object left by an earlier run would read Ready at once: the kubelet registers anew.
"${KUBECTL[@]}" delete node "$NODE_NAME" --ignore-not-found --wait=false >/dev/null
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops)
declare -A before; for k in "${SYSCTLS[@]}"; do before[$k]="$(sysctl -n "$k")"; done
start kubelet "$TB_BIN/kubelet" --config="$N/kubelet.yaml" --kubeconfig="$N/kubelet.kubeconfig" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --root-dir="$NODE_KUBELET_ROOT" \
  --pod-infra-container-image="$PAUSE_IMAGE"
wait_for "kubelet healthz" 60 curl -sf http://127.0.0.1:10248/healthz
for k in "${SYSCTLS[@]}"; do sysctl -qw "$k=${before[$k]}" || true; done
wait_for "Node $NODE_NAME Ready" 90 node_ready
# pods reach the API server through the Service `kubernetes` once kube-proxy has programmed it
wait_for "kube-proxy's rules for the Service kubernetes" 60 sh -c 'iptables -t nat -S KUBE-SERVICES 2>/dev/null | grep -q "default/kubernetes"' 
tb_log "node: kubelet up, $NODE_NAME Ready in $((SECONDS - t)) s"
echo "$((SECONDS - T0))" > "$N/start-seconds"
node_env
tb_log "node: up in $((SECONDS - T0)) s (containerd, kubelet, kube-proxy, CoreDNS at $NODE_IP)"
