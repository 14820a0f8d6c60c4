#!/usr/bin/env bash
# `make demo-down`: stops what `make demo` started (operator, its agents, git daemon; with RUNTIME=pod the Helm
# release) and deletes its namespaces.
set -uo pipefail
DEMO=/tmp/pko-demo
for f in "$DEMO"/operator*.pid "$DEMO/git-daemon.pid"; do
  if [ -f "$f" ]; then
    pid=$(cat "$f")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null; rm -f "$f"
  fi
done
# local agents run in their own process groups (they outlive an operator crash, like pods): stop them too
pkill -TERM -f -- "--work-dir $DEMO/agents" 2>/dev/null
if command -v kubectl >/dev/null && [ -n "${KUBECONFIG:-}" ]; then
  # `make demo RUNTIME=pod`: the Helm release (its operator runs the Stacks' finalizers first)
  if command -v helm >/dev/null && helm status pko -n pko-system >/dev/null 2>&1; then
    kubectl -n pko-demo delete stacks --all --timeout=60s >/dev/null 2>&1
    helm uninstall pko -n pko-system --wait >/dev/null 2>&1
    kubectl delete ns pko-system --wait=false >/dev/null 2>&1
  fi
  kubectl delete clusterrolebinding pko-demo-workspaces --ignore-not-found >/dev/null 2>&1
  # the local demo's logs APIService (a Helm release owns its own): left unavailable, it would stall namespace deletion
  [ "$(kubectl get apiservice v1alpha1.logs.pulumi.com -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}' 2>/dev/null)" = Helm ] \
    || kubectl delete apiservice v1alpha1.logs.pulumi.com --ignore-not-found >/dev/null 2>&1
  kubectl delete clusterrole pko-demo-logs-view --ignore-not-found >/dev/null 2>&1
  # the local demo's copy of the manifest's pko-metrics-reader role (a Helm release `pko` owns its own)
  [ "$(kubectl get clusterrole pko-metrics-reader -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}' 2>/dev/null)" = Helm ] \
    || kubectl delete clusterrole pko-metrics-reader --ignore-not-found >/dev/null 2>&1
  kubectl get ns pko-demo >/dev/null 2>&1 && {
    # finalizers need the operator; it is gone, so release them
    for s in $(kubectl -n pko-demo get stacks,updates -o name 2>/dev/null); do kubectl -n pko-demo patch "$s" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1; done
    kubectl delete ns pko-demo --wait=false >/dev/null 2>&1
    kubectl delete clusterrolebinding pko-metrics-pko-demo --ignore-not-found >/dev/null 2>&1
  }
fi
rm -rf "$DEMO"
echo "demo stopped"
