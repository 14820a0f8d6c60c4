#!/usr/bin/env bash
# The same load at several fleet sizes, one after the other in one run: `stacks.sh N` with REPLICAS=k
# for each k (one replica runs as a fleet too, FLEET_ONE=1, so every size pays Leases and Redis), then
# a table side by side: time to all Ready, operator CPU in all (apply → all Ready, once the fleet has
# settled; the settling's own CPU per replica in the last column) and its ratio to the first size's, peak RSS and peak anonymous memory (RSS without the executable's shared file pages) per
# replica and the largest one's ratio to the first size's, dispatch latency
# p50/p99, Lease writes at rest. Every other variable of stacks.sh passes through (HOLLOW, POOL_MAX,
# MAX_OPS, IDLE_TIMEOUT_S, …); reports go to REPORT_ROOT/<k>-replicas.
#
#   HOLLOW=1 POOL_MAX=16 MAX_OPS=32 IDLE_TIMEOUT_S=10 loadtest/replicas.sh 1000 "1 2 4"
set -euo pipefail
N=${1:-1000}
SIZES=${2:-"1 2 4"}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# not under /tmp/pko-load: each size's run starts by clearing that directory
REPORT_ROOT=${REPORT_ROOT:-/tmp/pko-load-reports/replicas}
OUT=/tmp/pko-load-replicas
mkdir -p "$OUT" "$REPORT_ROOT"
for k in $SIZES; do
  echo "== $N Stacks on $k replica(s) ($(date -u +%H:%M:%S) UTC)"
  log="$OUT/$k.log"
  FLEET_ONE=1 REPLICAS=$k REPORT_DIR="$REPORT_ROOT/$k-replicas" IDLE_WAIT_S=${IDLE_WAIT_S:-20} "$ROOT/loadtest/stacks.sh" "$N" 2>&1 | tee "$log" | grep --line-buffered -E '^  t=|^stacks=|^operator_|^per replica|^dispatch|^coordination|^agents_left|^fleet settled|LOADTEST FAILED' || true
  grep -q '^stacks=' "$log" || { echo "the run with $k replica(s) failed (see $log)"; exit 1; }
done

echo
echo "== side by side: $N Stacks${HOLLOW:+ — HOLLOW AGENTS (operations simulated for $HOLLOW s, no Pulumi ran)}"
printf '%-9s %-12s %-10s %-9s %-22s %-10s %-22s %-11s %-18s %-24s %s\n' replicas all_ready_s cpu_s cpu_ratio "peak_rss_mib/replica" rss_ratio "peak_anon_mib/replica" anon_ratio dispatch_p50/p99 lease_writes/s/replica "formation_cpu_s/replica"
base_cpu=""; base_rss=""; base_anon=""
for k in $SIZES; do
  log="$OUT/$k.log"
  ready=$(sed -n 's/.*all_ready_s=\([0-9]*\).*/\1/p' "$log")
  cpu=$(sed -n 's/^operator_cpu_s (apply → all Ready): total=\([0-9.]*\).*/\1/p' "$log")
  peaks=$(sed -n 's/^per replica ([^)]*)://p' "$log" | grep -o ' peak=[0-9]*' | cut -d= -f2 | tr '\n' ' ')
  anons=$(sed -n 's/^per replica ([^)]*)://p' "$log" | grep -o 'anon=[0-9]*' | cut -d= -f2 | tr '\n' ' ')
  max_peak=$(echo "$peaks" | tr ' ' '\n' | sort -n | tail -1)
  max_anon=$(echo "$anons" | tr ' ' '\n' | sort -n | tail -1)
  disp=$(sed -n 's/^dispatch_latency_p50_s=\([0-9.]*\) dispatch_latency_p99_s=\([0-9.]*\).*/\1\/\2/p' "$log")
  writes=$(sed -n 's/^coordination_writes_at_rest: \([0-9.]*\).*/\1/p' "$log")
  formation=$(sed -n 's/^fleet_formation_cpu_s (start → settled, before the apply): //p' "$log")
  [ -z "$base_cpu" ] && base_cpu=$cpu && base_rss=$max_peak && base_anon=$max_anon
  printf '%-9s %-12s %-10s %-9s %-22s %-10s %-22s %-11s %-18s %-24s %s\n' "$k" "$ready" "$cpu" "$(echo "scale=2; $cpu / $base_cpu" | bc)" "$peaks" \
    "$(echo "scale=2; $max_peak / $base_rss" | bc)" "$anons" "$(echo "scale=2; $max_anon / $base_anon" | bc)" "$disp" "$writes" "${formation// /,}"
done
