#!/usr/bin/env bash
# Generates the install manifest deploy/manifests/operator.yaml from the Helm chart deploy/helm/pko
# (`helm template`, release `pko` in namespace `pko-system`), so the two cannot disagree; a test
# (crates/pko-operator/tests/helm_chart.rs) fails when the file drifts from the chart.
#
#   scripts/manifests.sh            rewrite deploy/manifests/operator.yaml
#   scripts/manifests.sh --print    print what it would write
#
# Needs the bed's helm (`make testbed` builds it): run under `. <(scripts/testbed/ensure.sh | grep ^export)`
# or with HELM=/path/to/helm.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HELM="${HELM:-${PKO_TESTBED_BIN:+$PKO_TESTBED_BIN/}helm}"
render() {
  cat <<'HEADER'
# The operator, cluster-wide, with the pod runtime (apply the CRDs in deploy/crds first):
#   kubectl apply --server-side -f deploy/crds/ -f deploy/manifests/operator.yaml
# Generated from the Helm chart deploy/helm/pko by scripts/manifests.sh (release `pko`, namespace
# `pko-system`, default values): edit the chart, not this file. `helm install` the chart for other values.
# Images: pko-operator (the `pko-operator` binary) and pko-agent (holding `/pko-agent`, copied into each
# workspace pod by an init container). Ports: 9090 program artifacts, 8383 metrics, 8081 probes.
# Workspace service accounts need `system:auth-delegator` (agents check callers with TokenReview and
# SubjectAccessReview), as in PKO v2.
HEADER
  # (the chart's crds/ are symlinks to deploy/crds: helm says so on every run)
  "$HELM" template pko "$ROOT/deploy/helm/pko" --namespace pko-system --set namespace.create=true 2> >(grep -v "found symbolic link" >&2)
}
command -v "$HELM" >/dev/null || { echo "scripts/manifests.sh: no helm ($HELM): run under the bed's environment or set HELM" >&2; exit 1; }
if [ "${1:-}" = "--print" ]; then render; else
  # into a temporary file first: a failed render never leaves a half-written manifest
  OUT="$(mktemp)"; render > "$OUT"; chmod 644 "$OUT"; mv "$OUT" "$ROOT/deploy/manifests/operator.yaml"; echo "wrote deploy/manifests/operator.yaml"
fi
