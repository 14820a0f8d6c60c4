#!/usr/bin/env bash
# `make demo`: the operator's main job end to end on the local test bed.
#  1. test bed up (built on a cold machine); operator and agent built
#  2. a git repository served on loopback (git daemon), the CRDs, the operator with the local runtime
#  3. the sample manifests of deploy/examples (Program + Stack, a Stack tracking a git branch, a Stack
#     with plain, structured and secret config) until every Stack is Ready; their outputs
#  4. a new commit on the tracked branch → the new Update
#  5. deleting a Stack with destroyOnFinalize → the program's delete ran
# With REPLICAS=N (N > 1), N operator replicas form a fleet over the bed's redis-server: the demo prints
# who holds which shards and the queue, and SIGKILLs the replica holding the tracked-branch Stack before
# the push, so its new update runs on a survivor.
# Ends with one success line, or fails loudly with the reason. `make demo-down` cleans up.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEMO=/tmp/pko-demo
NS=pko-demo
GIT_PORT=18418
REPLICAS=${REPLICAS:-1}
fail() { echo "DEMO FAILED: $*" >&2; for l in "$DEMO"/operator*.log; do [ -f "$l" ] && { echo "-- $l" >&2; tail -20 "$l" >&2; }; done; exit 1; }
step() { printf '\n== %s\n' "$*"; }
trap 'fail "a command failed (line $LINENO)"' ERR
. "$ROOT/scripts/demo-git.sh"

step "test bed"
# its progress (each component built on a cold machine, with a heartbeat) goes to the terminal
eval "$(TESTBED_PROFILE=demo "$ROOT/scripts/testbed/ensure.sh" | grep '^export')"
"$ROOT/scripts/demo-down.sh" >/dev/null 2>&1 || true
kubectl wait --for=delete namespace/$NS --timeout=120s >/dev/null 2>&1 || true
mkdir -p "$DEMO/state"   # the examples use the file:// backend file:///tmp/pko-demo/state

step "building pko-operator, pko-agent and kubectl-pko"
rust_build() { # cargo build with a progress line every 30 s (a cold build takes minutes on two cores)
  local log="$DEMO/cargo-build.log" t0=$SECONDS n=0 pid
  (cd "$ROOT" && cargo build -p pko-operator -p pko-agent -p pko-cli) > "$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1; n=$((n + 1))
    [ $((n % 30)) -eq 0 ] && echo "  still building ($((SECONDS - t0)) s): $(grep -c ' Compiling ' "$log") crates compiled, now $(grep ' Compiling ' "$log" | tail -1 | awk '{print $2}')"
  done
  wait "$pid" || { tail -30 "$log" >&2; fail "cargo build failed (log: $log)"; }
  echo "  built in $((SECONDS - t0)) s ($(grep -c ' Compiling ' "$log") crates compiled)"
}
rust_build
BIN="$ROOT/target/debug"

step "git repository on git://127.0.0.1:$GIT_PORT/demo.git"
demo_git_serve 127.0.0.1

step "CRDs and the operator (local runtime)"
kubectl apply --server-side -f "$ROOT/deploy/crds/" >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl create namespace $NS >/dev/null
# no Role for the workspaces' service account: as with PKO, the Stacks' Secrets reach Pulumi without one
KCFG_SERVER="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
# the API server's own address (the bed's node address, on lo): its aggregator reaches the replicas' logs API there
API_IP="$(echo "$KCFG_SERVER" | sed -E 's#https://([^:/]+).*#\1#')"
FLEET=()
if [ "$REPLICAS" -gt 1 ]; then
  # a fleet: Lease-held shards in the demo namespace, the work queue in the bed's redis-server
  redis-cli -u "$REDIS_URL" --scan --pattern 'pko-demo:*' | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null
  FLEET=(--fleet --fleet-namespace $NS --shards 64 --redis-url "$REDIS_URL" --redis-prefix pko-demo)
fi
for i in $(seq 0 $((REPLICAS - 1))); do
  setsid "$BIN/pko-operator" run --runtime local --agent-bin "$BIN/pko-agent" --program-fs-addr 127.0.0.1:$((19090 + i)) \
    --metrics-bind-address 127.0.0.1:$((18383 + i)) --health-probe-bind-address 127.0.0.1:$((18081 + i)) --namespaces $NS \
    --logs-api-bind-address "$API_IP:$((18443 + i))" --webhook-bind-address 127.0.0.1:$((19292 + i)) \
    --local-work-dir "$DEMO/agents" --local-api-server "$KCFG_SERVER" --local-ca-file "$PKO_TESTBED_RUN/certs/ca.crt" \
    ${FLEET[@]+"${FLEET[@]}"} ${FLEET[@]+--replica-id demo-$i} \
    > "$DEMO/operator-$i.log" 2>&1 < /dev/null &
  echo $! > "$DEMO/operator-$i.pid"
  disown   # the demo kills one replica on purpose: no job-control notice
done
sleep 1
for i in $(seq 0 $((REPLICAS - 1))); do kill -0 "$(cat "$DEMO/operator-$i.pid")" || fail "operator replica $i did not start"; done
echo "  $REPLICAS operator replica(s) started"

step "sample manifests (deploy/examples)"
T0=$(date +%s.%N)
kubectl -n $NS apply -f "$ROOT/deploy/examples/" | sed 's/^/  /'
for s in hello configured from-git; do
  kubectl -n $NS wait --for=condition=Ready "stack/$s" --timeout=180s >/dev/null || fail "stack $s is not Ready: $(kubectl -n $NS get stack $s -o jsonpath='{.status.conditions}')"
done
READY_S=$(awk "BEGIN{print $(date +%s.%N) - $T0}")
kubectl -n $NS get stacks,workspaces,updates
echo; echo "outputs:"
for s in hello configured from-git; do echo "  $s: $(kubectl -n $NS get stack $s -o jsonpath='{.status.outputs}')"; done
kubectl -n $NS get stack configured -o jsonpath='{.status.outputs}' | grep -q 'not-a-real-key' && fail "a secret reached the Stack status"
echo; echo "agent pools: the Workspaces of one class (namespace, service account, image, template) share one pool;"
echo "no agent per Stack (PKO: one pod per Stack, 24/7):"
kubectl -n $NS get workspaces -o custom-columns='  WORKSPACE:.metadata.name,POOL:.status.pool' | sed 's/^/  /'
echo "  pko-agent processes now: $(pgrep -fc "$DEMO/agents/pools" || true); idle ones stop after 60 s (--pool-idle-timeout-seconds)"
# /metrics is HTTPS and needs a token allowed `get /metrics` (--metrics-secure, as in PKO): a scraper's
# service account bound to the pko-metrics-reader role of deploy/manifests/operator.yaml
kubectl create clusterrole pko-metrics-reader --verb=get --non-resource-url=/metrics --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null
kubectl -n $NS create serviceaccount metrics-scraper >/dev/null
kubectl create clusterrolebinding "pko-metrics-$NS" --clusterrole=pko-metrics-reader --serviceaccount=$NS:metrics-scraper --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null
SCRAPE_TOKEN="$(kubectl -n $NS create token metrics-scraper)"
metrics() { curl -sk -H "Authorization: Bearer $SCRAPE_TOKEN" "https://127.0.0.1:$((18383 + ${1:-0}))/metrics"; }
ACTIVE=0
for i in $(seq 0 $((REPLICAS - 1))); do
  echo; echo "metrics of replica $i (https://127.0.0.1:$((18383 + i))/metrics, as $NS:metrics-scraper):"
  metrics "$i" | grep -E '^(stacks_active|stacks_failing|programs_active|pko_update_operations_total|pko_fleet_shards_held)' | sed 's/^/  /'
  ACTIVE=$((ACTIVE + $(metrics "$i" | awk '/^stacks_active /{print $2}')))
done
[ "$ACTIVE" = 3 ] || fail "the replicas report $ACTIVE active stacks, not 3"
[ "$(curl -sk -o /dev/null -w '%{http_code}' https://127.0.0.1:18383/metrics)" = 401 ] || fail "the metrics endpoint answers without a token"

shard_holder() { # the replica holding the shard of stack $1 (from the shard table, Lease pko-shards-<S>)
  local shard; shard=$(kubectl -n $NS get stack "$1" -o jsonpath='{.metadata.labels.pulumi\.com/shard}')
  python3 "$ROOT/scripts/shard_table.py" holders $NS | awk -v k="$shard" '$1 == k && $2 != "-" {print $2}'
}
if [ "$REPLICAS" -gt 1 ]; then
  step "the fleet: who holds what"
  echo "  shards held per replica (the shard table, Lease pko-shards-<S>):"
  python3 "$ROOT/scripts/shard_table.py" holders $NS | awk '{print $2}' | sort | uniq -c | sed 's/^/   /'
  for s in hello configured from-git; do echo "  stack $s: shard $(kubectl -n $NS get stack $s -o jsonpath='{.metadata.labels.pulumi\.com/shard}'), held by $(shard_holder $s)"; done
  echo "  the queue in redis ($REDIS_URL, prefix pko-demo): $(redis-cli -u "$REDIS_URL" --scan --pattern 'pko-demo:job:*' | wc -l) job(s) recorded, fences: $(redis-cli -u "$REDIS_URL" --scan --pattern 'pko-demo:fence:*' | wc -l) shard(s)"
  echo "  kubectl pko fleet (the fleet found from its Leases, no flags):"
  PATH="$BIN:$PATH" kubectl pko fleet | sed 's/^/    /'
  VICTIM=$(shard_holder from-git); VICTIM_I=${VICTIM#demo-}
  step "SIGKILL of replica $VICTIM (it holds from-git's shard)"
  kill -KILL -- "-$(cat "$DEMO/operator-$VICTIM_I.pid")" 2>/dev/null || kill -KILL "$(cat "$DEMO/operator-$VICTIM_I.pid")"
  rm -f "$DEMO/operator-$VICTIM_I.pid"
  TK=$(date +%s.%N)
  for _ in $(seq 1 120); do H=$(shard_holder from-git); [ -n "$H" ] && [ "$H" != "$VICTIM" ] && break; sleep 0.5; done
  [ "$(shard_holder from-git)" != "$VICTIM" ] || fail "nobody took over from-git's shard"
  printf '  from-git'"'"'s shard is now held by %s, %.1f s after the kill (membership lease 15 s)\n' "$(shard_holder from-git)" "$(awk "BEGIN{print $(date +%s.%N) - $TK}")"
fi

step "a Receiver: the push is delivered as a GitHub webhook, signed with the Receiver's token"
HOOK_TOKEN="$(head -c 24 /dev/urandom | base64 | tr -d '/+=')"
kubectl -n $NS create secret generic demo-hook --from-literal=token="$HOOK_TOKEN" >/dev/null
kubectl -n $NS apply -f - >/dev/null <<'YAML'
apiVersion: pulumi.com/v1alpha1
kind: Receiver
metadata: {name: pushes}
spec:
  type: github
  events: [push]
  secretRef: {name: demo-hook}
  resources: [{kind: Stack, name: from-git}]
YAML
for _ in $(seq 1 60); do HOOK_PATH="$(kubectl -n $NS get receiver pushes -o jsonpath='{.status.webhookPath}')"; [ -n "$HOOK_PATH" ] && break; sleep 0.5; done
[ -n "$HOOK_PATH" ] || fail "the Receiver published no webhook path: $(kubectl -n $NS get receiver pushes -o jsonpath='{.status.conditions}')"
kubectl -n $NS get receivers | sed 's/^/  /'
for i in $(seq 0 $((REPLICAS - 1))); do [ -f "$DEMO/operator-$i.pid" ] && { HOOK_PORT=$((19292 + i)); break; }; done
deliver() { # a GitHub push delivery of commit $1 to a live replica; signature $2 (default: the token's)
  local body sig
  body="{\"ref\":\"refs/heads/main\",\"after\":\"$1\",\"repository\":{\"clone_url\":\"git://127.0.0.1:$GIT_PORT/demo.git\"}}"
  sig="${2:-$(printf '%s' "$body" | openssl dgst -sha256 -hmac "$HOOK_TOKEN" | awk '{print $NF}')}"
  curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$HOOK_PORT$HOOK_PATH" -H 'X-GitHub-Event: push' \
    -H "X-Hub-Signature-256: sha256=$sig" -d "$body"
}
echo "  a forged delivery (wrong signature) answers $(deliver 0000000000000000000000000000000000000000 00ff) and wakes nothing"

step "a new commit on the tracked branch"
NEW_SHA=$(demo_git_push_release_2)
T1=$(date +%s.%N)
echo "  push delivered: HTTP $(deliver "$NEW_SHA") (the 60 s poll of resyncFrequencySeconds stays as the fallback)"
for _ in $(seq 1 1500); do
  kubectl -n $NS get stack from-git -o jsonpath='{.status.currentUpdate.commit} {.status.lastUpdate.lastAttemptedCommit}' | grep -q "$NEW_SHA" && break
  sleep 0.05
done
PUSH_S=$(awk "BEGIN{print $(date +%s.%N) - $T1}")
kubectl -n $NS get stack from-git -o jsonpath='{.status.currentUpdate.commit} {.status.lastUpdate.lastAttemptedCommit}' | grep -q "$NEW_SHA" || fail "no update for commit $NEW_SHA"
for _ in $(seq 1 120); do
  kubectl -n $NS get stack from-git -o jsonpath='{.status.lastUpdate.lastSuccessfulCommit}' | grep -q "$NEW_SHA" && break; sleep 0.5
done
kubectl -n $NS get updates -l pulumi.com/stack-name=from-git
echo "  from-git outputs: $(kubectl -n $NS get stack from-git -o jsonpath='{.status.outputs}')"
echo "  kubectl pko receivers:"
PATH="$BIN:$PATH" kubectl pko receivers -n $NS | sed 's/^/    /'

step "what Pulumi printed: kubectl pko logs stack/from-git (kept by the operator, outside etcd)"
# the aggregated API logs.pulumi.com, served by every live replica, routed by an APIService (the chart makes it
# for a pod install; here the replicas are processes on the node's address)
logs_api_route "$NS" $(for i in $(seq 0 $((REPLICAS - 1))); do [ -f "$DEMO/operator-$i.pid" ] && echo $((18443 + i)); done)
echo "  with the admin kubeconfig (a client certificate), no flags:"
PATH="$BIN:$PATH" kubectl pko logs stack/from-git -n $NS | sed 's/^/    /'
# a tenant with the built-in `view` role in this namespace reads its Stacks' output (the chart's aggregated rule
# for stacks/log), and nobody else's
kubectl apply --server-side -f - >/dev/null <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pko-demo-logs-view, labels: {rbac.authorization.k8s.io/aggregate-to-view: "true"}}
rules: [{apiGroups: [logs.pulumi.com], resources: [stacks/log, updates/log], verbs: [get]}]
YAML
kubectl -n $NS create serviceaccount viewer >/dev/null
kubectl -n $NS create rolebinding viewer --clusterrole=view --serviceaccount=$NS:viewer >/dev/null
VIEWER="$DEMO/viewer.kubeconfig"
kubectl config view --minify --raw --flatten > "$VIEWER"
KUBECONFIG="$VIEWER" kubectl config set-credentials viewer --token="$(kubectl -n $NS create token viewer)" >/dev/null
KUBECONFIG="$VIEWER" kubectl config set-context --current --user=viewer --namespace=$NS >/dev/null
for _ in $(seq 1 20); do KUBECONFIG="$VIEWER" PATH="$BIN:$PATH" kubectl pko logs stack/from-git >/dev/null 2>&1 && break; sleep 0.5; done
echo "  as $NS:viewer (view in $NS, a token): $(KUBECONFIG="$VIEWER" PATH="$BIN:$PATH" kubectl pko logs stack/from-git | wc -l) lines"
REFUSED="$(KUBECONFIG="$VIEWER" PATH="$BIN:$PATH" kubectl pko logs stack/from-git -n default 2>&1 || true)"
echo "  as $NS:viewer in namespace default: $REFUSED"
echo "$REFUSED" | grep -q forbidden || fail "a view tenant read another namespace's output"
echo; echo "kubectl pko status (why each Stack is or is not Ready, its shard and owner; the fleet found from its Leases):"
PATH="$BIN:$PATH" kubectl pko status -n $NS | sed 's/^/  /'
# the metrics port keeps the same output for Prometheus-only setups: callers allowed `get` on the Stack
kubectl -n $NS create role stack-reader --verb=get --resource=stacks.pulumi.com >/dev/null
kubectl -n $NS create serviceaccount stack-reader >/dev/null
kubectl -n $NS create rolebinding stack-reader --role=stack-reader --serviceaccount=$NS:stack-reader >/dev/null
READ_TOKEN="$(kubectl -n $NS create token stack-reader)"
for i in $(seq 0 $((REPLICAS - 1))); do [ -f "$DEMO/operator-$i.pid" ] && { LOGS_PORT=$((18383 + i)); break; }; done
[ "$(curl -sk -o /dev/null -w '%{http_code}' "https://127.0.0.1:$LOGS_PORT/logs/$NS/from-git")" = 401 ] \
  || fail "the logs endpoint answers without a token"
# bytes of Pulumi output stored per operation, over every kept operation of the demo's Stacks
for s in hello configured from-git; do
  for u in $(curl -sk -H "Authorization: Bearer $READ_TOKEN" "https://127.0.0.1:$LOGS_PORT/logs/$NS/$s" | jq -r '.operations[].update'); do
    curl -sk -H "Authorization: Bearer $READ_TOKEN" "https://127.0.0.1:$LOGS_PORT/logs/$NS/$s/$u" | jq '[.lines[] | (.text | length) + (.time | length) + (.stream | length) + 8] | add'
  done
done | awk '{n++; t+=$1; if ($1>m) m=$1} END {printf "  stored per operation: %d operations, mean %.0f bytes, max %d bytes (line text, time, stream)\n", n, t/n, m}'

step "deleting stack hello (destroyOnFinalize)"
rm -f "$DEMO/destroyed-dev.txt"
kubectl -n $NS delete stack hello --timeout=120s >/dev/null
[ -f "$DEMO/destroyed-dev.txt" ] || fail "the program's delete did not run"
echo "  $(cat "$DEMO/destroyed-dev.txt") (written by the command provider's delete)"

echo
FLEET_NOTE=""
[ "$REPLICAS" -gt 1 ] && FLEET_NOTE=" ($REPLICAS replicas; the push ran on $(shard_holder from-git) after $VICTIM was killed)"
printf 'DEMO OK: 3 stacks Ready %.1f s after apply, branch push -> new update in %.1f s (a signed webhook to a Receiver)%s, destroyOnFinalize destroyed the resources. `make demo-down` cleans up.\n' "$READY_S" "$PUSH_S" "$FLEET_NOTE"
