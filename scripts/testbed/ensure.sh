#!/usr/bin/env bash
# `make testbed`: packages, builds (skipping what is built), then starts the bed, printing the environment.
# build.sh and up.sh each hold a lock, so parallel test processes bring the bed up once; a second call
# while it runs only reprints the environment.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/versions.sh"
. "$HERE/lib.sh"
T0=$SECONDS
t=$SECONDS; "$HERE/packages.sh"; tb_log "packages: $((SECONDS - t)) s"
"$HERE/build.sh"
"$HERE/up.sh"
"$HERE/node-up.sh"
cat "$TB_RUN/node/env.sh" 2>/dev/null || true
tb_log "make testbed: $((SECONDS - T0)) s in all"
