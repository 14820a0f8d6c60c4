#!/usr/bin/env bash
# `make testbed`: packages, builds (skipping what is built), then starts the bed, printing the environment.
# build.sh and up.sh each hold a lock, so parallel test processes bring the bed up once; a second call
# while it runs only reprints the environment.
#
#   TESTBED_PROFILE=demo   only what `make demo` (local runtime) uses: the control plane, the Pulumi CLI, the YAML
#                          language host, the command provider, Redis; no node, helm, Flux, other language hosts
#                          or the Kubernetes provider (`make test` and `make demo RUNTIME=pod` build those)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ "${TESTBED_PROFILE:-}" = demo ]; then
  export TESTBED_ONLY="${TESTBED_ONLY:-k8s pulumi pulumi-yaml pulumi-command}" TESTBED_NODE="${TESTBED_NODE:-0}"
  export TESTBED_PACKAGES=minimal
fi
. "$HERE/versions.sh"
. "$HERE/lib.sh"
T0=$SECONDS
t=$SECONDS; "$HERE/packages.sh"; tb_log "packages: $((SECONDS - t)) s"
"$HERE/build.sh"
"$HERE/up.sh"
"$HERE/node-up.sh"
cat "$TB_RUN/node/env.sh" 2>/dev/null || true
tb_log "make testbed: $((SECONDS - T0)) s in all"
