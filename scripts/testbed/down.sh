#!/usr/bin/env bash
# Stops exactly the processes up.sh started (recorded PIDs) and removes its run directory.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/versions.sh"
. "$HERE/lib.sh"
"$HERE/node-down.sh"
if [ ! -d "$TB_RUN" ]; then tb_log "not running"; exit 0; fi
if [ -f "$TB_RUN/pids" ]; then
  # reverse start order: scheduler, KCM, apiserver, redis, etcd
  tac "$TB_RUN/pids" | while read -r name pid; do
    # Only a process that still runs the program we started (a recycled PID is left alone).
    bin="$name"; [ "$name" = redis ] && bin=redis-server
    # captured, not piped into `grep -q` (under pipefail its early exit can fail the check)
    if kill -0 "$pid" 2>/dev/null && [[ "$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)" == *"$bin"* ]]; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      tb_log "stopped $name ($pid)"
    fi
  done
fi
[ -f "$TB_RUN/etcd-data-dir" ] && rm -rf "$(cat "$TB_RUN/etcd-data-dir")"
rm -rf "$TB_RUN"
tb_log "removed $TB_RUN"
