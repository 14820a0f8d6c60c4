#!/usr/bin/env bash
# Failover rounds: a fleet of REPLICAS operator processes (default 3) over the bed's redis-server and
# the local agent pools drives N Stacks (default 30). Each round changes every Stack (config gen=<round>),
# SIGKILLs one replica while the updates run, measures how long until its shard Leases are held by the
# survivors (failover: every shard; work resumed: every shard with a job in Redis at the kill — what a
# takeover takes first), restarts it, and waits until every Stack is Ready at the new generation.
# At the end, from the program's own trace (one line `<stack> <gen>` per `up` that created the resource
# of generation gen): operations lost (a (stack, round) with no line) and duplicated (more than one), plus
# Updates Failed or left Progressing and backend locks left.
#
#   loadtest/failover.sh [N]        N Stacks (default 30)
#   ROUNDS=20                       kill rounds (default 20)
#   KILL_AFTER_S=3                  seconds after the change before the kill (default 3)
#   SLEEP_S=8                       seconds each `up` sleeps, so updates are in flight at the kill
#   LEASE_S=15                      --lease-duration-seconds (default: the operator's default, 15)
#   TIMEOUT_S=3600                  give up after this many seconds
#
# Everything listens on 127.0.0.1; the run cleans up (namespace, operators, agents).
set -euo pipefail
N=${1:-30}
ROUNDS=${ROUNDS:-20}
REPLICAS=${REPLICAS:-3}
KILL_AFTER_S=${KILL_AFTER_S:-3}
SLEEP_S=${SLEEP_S:-8}
LEASE_S=${LEASE_S:-15}
TIMEOUT_S=${TIMEOUT_S:-3600}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN=/tmp/pko-failover
NS=pko-failover
fail() { KEEP_NS=1; echo "FAILOVER TEST FAILED: $* (namespace $NS kept for inspection; the operators are stopped)" >&2; for l in "$RUN"/operator*.log; do [ -f "$l" ] && { echo "== $l" >&2; tail -15 "$l" >&2; }; done; exit 1; }

. "$ROOT/loadtest/lib.sh"
stop_all() {
  for f in "$RUN"/operator*.pid; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true; done
  sleep 2
  pkill -TERM -f -- "$RUN/agents" 2>/dev/null || true
}
cleanup() { stop_all; [ -n "${KEEP_NS:-}" ] || delete_namespace --wait=false; }
trap cleanup EXIT
stop_all
delete_namespace --wait=true --timeout=120s
rm -rf "$RUN" && mkdir -p "$RUN/state"
redis-cli -u "$REDIS_URL" --scan --pattern 'pko-failover:*' | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null

kubectl apply --server-side -f "$ROOT/deploy/crds/" >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl create namespace $NS >/dev/null
KCFG_SERVER="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"

# replica i as its own session (its agents have their own process groups and outlive it, like pods)
start_replica() {
  local i=$1
  PULUMI_CONFIG_PASSPHRASE=load setsid "$BIN/pko-operator" run --runtime local --agent-bin "$BIN/pko-agent" \
    --program-fs-addr 127.0.0.1:$((19191 + i)) --metrics-bind-address 127.0.0.1:$((18484 + i)) --metrics-secure=false --health-probe-bind-address 0 --namespaces $NS \
    --local-work-dir "$RUN/agents" --local-api-server "$KCFG_SERVER" --local-ca-file "$PKO_TESTBED_RUN/certs/ca.crt" \
    --fleet --fleet-namespace $NS --redis-url "$REDIS_URL" --redis-prefix pko-failover --replica-id "r$i" \
    --lease-duration-seconds "$LEASE_S" --pool-idle-timeout-seconds 60 \
    >> "$RUN/operator-$i.log" 2>&1 < /dev/null &
  echo $! > "$RUN/operator-$i.pid"
}
for i in $(seq 0 $((REPLICAS - 1))); do start_replica "$i"; done
sleep 1
for i in $(seq 0 $((REPLICAS - 1))); do kill -0 "$(cat "$RUN/operator-$i.pid")" || fail "replica $i did not start"; done

TRACE="$RUN/trace.txt"
: > "$TRACE"
traced_manifests "sleep $SLEEP_S; echo \${pulumi.stack} \${gen} >> $TRACE" > "$RUN/manifests.yaml"

T_START=$(date +%s)
kubectl -n $NS apply -f "$RUN/manifests.yaml" >/dev/null
echo "applied $N Stacks on $REPLICAS replicas; waiting for the first convergence"
wait_converged 0 >/dev/null
echo "round 0: all $N Ready in $(( $(date +%s) - T_START )) s"

# with_jobs SHARD...: those with a job recorded in Redis (queued or running)
with_jobs() { [ $# -gt 0 ] || return 0; for k in "$@"; do echo "SCARD pko-failover:shard:$k"; done | redis-cli -u "$REDIS_URL" | paste -d' ' <(printf '%s\n' "$@") - | awk '$2 > 0 {print $1}' | sort; }

FAILOVERS=()
RESUMED=()
for round in $(seq 1 "$ROUNDS"); do
  t_change=$(date +%s)
  patches=()
  for i in $(seq -f '%03g' 1 "$N"); do kubectl -n $NS patch stack "s$i" --type=merge -p "{\"spec\":{\"config\":{\"gen\":\"$round\"}}}" >/dev/null & patches+=($!); done
  wait "${patches[@]}"   # only the patches: the replicas are this script's background jobs too
  sleep "$KILL_AFTER_S"
  victim=$(( (round - 1) % REPLICAS ))
  held=$(shards_held_by "r$victim")
  running=$(kubectl -n $NS get updates -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Progressing")].status}{"\n"}{end}' | grep -c '^True$' || true)
  victims=$(shards_of "r$victim")
  # shellcheck disable=SC2046
  busy=$(with_jobs $victims)
  # every Lease change from here on, stamped as it arrives (the numbers come from this, not from the
  # polling below, which lags by seconds on a loaded machine)
  watch_leases "$RUN/leases-$round.log"
  kill -KILL "$(cat "$RUN/operator-$victim.pid")"
  t_kill=$(date +%s.%N); kill_at=$(date -u +%T.%N | cut -c1-12)
  while [ "$(shards_held_by "r$victim")" -gt 0 ]; do
    [ "$(echo "$(date +%s.%N) - $t_kill > 120" | bc)" = 1 ] && fail "round $round: r$victim's shards not taken within 120 s"
    sleep 0.5
  done
  # taken_after SHARD...: seconds from the kill until the last of these shards was seen held by a survivor
  taken_after() { moved_after "$t_kill" "$RUN/leases-$round.log" "r$victim" "$@"; }
  # the watch may trail the polling: wait (at most 30 s) until it has seen every shard taken
  for _ in $(seq 1 60); do [ "$(taken_after $victims)" != "?" ] && break; sleep 0.5; done
  pkill -P "$WATCHER" 2>/dev/null || true
  # shellcheck disable=SC2046,SC2086
  fo=$(taken_after $victims)
  # shellcheck disable=SC2086
  if [ -n "$busy" ]; then resumed=$(taken_after $busy); else resumed="-"; fi   # no job at the kill: nothing to resume
  FAILOVERS+=("$fo")
  RESUMED+=("$resumed")
  start_replica "$victim"
  wait_converged "$round" >/dev/null
  took=$(( $(date +%s) - t_change ))
  printf 'round %d: %s SIGKILL r%d (held %d shards, %d with jobs, %d updates Progressing) -> work resumed in %s s, every shard taken in %s s; all %d Ready at n=%d %d s after the change\n' \
    "$round" "$kill_at" "$victim" "$held" "$(echo "$busy" | grep -c . || true)" "$running" "$resumed" "$fo" "$N" "$round" "$took"
done

sleep 5
# operations lost / duplicated, from the trace
LOST=0; DUP=0
for i in $(seq -f '%03g' 1 "$N"); do
  for n in $(seq 0 "$ROUNDS"); do
    c=$(grep -c "^s$i $n\$" "$TRACE" || true)
    [ "$c" -eq 0 ] && LOST=$((LOST + 1))
    [ "$c" -gt 1 ] && DUP=$((DUP + c - 1))
  done
done
FAILED=$(kubectl -n $NS get updates -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Failed")].status}/{.status.conditions[?(@.type=="Failed")].reason}{"\n"}{end}' | { grep '^True/' || true; } | sort | uniq -c | tr '\n' ' ')
PROGRESSING=$(kubectl -n $NS get updates -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Progressing")].status}{"\n"}{end}' | grep -c '^True$' || true)
LOCKS=$(find "$RUN/state/.pulumi/locks" -name '*.json' 2>/dev/null | wc -l)
printf '%s\n' "${FAILOVERS[@]}" | grep -v '?' | sort -n > "$RUN/failovers.txt" || true
printf '%s\n' "${RESUMED[@]}" | grep -v '^-$' | grep -v '?' | sort -n > "$RUN/resumed.txt" || true
echo "stacks=$N replicas=$REPLICAS rounds=$ROUNDS lease_duration_s=$LEASE_S kill_after_s=$KILL_AFTER_S"
echo "work_resumed_s (rounds with jobs at the kill: $(wc -l < "$RUN/resumed.txt")): min=$(head -1 "$RUN/resumed.txt") median=$(sed -n "$(( ($(wc -l < "$RUN/resumed.txt") + 1) / 2 ))p" "$RUN/resumed.txt") max=$(tail -1 "$RUN/resumed.txt")"
echo "failover_s (rounds measured: $(wc -l < "$RUN/failovers.txt")): min=$(head -1 "$RUN/failovers.txt") median=$(sed -n "$(( ($(wc -l < "$RUN/failovers.txt") + 1) / 2 ))p" "$RUN/failovers.txt") max=$(tail -1 "$RUN/failovers.txt")"
echo "operations: expected=$((N * (ROUNDS + 1))) lost=$LOST duplicated=$DUP; updates_failed=[${FAILED:-none}] updates_left_progressing=$PROGRESSING locks_left=$LOCKS"
echo "total $(( $(date +%s) - T_START )) s"
[ "$LOST" -eq 0 ] && [ "$DUP" -eq 0 ] && [ "$PROGRESSING" -eq 0 ] && [ "$LOCKS" -eq 0 ] || fail "operations lost or duplicated, or leftovers"
