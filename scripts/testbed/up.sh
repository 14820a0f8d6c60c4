#!/usr/bin/env bash
# Starts the test bed on loopback: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
# redis-server, with generated certificates and an admin kubeconfig. Idempotent: when the recorded processes
# are alive and the API server is ready it only reprints the environment. Records PIDs in $TB_RUN/pids.
#
#   TESTBED_APISERVER_PORT (16443) TESTBED_ETCD_PORT (23790) TESTBED_REDIS_PORT (16379)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/versions.sh"
. "$HERE/lib.sh"
. "$HERE/node/env.sh"
mkdir -p "$TB_CACHE_ROOT"; exec 8> "$TB_CACHE_ROOT/.up.lock"; flock 8   # one up at a time per machine

AP="${TESTBED_APISERVER_PORT:-16443}"; EP="${TESTBED_ETCD_PORT:-23790}"; PP=$((EP + 10))
KP="${TESTBED_KCM_PORT:-20257}"; SP="${TESTBED_SCHEDULER_PORT:-20259}"; RP="${TESTBED_REDIS_PORT:-16379}"
CERTS="$TB_RUN/certs"; KCFG="$TB_RUN/admin.kubeconfig"

# The environment lines (rewritten on every call: a rebuilt bin directory is picked up at once).
write_env() {
  cat > "$TB_RUN/env.sh" <<ENV
export KUBECONFIG=$KCFG
export PATH=$TB_BIN:\$PATH
export REDIS_URL=redis://127.0.0.1:$RP
export PKO_TESTBED_BIN=$TB_BIN
export PKO_TESTBED_RUN=$TB_RUN
export PULUMI_BACKEND_URL=file://$TB_RUN/pulumi-state
export PULUMI_HOME=$TB_RUN/pulumi-home
export PULUMI_CONFIG_PASSPHRASE=pko-testbed
export PULUMI_SKIP_UPDATE_CHECK=true
export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
export PULUMI_DISABLE_REGISTRY_RESOLVE=true
export PULUMI_SKIP_CONFIRMATIONS=true
export PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK=true
ENV
}

print_env() {
  cat "$TB_RUN/env.sh"
}

alive() { # every recorded pid alive?
  [ -f "$TB_RUN/pids" ] || return 1
  local name pid
  while read -r name pid; do kill -0 "$pid" 2>/dev/null || return 1; done < "$TB_RUN/pids"
}

# The node's address, on lo, is where the API server listens: the host's processes and the node's pods
# (through the Service `kubernetes`) reach it there, and nothing off this machine can. Without the
# privilege to add it, the API server stays on 127.0.0.1 and the bed has no node.
has_node_ip || ip addr add "$NODE_IP/32" dev "$NODE_IFACE" 2>/dev/null || true
API_IP=127.0.0.1
has_node_ip && API_IP="$NODE_IP"
# A bed started by another version of this script (or on another address) is restarted.
CONFIG="$(cat "$0" "$HERE/node/env.sh" | sha256sum | cut -c1-12)-$API_IP"

ready() { # the API server answers /readyz; a busy one gets 20 s (a restart would break running tests)
  local i
  for i in $(seq 1 40); do
    curl -sf --max-time 5 --cacert "$CERTS/ca.crt" "https://$API_IP:$AP/readyz" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}
stale_reason() { # why the recorded run cannot be kept ("" when it can)
  [ -f "$TB_RUN/pids" ] || { echo "no run recorded"; return; }
  local name pid
  while read -r name pid; do kill -0 "$pid" 2>/dev/null || { echo "$name ($pid) is not running"; return; }; done < "$TB_RUN/pids"
  [ "$(cat "$TB_RUN/config" 2>/dev/null)" = "$CONFIG" ] || { echo "started with another configuration ($(cat "$TB_RUN/config" 2>/dev/null) ≠ $CONFIG)"; return; }
  ready || echo "the API server at $API_IP:$AP is not ready after 20 s"
}
WHY="$(stale_reason)"
if [ -z "$WHY" ]; then
  tb_log "already running (run dir $TB_RUN)"
  write_env; print_env; exit 0
fi
if [ -f "$TB_RUN/pids" ]; then
  tb_log "stale or partial run found ($WHY); stopping it first (its logs: $TB_CACHE_ROOT/previous-run)"
  rm -rf "$TB_CACHE_ROOT/previous-run"; cp -r "$TB_RUN/logs" "$TB_CACHE_ROOT/previous-run" 2>/dev/null || true
  [ -d "$TB_RUN/node/logs" ] && cp -r "$TB_RUN/node/logs" "$TB_CACHE_ROOT/previous-run/node" 2>/dev/null
  echo "$(date -u +%FT%TZ) $WHY" >> "$TB_CACHE_ROOT/restarts.log"
  "$HERE/down.sh"
fi

for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  [ -x "$TB_BIN/$b" ] || { echo "missing $TB_BIN/$b: run scripts/testbed/build.sh (make testbed)" >&2; exit 1; }
done
for b in etcd redis-server openssl; do
  command -v "$b" >/dev/null || { echo "missing $b: run scripts/testbed/packages.sh (make testbed)" >&2; exit 1; }
done

T0=$SECONDS
mkdir -p "$TB_RUN" "$CERTS" "$TB_RUN/logs"
: > "$TB_RUN/pids"

# --- certificates (openssl) ---
gen_certs() {
  cd "$CERTS"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=pko-testbed-ca" 2>/dev/null
  cat > apiserver.ext <<EXT
subjectAltName=IP:127.0.0.1,IP:$NODE_IP,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
EXT
  printf 'extendedKeyUsage=clientAuth\n' > client.ext
  sign() { # name subject extfile
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 3650 -extfile "$3" 2>/dev/null
    rm -f "$1.csr"
  }
  sign apiserver "/CN=kube-apiserver" apiserver.ext
  sign admin "/O=system:masters/CN=pko-testbed-admin" client.ext
  sign kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client.ext
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  cd - >/dev/null
}
[ -f "$CERTS/sa.pub" ] || gen_certs
# The aggregation layer's front proxy (extension API servers, e.g. the operator's logs.pulumi.com): its own CA, as
# kubeadm makes it, so a client certificate of the cluster CA is never taken for the proxy.
gen_front_proxy_certs() {
  cd "$CERTS"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout front-proxy-ca.key -out front-proxy-ca.crt -days 3650 \
    -subj "/CN=pko-testbed-front-proxy-ca" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr \
    -subj "/CN=front-proxy-client" 2>/dev/null
  openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial \
    -out front-proxy-client.crt -days 3650 -extfile client.ext 2>/dev/null
  rm -f front-proxy-client.csr
  cd - >/dev/null
}
[ -f "$CERTS/front-proxy-client.crt" ] || gen_front_proxy_certs

cat > "$KCFG" <<KC
apiVersion: v1
kind: Config
clusters:
- name: pko-testbed
  cluster:
    server: https://$API_IP:$AP
    certificate-authority: $CERTS/ca.crt
users:
- name: admin
  user:
    client-certificate: $CERTS/admin.crt
    client-key: $CERTS/admin.key
contexts:
- name: pko-testbed
  context: {cluster: pko-testbed, user: admin}
current-context: pko-testbed
KC

start() { tb_start "$TB_RUN/pids" "$TB_RUN/logs" "$@"; }              # name cmd...
wait_for() { local w="$1" t="$2"; shift 2; tb_wait_for "$w" "$t" "$TB_RUN/logs" "$@"; }   # what seconds cmd...

# etcd data on tmpfs when available: fsync-heavy etcd is the slowest part of an API server on a VM disk.
ETCD_DATA="/dev/shm/pko-testbed-etcd-$AP"; [ -d /dev/shm ] || ETCD_DATA="$TB_RUN/etcd"
rm -rf "$ETCD_DATA"; mkdir -p "$ETCD_DATA"; echo "$ETCD_DATA" > "$TB_RUN/etcd-data-dir"
start etcd etcd --name pko-testbed --data-dir "$ETCD_DATA" \
  --listen-client-urls "http://127.0.0.1:$EP" --advertise-client-urls "http://127.0.0.1:$EP" \
  --listen-peer-urls "http://127.0.0.1:$PP" --initial-advertise-peer-urls "http://127.0.0.1:$PP" \
  --initial-cluster "pko-testbed=http://127.0.0.1:$PP"
wait_for etcd 30 curl -sf "http://127.0.0.1:$EP/health"

start redis redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --dir "$TB_RUN" --protected-mode yes
wait_for redis 15 redis-cli -p "$RP" ping

# Audit: only writes by service accounts of the namespace pko-audit (the fleet's fencing test runs each
# replica as one of them, so every write can be attributed to a replica); nothing else is logged.
cat > "$TB_RUN/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:pko-audit"]
  verbs: ["create", "update", "patch", "delete"]
- level: None
POLICY
start kube-apiserver "$TB_BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$EP" \
  --audit-policy-file="$TB_RUN/audit-policy.yaml" --audit-log-path="$TB_RUN/logs/audit.log" \
  --audit-log-maxsize=100 --audit-log-maxbackup=1 --audit-log-mode=blocking \
  --bind-address="$API_IP" --advertise-address="$API_IP" --secure-port="$AP" \
  --tls-cert-file="$CERTS/apiserver.crt" --tls-private-key-file="$CERTS/apiserver.key" \
  --client-ca-file="$CERTS/ca.crt" --authorization-mode=Node,RBAC --allow-privileged=true \
  --service-cluster-ip-range=10.0.0.0/24 \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$CERTS/sa.pub" --service-account-signing-key-file="$CERTS/sa.key" \
  --kubelet-client-certificate="$CERTS/kubelet-client.crt" --kubelet-client-key="$CERTS/kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP --enable-priority-and-fairness=false \
  --storage-media-type=application/json --event-ttl=1h \
  --requestheader-client-ca-file="$CERTS/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="$CERTS/front-proxy-client.crt" --proxy-client-key-file="$CERTS/front-proxy-client.key" \
  --enable-aggregator-routing=true
wait_for kube-apiserver 120 curl -sf --cacert "$CERTS/ca.crt" "https://$API_IP:$AP/readyz"

start kube-controller-manager "$TB_BIN/kube-controller-manager" --kubeconfig="$KCFG" \
  --authentication-kubeconfig="$KCFG" --authorization-kubeconfig="$KCFG" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port="$KP" \
  --service-account-private-key-file="$CERTS/sa.key" --root-ca-file="$CERTS/ca.crt" \
  --use-service-account-credentials=false --controllers='*' \
  --concurrent-gc-syncs=5 --namespace-sync-period=10s
start kube-scheduler "$TB_BIN/kube-scheduler" --kubeconfig="$KCFG" \
  --authentication-kubeconfig="$KCFG" --authorization-kubeconfig="$KCFG" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port="$SP"
wait_for kube-controller-manager 60 curl -sfk "https://127.0.0.1:$KP/healthz"
wait_for "default ServiceAccount" 60 "$TB_BIN/kubectl" --kubeconfig "$KCFG" get serviceaccount default -n default

write_env
echo "$CONFIG" > "$TB_RUN/config"
mkdir -p "$TB_RUN/pulumi-state" "$TB_RUN/pulumi-home"
echo "$((SECONDS - T0))" > "$TB_RUN/start-seconds"
tb_log "control plane and redis up in $((SECONDS - T0)) s (run dir $TB_RUN)"
print_env
