#!/usr/bin/env bash
# `make demo RUNTIME=pod`: the same demo as `make demo`, the way users run it: on the test bed's real
# node, the operator installed with `helm install` from deploy/helm/pko and running in a pod, each
# Stack's workspace in a pod of the workspace image.
#  1. test bed and node up; binaries built; images built without a container engine and imported
#  2. `helm install` (CRDs and operator); git repository served on the node's address
#  3. deploy/examples with a workspaceTemplate for the node (workspace image, Pulumi state on a hostPath)
#     until every Stack is Ready (cold workspace pods), then a config change (warm pod)
#  4. the pods' memory at rest (the kubelet's summary API)
#  5. a workspace pod deleted during a slow `up`: SIGTERM → CTRL-C → the Update handed to the new pod
#  6. a new commit on the tracked branch → the new Update; deleting a Stack with destroyOnFinalize
# Ends with one success line with the measured numbers, or fails loudly. `make demo-down` cleans up.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEMO=/tmp/pko-demo
NS=pko-demo
OPNS=pko-system
GIT_PORT=18418
fail() {
  echo "DEMO FAILED: $*" >&2
  kubectl -n $NS get stacks,workspaces,updates,pods -o wide >&2 2>/dev/null || true
  kubectl -n $OPNS logs deploy/pko-operator --tail=30 >&2 2>/dev/null || true
  exit 1
}
step() { printf '\n== %s\n' "$*"; }
now() { date +%s.%N; }
since() { awk "BEGIN{printf \"%.1f\", $(now) - $1}"; }
trap 'fail "a command failed (line $LINENO)"' ERR
. "$ROOT/scripts/demo-git.sh"

step "test bed and its node"
eval "$("$ROOT/scripts/testbed/ensure.sh" | grep '^export')"
[ -n "${PKO_TESTBED_NODE:-}" ] || fail "the test bed has no node (run as root; see scripts/testbed/node-up.sh)"
"$ROOT/scripts/demo-down.sh" >/dev/null 2>&1 || true
kubectl wait --for=delete namespace/$NS namespace/$OPNS --timeout=120s >/dev/null 2>&1 || true
mkdir -p "$DEMO/state" && chmod 0777 "$DEMO" "$DEMO/state"   # mounted into the workspace pods (user 1000)

step "building pko-operator and pko-agent, then the images (deploy/images, without a container engine)"
(cd "$ROOT" && cargo build -q -p pko-operator -p pko-agent)
PKO_IMAGES_BIN_DIR="$ROOT/target/debug" "$ROOT/scripts/images/build.sh"
VERSION="$(awk -F'"' '/^version = /{print $2; exit}' "$ROOT/Cargo.toml")"

step "git repository on git://$PKO_TESTBED_NODE_IP:$GIT_PORT/demo.git (the node's address: pods reach it)"
demo_git_serve "$PKO_TESTBED_NODE_IP"

step "helm install pko deploy/helm/pko --namespace $OPNS (CRDs and the operator, in a pod)"
T=$(now)
helm install pko "$ROOT/deploy/helm/pko" --namespace $OPNS --create-namespace --set "namespace.watch={$NS}" \
  --wait --timeout 180s 2> >(grep -v "found symbolic link" >&2) | sed -n '1,6s/^/  /p'
HELM_S=$(since "$T")
kubectl -n $OPNS get deploy,pods -o wide | sed 's/^/  /'
echo "  helm install → operator available: $HELM_S s"

step "sample manifests (deploy/examples), each Stack with a workspace pod on the node"
kubectl create namespace $NS >/dev/null
# as in PKO v2: the workspaces' service account may check the operator's token
kubectl create clusterrolebinding pko-demo-workspaces --clusterrole=system:auth-delegator --serviceaccount=$NS:default >/dev/null
# the examples unchanged but for where they run: the workspace image, the bed's offline Pulumi switches,
# the demo directory (Pulumi's file:// state, the program's delete marker) on a hostPath, and the git
# server's address as pods see it
WS_TEMPLATE=$(jq -nc --arg img "pko-workspace:$VERSION" '{spec: {image: $img, imagePullPolicy: "IfNotPresent",
  env: [{name: "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", value: "true"}, {name: "PULUMI_DISABLE_REGISTRY_RESOLVE", value: "true"}],
  podTemplate: {spec: {volumes: [{name: "demo", hostPath: {path: "/tmp/pko-demo", type: "Directory"}}],
                       containers: [{name: "pulumi", volumeMounts: [{name: "demo", mountPath: "/tmp/pko-demo"}]}]}}}}')
T0=$(now)
kubectl -n $NS create --dry-run=client -o json -f "$ROOT/deploy/examples/" \
  | jq --argjson ws "$WS_TEMPLATE" --arg git "git://$PKO_TESTBED_NODE_IP:$GIT_PORT/" \
      'if .kind == "Stack" then .spec.workspaceTemplate = $ws | (if .spec.projectRepo then .spec.projectRepo |= sub("git://127.0.0.1:[0-9]+/"; $git) else . end) else . end' \
  | kubectl -n $NS apply -f - | sed 's/^/  /'
for s in hello configured from-git; do
  kubectl -n $NS wait --for=condition=Ready "stack/$s" --timeout=300s >/dev/null || fail "stack $s is not Ready: $(kubectl -n $NS get stack $s -o jsonpath='{.status.conditions}')"
done
COLD_S=$(since "$T0")
kubectl -n $NS get stacks,workspaces,updates
kubectl -n $NS get pods -o wide
echo; echo "outputs:"
for s in hello configured from-git; do echo "  $s: $(kubectl -n $NS get stack $s -o jsonpath='{.status.outputs}')"; done
kubectl -n $NS get stack configured -o jsonpath='{.status.outputs}' | grep -q 'not-a-real-key' && fail "a secret reached the Stack status"
echo "  apply → 3 Stacks Ready, cold workspace pods: $COLD_S s"

step "a config change on a warm workspace pod"
T=$(now)
kubectl -n $NS patch stack configured --type merge -p '{"spec":{"config":{"greeting":"salut"}}}' >/dev/null
for _ in $(seq 1 600); do
  kubectl -n $NS get stack configured -o jsonpath='{.status.outputs.message}' | grep -q salut \
    && [ "$(kubectl -n $NS get stack configured -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ] && break
  sleep 0.2
done
kubectl -n $NS get stack configured -o jsonpath='{.status.outputs.message}' | grep -q salut || fail "the config change did not reach the outputs"
WARM_S=$(since "$T")
echo "  configured: $(kubectl -n $NS get stack configured -o jsonpath='{.status.outputs.message}') — change → Ready on the warm pod: $WARM_S s"

step "memory at rest (the kubelet's summary API: working set per pod)"
sleep 5
SUMMARY="$(kubectl get --raw "/api/v1/nodes/$PKO_TESTBED_NODE/proxy/stats/summary?only_cpu_and_memory=true")"   # (its filesystem stats fail on this VM: testbed.md §10.4)
echo "$SUMMARY" | jq -r --arg ns $NS --arg op $OPNS '.pods[] | select(.podRef.namespace == $ns or .podRef.namespace == $op)
  | "  \(.podRef.namespace)/\(.podRef.name): \((.memory.workingSetBytes // 0) / 1048576 | floor) MiB"'
WS_MIB=$(echo "$SUMMARY" | jq --arg ns $NS '[.pods[] | select(.podRef.namespace == $ns) | .memory.workingSetBytes // 0] | if length > 0 then (add / length / 1048576 | floor) else 0 end')

step "a workspace pod deleted during a slow up: SIGTERM → CTRL-C → the Update handed to the new pod"
kubectl -n $NS patch program hello --type json -p '[{"op":"replace","path":"/program/resources/greet/properties/create","value":"sleep 20; echo \"${greeting} from a Program, slowly\""}]' >/dev/null
for _ in $(seq 1 300); do
  kubectl -n $NS exec hello-workspace-0 -c pulumi -- sh -c 'cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\0" " "' 2>/dev/null | grep -q "sleep 20" && break
  sleep 0.3
done
RUNNING=$(kubectl -n $NS get updates -l pulumi.com/stack-name=hello --sort-by=.metadata.creationTimestamp -o name | tail -1)
T=$(now)
kubectl -n $NS delete pod hello-workspace-0 --wait=true --timeout=90s >/dev/null
HANDOFF_S=$(since "$T")
echo "  hello-workspace-0 deleted mid-up: gone after $HANDOFF_S s (grace period 600 s: the agent stopped Pulumi at once)"
kubectl -n $NS wait --for=condition=Ready stack/hello --timeout=180s >/dev/null || fail "hello did not converge after the interruption"
for _ in $(seq 1 300); do kubectl -n $NS get stack hello -o jsonpath='{.status.outputs.message}' | grep -q slowly && break; sleep 0.3; done
kubectl -n $NS get stack hello -o jsonpath='{.status.outputs.message}' | grep -q slowly || fail "hello's slow update did not complete"
kubectl -n $OPNS logs deploy/pko-operator | grep "operation interrupted by agent shutdown" | tail -1 | sed 's/^/  operator: /' | cut -c1-220
echo "  $RUNNING: $(kubectl -n $NS get "$RUNNING" -o jsonpath='{.status.conditions[?(@.type=="Complete")].reason}') on the new pod; hello: $(kubectl -n $NS get stack hello -o jsonpath='{.status.outputs.message}')"
[ -z "$(find "$DEMO/state/.pulumi/locks" -type f 2>/dev/null)" ] || fail "a Pulumi lock was left behind"
echo "  no Pulumi lock left in $DEMO/state"

step "a new commit on the tracked branch"
NEW_SHA=$(demo_git_push_release_2)
T=$(now)
for _ in $(seq 1 300); do
  kubectl -n $NS get stack from-git -o jsonpath='{.status.lastUpdate.lastSuccessfulCommit}' | grep -q "$NEW_SHA" && break; sleep 0.5
done
kubectl -n $NS get stack from-git -o jsonpath='{.status.lastUpdate.lastSuccessfulCommit}' | grep -q "$NEW_SHA" || fail "no successful update for commit $NEW_SHA"
PUSH_S=$(since "$T")
echo "  from-git outputs: $(kubectl -n $NS get stack from-git -o jsonpath='{.status.outputs}') ($PUSH_S s after the push; 60 s resync)"

step "deleting stack hello (destroyOnFinalize)"
rm -f "$DEMO/destroyed-dev.txt"
kubectl -n $NS delete stack hello --timeout=120s >/dev/null
[ -f "$DEMO/destroyed-dev.txt" ] || fail "the program's delete did not run"
echo "  $(cat "$DEMO/destroyed-dev.txt") (written in the workspace pod, on the hostPath)"

echo
echo "DEMO OK (pod runtime on node $PKO_TESTBED_NODE): helm install → operator available ${HELM_S} s; 3 Stacks Ready ${COLD_S} s after apply (cold workspace pods); warm change → Ready ${WARM_S} s; workspace pod at rest ${WS_MIB} MiB; pod deleted mid-up → gone ${HANDOFF_S} s, its Update completed on the new pod; push → new Update ${PUSH_S} s. \`make demo-down\` cleans up."
