#!/usr/bin/env bash
# `make demo`: the operator's main job end to end on the local test bed.
#  1. test bed up (built on a cold machine); operator and agent built
#  2. a git repository served on loopback (git daemon), the CRDs, the operator with the local runtime
#  3. the sample manifests of deploy/examples (Program + Stack, a Stack tracking a git branch, a Stack
#     with plain, structured and secret config) until every Stack is Ready; their outputs
#  4. a new commit on the tracked branch → the new Update
#  5. deleting a Stack with destroyOnFinalize → the program's delete ran
# Ends with one success line, or fails loudly with the reason. `make demo-down` cleans up.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEMO=/tmp/pko-demo
NS=pko-demo
GIT_PORT=18418
fail() { echo "DEMO FAILED: $*" >&2; [ -f "$DEMO/operator.log" ] && tail -20 "$DEMO/operator.log" >&2; exit 1; }
step() { printf '\n== %s\n' "$*"; }
trap 'fail "a command failed (line $LINENO)"' ERR

step "test bed"
eval "$("$ROOT/scripts/testbed/ensure.sh" 2>/dev/null | grep '^export')"
"$ROOT/scripts/demo-down.sh" >/dev/null 2>&1 || true
kubectl wait --for=delete namespace/$NS --timeout=120s >/dev/null 2>&1 || true
mkdir -p "$DEMO/state"   # the examples use the file:// backend file:///tmp/pko-demo/state

step "building pko-operator and pko-agent"
(cd "$ROOT" && cargo build -q -p pko-operator -p pko-agent)
BIN="$ROOT/target/debug"

step "git repository on git://127.0.0.1:$GIT_PORT/demo.git"
rm -rf "$DEMO/git" "$DEMO/work" && mkdir -p "$DEMO/git" "$DEMO/work/app"
git init -q --bare "$DEMO/git/demo.git"
cat > "$DEMO/work/app/Pulumi.yaml" <<'YAML'
name: demo
runtime: yaml
resources:
  release:
    type: command:local:Command
    properties:
      create: echo "release 1"
outputs:
  release: ${release.stdout}
YAML
git -C "$DEMO/work" init -q -b main && git -C "$DEMO/work" add . && git -C "$DEMO/work" -c user.email=demo@pko -c user.name=demo commit -q -m "release 1"
git -C "$DEMO/work" push -q "$DEMO/git/demo.git" main
setsid git daemon --reuseaddr --base-path="$DEMO/git" --export-all --listen=127.0.0.1 --port=$GIT_PORT "$DEMO/git" > "$DEMO/git-daemon.log" 2>&1 < /dev/null &
echo $! > "$DEMO/git-daemon.pid"
for _ in $(seq 1 50); do git ls-remote "git://127.0.0.1:$GIT_PORT/demo.git" >/dev/null 2>&1 && break; sleep 0.1; done

step "CRDs and the operator (local runtime)"
kubectl apply --server-side -f "$ROOT/deploy/crds/" >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl create namespace $NS >/dev/null
kubectl -n $NS create role pulumi-workspace --verb=get --resource=secrets,configmaps >/dev/null
kubectl -n $NS create rolebinding pulumi-workspace --role=pulumi-workspace --serviceaccount=$NS:default >/dev/null
KCFG_SERVER="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
setsid "$BIN/pko-operator" run --runtime local --agent-bin "$BIN/pko-agent" --program-fs-addr 127.0.0.1:19090 \
  --metrics-bind-address 127.0.0.1:18383 --health-probe-bind-address 127.0.0.1:18081 --namespaces $NS \
  --local-work-dir "$DEMO/agents" --local-api-server "$KCFG_SERVER" --local-ca-file "$PKO_TESTBED_RUN/certs/ca.crt" \
  > "$DEMO/operator.log" 2>&1 < /dev/null &
echo $! > "$DEMO/operator.pid"
sleep 1; kill -0 "$(cat "$DEMO/operator.pid")" || fail "the operator did not start"

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
# /metrics is HTTPS and needs a token allowed `get /metrics` (--metrics-secure, as in PKO): a scraper's
# service account bound to the pko-metrics-reader role of deploy/manifests/operator.yaml
kubectl create clusterrole pko-metrics-reader --verb=get --non-resource-url=/metrics --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null
kubectl -n $NS create serviceaccount metrics-scraper >/dev/null
kubectl create clusterrolebinding "pko-metrics-$NS" --clusterrole=pko-metrics-reader --serviceaccount=$NS:metrics-scraper --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null
SCRAPE_TOKEN="$(kubectl -n $NS create token metrics-scraper)"
metrics() { curl -sk -H "Authorization: Bearer $SCRAPE_TOKEN" https://127.0.0.1:18383/metrics; }
echo; echo "metrics (https://127.0.0.1:18383/metrics, as $NS:metrics-scraper):"
metrics | grep -E '^(stacks_active|stacks_failing|programs_active|pko_update_operations_total)' | sed 's/^/  /'
metrics | grep -q '^stacks_active 3$' || fail "the metrics endpoint does not report 3 active stacks"
[ "$(curl -sk -o /dev/null -w '%{http_code}' https://127.0.0.1:18383/metrics)" = 401 ] || fail "the metrics endpoint answers without a token"

step "a new commit on the tracked branch"
sed -i 's/release 1/release 2/' "$DEMO/work/app/Pulumi.yaml"
git -C "$DEMO/work" -c user.email=demo@pko -c user.name=demo commit -q -am "release 2"
git -C "$DEMO/work" push -q "$DEMO/git/demo.git" main
NEW_SHA=$(git -C "$DEMO/work" rev-parse HEAD)
T1=$(date +%s.%N)
for _ in $(seq 1 300); do
  [ "$(kubectl -n $NS get stack from-git -o jsonpath='{.status.currentUpdate.commit}{.status.lastUpdate.lastAttemptedCommit}')" != "" ] \
    && kubectl -n $NS get stack from-git -o jsonpath='{.status.currentUpdate.commit} {.status.lastUpdate.lastAttemptedCommit}' | grep -q "$NEW_SHA" && break
  sleep 0.5
done
PUSH_S=$(awk "BEGIN{print $(date +%s.%N) - $T1}")
kubectl -n $NS get stack from-git -o jsonpath='{.status.currentUpdate.commit} {.status.lastUpdate.lastAttemptedCommit}' | grep -q "$NEW_SHA" || fail "no update for commit $NEW_SHA"
for _ in $(seq 1 120); do
  kubectl -n $NS get stack from-git -o jsonpath='{.status.lastUpdate.lastSuccessfulCommit}' | grep -q "$NEW_SHA" && break; sleep 0.5
done
kubectl -n $NS get updates -l pulumi.com/stack-name=from-git
echo "  from-git outputs: $(kubectl -n $NS get stack from-git -o jsonpath='{.status.outputs}')"

step "deleting stack hello (destroyOnFinalize)"
rm -f "$DEMO/destroyed-dev.txt"
kubectl -n $NS delete stack hello --timeout=120s >/dev/null
[ -f "$DEMO/destroyed-dev.txt" ] || fail "the program's delete did not run"
echo "  $(cat "$DEMO/destroyed-dev.txt") (written by the command provider's delete)"

echo
printf 'DEMO OK: 3 stacks Ready %.1f s after apply, branch push -> new update in %.1f s, destroyOnFinalize destroyed the resources. `make demo-down` cleans up.\n' "$READY_S" "$PUSH_S"
