# The test bed node's names and addresses (sourced after versions.sh and lib.sh).
NODE_NAME="${TESTBED_NODE_NAME:-pko-node}"
NODE_IP="${TESTBED_NODE_IP:-10.250.0.1}"   # on lo (this kernel has no dummy links): not a loopback address, which the kubelet refuses
NODE_IFACE=lo
NODE_BRIDGE=pkocni0
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.0.0.0/24                   # kube-apiserver --service-cluster-ip-range
CLUSTER_DOMAIN=cluster.local
NODE_STATE="$TB_CACHE_ROOT/node"           # containerd's content and snapshots: kept, so images stay imported
NODE_RUNDIR=/run/pko-testbed
NODE_CONTAINERD_SOCK="$NODE_RUNDIR/containerd.sock"
NODE_KUBELET_ROOT=/var/lib/pko-testbed/kubelet
NODE_IMAGES="$TB_CACHE_ROOT/images"        # OCI archives made by `make images` (scripts/images/build.sh)
PAUSE_IMAGE=localhost/pause:local
# Whether the node's address is on its interface. The output is captured, not piped into `grep -q`:
# under `pipefail` grep's early exit SIGPIPEs `ip`, and the check failed at random.
has_node_ip() { [[ "$(ip -4 -o addr show dev "$NODE_IFACE" 2>/dev/null)" == *"inet $NODE_IP/"* ]]; }
# Whether the node's containerd holds image $1 (captured for the same reason).
has_image() { [[ $'\n'"$(ctr -a "$NODE_CONTAINERD_SOCK" -n k8s.io images ls -q 2>/dev/null)"$'\n' == *$'\n'"$1"$'\n'* ]]; }
