#!/usr/bin/env bash
# `make testbed`: packages, builds (skipping what is built), then starts the bed, printing the environment.
# Serialised by a lock so parallel test processes bring the bed up once; a second call while it runs only
# reprints the environment.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/versions.sh"
. "$HERE/lib.sh"
mkdir -p "$TB_CACHE_ROOT"
exec 9> "$TB_CACHE_ROOT/.lock"
flock 9
T0=$SECONDS
t=$SECONDS; "$HERE/packages.sh"; tb_log "packages: $((SECONDS - t)) s"
"$HERE/build.sh"
"$HERE/up.sh"
tb_log "make testbed: $((SECONDS - T0)) s in all"
