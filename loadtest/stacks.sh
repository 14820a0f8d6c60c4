#!/usr/bin/env bash
# Load test: N Stacks of one Program on the local test bed, with the operator's local runtime (one agent
# process per Workspace). Measures the time from `kubectl apply` to every Stack Ready, and the resident
# memory of the operator (peak while converging, and at rest) and of the agents.
#
#   loadtest/stacks.sh [N]          N Stacks (default 100)
#   MAX_OPS=16 loadtest/stacks.sh   operations the operator drives at once (default 16)
#   TIMEOUT_S=1800                  give up after this many seconds (bounded run)
#
# Everything listens on 127.0.0.1; the run stops by itself and cleans up (namespace, operator, agents).
set -euo pipefail
N=${1:-100}
MAX_OPS=${MAX_OPS:-16}
TIMEOUT_S=${TIMEOUT_S:-1800}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN=/tmp/pko-load
NS=pko-load
fail() { echo "LOADTEST FAILED: $*" >&2; [ -f "$RUN/operator.log" ] && tail -20 "$RUN/operator.log" >&2; exit 1; }

eval "$("$ROOT/scripts/testbed/ensure.sh" 2>/dev/null | grep '^export')"
echo "building pko-operator and pko-agent (release)…"
(cd "$ROOT" && cargo build --release -p pko-operator -p pko-agent 2>&1 | grep -E '^(error|warning: unused)|Compiling pko-' || true)
[ -x "$ROOT/target/release/pko-operator" ] || fail "build failed"
BIN="$ROOT/target/release"

# the namespace without an operator: release the finalizers only the operator would remove, then delete it
delete_namespace() {
  for s in $(kubectl -n $NS get stacks,updates -o name 2>/dev/null); do kubectl -n $NS patch "$s" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1; done
  kubectl delete ns $NS "$@" >/dev/null 2>&1 || true
}
cleanup() {
  if [ -f "$RUN/operator.pid" ]; then kill -TERM "$(cat "$RUN/operator.pid")" 2>/dev/null || true; fi
  sleep 2
  pkill -TERM -f -- "--work-dir $RUN/agents" 2>/dev/null || true
  delete_namespace --wait=false
}
trap cleanup EXIT
if [ -f "$RUN/operator.pid" ]; then kill -TERM "$(cat "$RUN/operator.pid")" 2>/dev/null || true; fi
pkill -TERM -f -- "--work-dir $RUN/agents" 2>/dev/null || true
delete_namespace --wait=true --timeout=120s
rm -rf "$RUN" && mkdir -p "$RUN/state"

kubectl apply --server-side -f "$ROOT/deploy/crds/" >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl create namespace $NS >/dev/null
KCFG_SERVER="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
PULUMI_CONFIG_PASSPHRASE=load setsid "$BIN/pko-operator" run --runtime local --agent-bin "$BIN/pko-agent" \
  --program-fs-addr 127.0.0.1:19091 --max-operations "$MAX_OPS" --metrics-bind-address 127.0.0.1:18384 --metrics-secure=false --health-probe-bind-address 0 --namespaces $NS \
  --local-work-dir "$RUN/agents" --local-api-server "$KCFG_SERVER" --local-ca-file "$PKO_TESTBED_RUN/certs/ca.crt" \
  > "$RUN/operator.log" 2>&1 < /dev/null &
OP=$!
echo $OP > "$RUN/operator.pid"
sleep 1; kill -0 $OP || fail "the operator did not start"
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
IDLE_KIB=$(rss $OP)

{
  cat <<YAML
apiVersion: pulumi.com/v1
kind: Program
metadata: {name: load}
program:
  resources:
    r:
      type: command:local:Command
      properties: {create: "echo \${pulumi.stack}"}
  outputs:
    out: \${r.stdout}
YAML
  for i in $(seq -f '%04g' 1 "$N"); do
    printf -- '---\napiVersion: pulumi.com/v1\nkind: Stack\nmetadata: {name: s%s}\nspec: {stack: s%s, programRef: {name: load}, backend: "file://%s/state"}\n' "$i" "$i" "$RUN"
  done
} > "$RUN/manifests.yaml"

T0=$(date +%s)
kubectl -n $NS apply -f "$RUN/manifests.yaml" >/dev/null
echo "applied $N Stacks; waiting for Ready (progress every 10 s)"
PEAK=0; LAST=$T0
while :; do
  now=$(date +%s); [ $((now - T0)) -gt "$TIMEOUT_S" ] && fail "not all Stacks Ready after ${TIMEOUT_S} s"
  r=$(rss $OP); [ "$r" -gt "$PEAK" ] && PEAK=$r
  ready=$(kubectl -n $NS get stacks -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c '^True$' || true)
  [ "$ready" -ge "$N" ] && break
  if [ $((now - LAST)) -ge 10 ]; then LAST=$now; echo "  t=$((now - T0))s ready=$ready/$N operator_rss_mib=$((r / 1024))"; fi
  sleep 2
done
READY_S=$(( $(date +%s) - T0 ))
sleep 10   # let the last status writes and requeues settle
REST_KIB=$(rss $OP)
AGENTS_KIB=0; AGENTS=0
for p in $(pgrep -f -- "--work-dir $RUN/agents"); do AGENTS_KIB=$((AGENTS_KIB + $(rss "$p"))); AGENTS=$((AGENTS + 1)); done
UPDATES=$(kubectl -n $NS get updates -o name | wc -l)
FAILED=$(kubectl -n $NS get updates -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Failed")].status}/{.status.conditions[?(@.type=="Failed")].reason}{"\n"}{end}' | { grep '^True/' || true; } | sort | uniq -c | tr '\n' ' ')
echo "stacks=$N max_operations=$MAX_OPS all_ready_s=$READY_S updates=$UPDATES failed_updates_by_reason=[${FAILED:-none}]"
if [ -n "${KEEP:-}" ]; then trap - EXIT; echo "kept: namespace $NS, operator pid $OP (log $RUN/operator.log)"; fi
echo "operator_rss_mib: idle=$((IDLE_KIB / 1024)) peak=$((PEAK / 1024)) at_rest=$((REST_KIB / 1024))"
echo "agents=$AGENTS agents_rss_mib_total=$((AGENTS_KIB / 1024))"
curl -s http://127.0.0.1:18384/metrics | grep -E '^(stacks_active|programs_active|pko_update_operations_total|pko_update_operation_duration_seconds_(sum|count))' || true
