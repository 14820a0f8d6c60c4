#!/usr/bin/env bash
# Chaos rounds: a fleet of REPLICAS operator processes (default 3) over the bed's redis-server and the local
# agent pools drives N Stacks (default 24). Each round changes every Stack (config gen=<round>) and, while
# the updates run, applies one fault, rotating through:
#   replica-kill   SIGKILL of one replica (restarted once its shards have moved)
#   replica-term   SIGTERM of one replica (a graceful handoff; restarted once it has exited)
#   replica-stop   SIGSTOP of one replica past its lease, SIGCONT once its shards have moved
#   redis-flush    FLUSHALL of the work queue's Redis
#   agent-kill     SIGKILL of one busy pool agent, alone (not its process group)
#   agent-term     SIGTERM of one busy pool agent (its operation is handed to another agent)
# then waits until every Stack is Ready at the new generation.
#
# Each round also reports its Updates that completed `Updated` with every resource unchanged (Pulumi's
# change summary only `same`) although the round changed every Stack's config: an Update that reported
# success with the previous config (issue 47), which must be 0; and those that failed `RunMismatch`
# (refused before anything ran, because what would have run was not what the Update names).
#
# Verified from the program's own trace, not from status: each `up` takes a per-Stack flock for its run
# (released by the kernel when its process dies), writes `<stack> <gen> overlap` when another run of the
# same Stack still holds it, and `<stack> <gen>` when it completes. Reported: operations lost (a (stack,
# gen) never completed) and duplicated (completed more than once), runs that overlapped; Updates Failed
# or left Progressing; backend locks left; processes of the operation left once everything stopped; and
# per fault type the failover (every shard of the victim held by a survivor; for a SIGTERM, the handoff)
# and the time from the change to all Ready.
#
#   loadtest/chaos.sh [N]        N Stacks (default 24)
#   ROUNDS=30                    rounds (default 30; a multiple of 6 rotates evenly)
#   FAULT_AFTER_S=3              seconds after the change before the fault
#   SLEEP_S=8                    seconds each `up` sleeps, so updates are in flight at the fault
#   LEASE_S=8                    --lease-duration-seconds (renewals every 2 s, deadline 6 s)
#   TIMEOUT_S=7200               give up after this many seconds
#
# Everything listens on 127.0.0.1; the run cleans up (namespace, operators, agents).
set -euo pipefail
N=${1:-24}
ROUNDS=${ROUNDS:-30}
REPLICAS=${REPLICAS:-3}
FAULT_AFTER_S=${FAULT_AFTER_S:-3}
SLEEP_S=${SLEEP_S:-8}
LEASE_S=${LEASE_S:-8}
TIMEOUT_S=${TIMEOUT_S:-7200}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN=/tmp/pko-chaos
NS=pko-chaos
FAULTS=(replica-kill replica-term replica-stop redis-flush agent-kill agent-term)
fail() { KEEP_NS=1; echo "CHAOS TEST FAILED: $* (namespace $NS kept for inspection; the operators are stopped)" >&2; for l in "$RUN"/operator*.log; do [ -f "$l" ] && { echo "== $l" >&2; tail -15 "$l" >&2; }; done; exit 1; }

. "$ROOT/loadtest/lib.sh"
stop_all() {
  for f in "$RUN"/operator*.pid; do [ -f "$f" ] && { kill -CONT "$(cat "$f")" 2>/dev/null; kill -TERM "$(cat "$f")" 2>/dev/null; } || true; done
  sleep 2
  pkill -TERM -f -- "$RUN/agents" 2>/dev/null || true
}
cleanup() { stop_all; [ -n "${KEEP_NS:-}" ] || delete_namespace --wait=false; }
trap cleanup EXIT
stop_all
delete_namespace --wait=true --timeout=120s
rm -rf "$RUN" && mkdir -p "$RUN/state" "$RUN/flock"
redis-cli -u "$REDIS_URL" --scan --pattern 'pko-chaos:*' | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null
# the queue's own Redis, so that FLUSHALL touches nothing else of the bed
REDIS_PORT=$((16380 + RANDOM % 500))
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no > "$RUN/redis.log" 2>&1 &
echo $! > "$RUN/redis.pid"
CHAOS_REDIS="redis://127.0.0.1:$REDIS_PORT"
for _ in $(seq 1 50); do redis-cli -u "$CHAOS_REDIS" ping >/dev/null 2>&1 && break; sleep 0.1; done
trap 'cleanup; kill "$(cat "$RUN/redis.pid")" 2>/dev/null || true' EXIT

kubectl apply --server-side -f "$ROOT/deploy/crds/" >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl create namespace $NS >/dev/null
KCFG_SERVER="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"

start_replica() {
  local i=$1
  PULUMI_CONFIG_PASSPHRASE=load setsid "$BIN/pko-operator" run --runtime local --agent-bin "$BIN/pko-agent" \
    --program-fs-addr 127.0.0.1:$((19291 + i)) --metrics-bind-address 127.0.0.1:$((18584 + i)) --metrics-secure=false --health-probe-bind-address 0 --namespaces $NS \
    --local-work-dir "$RUN/agents" --local-api-server "$KCFG_SERVER" --local-ca-file "$PKO_TESTBED_RUN/certs/ca.crt" \
    --fleet --fleet-namespace $NS --redis-url "$CHAOS_REDIS" --redis-prefix pko-chaos --replica-id "r$i" \
    --lease-duration-seconds "$LEASE_S" --renew-interval-seconds 2 --renew-deadline-seconds $((LEASE_S - 2)) --pool-idle-timeout-seconds 60 \
    >> "$RUN/operator-$i.log" 2>&1 < /dev/null &
  echo $! > "$RUN/operator-$i.pid"
  disown $!   # killed on purpose: no job report
}
for i in $(seq 0 $((REPLICAS - 1))); do start_replica "$i"; done
sleep 1
for i in $(seq 0 $((REPLICAS - 1))); do kill -0 "$(cat "$RUN/operator-$i.pid")" || fail "replica $i did not start"; done

TRACE="$RUN/trace.txt"
: > "$TRACE"
traced_manifests "exec 9>>$RUN/flock/\${pulumi.stack}; flock -n 9 || echo \${pulumi.stack} \${gen} overlap >> $TRACE; flock 9; sleep $SLEEP_S; echo \${pulumi.stack} \${gen} >> $TRACE" > "$RUN/manifests.yaml"

T_START=$(date +%s)
kubectl -n $NS apply -f "$RUN/manifests.yaml" >/dev/null
echo "applied $N Stacks on $REPLICAS replicas (lease ${LEASE_S} s); waiting for the first convergence"
wait_converged 0 >/dev/null
echo "round 0: all $N Ready in $(( $(date +%s) - T_START )) s"

# a pool agent of the fleet running an operation (a `pulumi` among its descendants): its pid
busy_agent() {
  local a
  for a in $(pgrep -f -- "pko-agent serve.*$RUN/agents" || true); do
    if pgrep -f -- "pko-agent supervise --parent $a " >/dev/null; then echo "$a"; return 0; fi
  done
  return 1
}
wait_moved() { # VICTIM: until no shard Lease names it
  local t0; t0=$(date +%s)
  while [ "$(shards_held_by "$1")" -gt 0 ]; do [ $(( $(date +%s) - t0 )) -gt 120 ] && fail "round $round: $1's shards not taken within 120 s"; sleep 0.3; done
}

# round_updates SINCE: `<unchanged> <mismatch>` — of the Updates created at or after SINCE (an ISO time),
# those that completed successfully with only unchanged resources, and those that failed RunMismatch
round_updates() {
  kubectl -n $NS get updates -o json | jq -r --arg since "$1" '
    [.items[] | select(.metadata.creationTimestamp >= $since)] as $u
    | ($u | map(select(any(.status.conditions[]?; .type == "Failed" and .status == "False"))
                 | select((.status.changeSummary // {}) | keys | all(. == "same")))) as $same
    | ($u | map(select(any(.status.conditions[]?; .type == "Failed" and .reason == "RunMismatch")))) as $mm
    | "\($same | length) \($mm | length) \($same | map(.metadata.name) | join(","))"'
}

declare -A FAILOVER CONVERGE COUNT
UNCHANGED_ALL=0
MISMATCH_ALL=0
for round in $(seq 1 "$ROUNDS"); do
  fault=${FAULTS[$(( (round - 1) % ${#FAULTS[@]} ))]}
  t_change=$(date +%s)
  since=$(date -u -d "@$t_change" +%Y-%m-%dT%H:%M:%SZ)
  patches=()
  for i in $(seq -f '%03g' 1 "$N"); do kubectl -n $NS patch stack "s$i" --type=merge -p "{\"spec\":{\"config\":{\"gen\":\"$round\"}}}" >/dev/null & patches+=($!); done
  wait "${patches[@]}"
  sleep "$FAULT_AFTER_S"
  victim=$(( (round - 1) / ${#FAULTS[@]} % REPLICAS ))
  fo="-"
  case $fault in
    replica-*)
      shards=$(shards_of "r$victim")
      watch_leases "$RUN/leases-$round.log"
      t_fault=$(date +%s.%N)
      pid=$(cat "$RUN/operator-$victim.pid")
      case $fault in
        replica-kill) kill -KILL "$pid" ;;
        replica-term) kill -TERM "$pid" ;;
        replica-stop) kill -STOP "$pid" ;;
      esac
      wait_moved "r$victim"
      polled=$(awk -v a="$(date +%s.%N)" -v b="$t_fault" 'BEGIN { printf "%.1f", a - b }')
      # the Lease watch's own timestamps are finer; a watch that missed events (kubectl's watch can end
      # early) falls back, after 5 s, to the poll above, marked `~`
      # shellcheck disable=SC2086
      for _ in $(seq 1 10); do [ "$(moved_after "$t_fault" "$RUN/leases-$round.log" "r$victim" $shards)" != "?" ] && break; sleep 0.5; done
      # shellcheck disable=SC2086
      fo=$(moved_after "$t_fault" "$RUN/leases-$round.log" "r$victim" $shards)
      [ "$fo" = "?" ] && fo="~$polled"
      pkill -P "$WATCHER" 2>/dev/null || true
      case $fault in
        replica-kill) start_replica "$victim" ;;
        replica-term) for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; start_replica "$victim" ;;
        replica-stop) kill -CONT "$pid" ;;
      esac
      ;;
    redis-flush) redis-cli -u "$CHAOS_REDIS" FLUSHALL >/dev/null ;;
    agent-kill|agent-term)
      a=$(busy_agent || true)
      if [ -n "$a" ]; then
        if [ "$fault" = agent-kill ]; then kill -KILL "$a"; else kill -TERM "$a"; fi
      else
        echo "    round $round: no busy agent to $fault" >&2
      fi
      ;;
  esac
  wait_converged "$round" >/dev/null
  took=$(( $(date +%s) - t_change ))
  FAILOVER[$fault]+="$fo "; CONVERGE[$fault]+="$took "; COUNT[$fault]=$(( ${COUNT[$fault]:-0} + 1 ))
  read -r unchanged mismatched unchanged_names <<< "$(round_updates "$since")"
  UNCHANGED_ALL=$((UNCHANGED_ALL + unchanged)); MISMATCH_ALL=$((MISMATCH_ALL + mismatched))
  printf 'round %d: %s%s -> failover %s s; all %d Ready at gen=%d %d s after the change; unchanged-after-change=%d run-mismatch=%d%s\n' \
    "$round" "$fault" "$( [[ $fault == replica-* ]] && echo " r$victim" )" "$fo" "$N" "$round" "$took" "$unchanged" "$mismatched" \
    "$( [ "$unchanged" -gt 0 ] && echo " ($unchanged_names)" )"
done

sleep 5
# from the trace: lost, duplicated, overlapping
LOST=0; DUP=0
for i in $(seq -f '%03g' 1 "$N"); do
  for n in $(seq 0 "$ROUNDS"); do
    c=$(grep -c "^s$i $n\$" "$TRACE" || true)
    [ "$c" -eq 0 ] && LOST=$((LOST + 1))
    [ "$c" -gt 1 ] && DUP=$((DUP + c - 1))
  done
done
OVERLAP=$(grep -c ' overlap$' "$TRACE" || true)
FAILED=$(kubectl -n $NS get updates -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Failed")].status}/{.status.conditions[?(@.type=="Failed")].reason}{"\n"}{end}' | { grep '^True/' || true; } | sort | uniq -c | tr '\n' ' ')
# every failed Update with its message, for the report (the namespace goes at the end)
kubectl -n $NS get updates -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.creationTimestamp} {.status.conditions[?(@.type=="Failed")].status}/{.status.conditions[?(@.type=="Failed")].reason}: {.status.message}{"\n"}{end}' \
  | { grep ' True/' || true; } > "$RUN/failed-updates.txt"
PROGRESSING=$(kubectl -n $NS get updates -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Progressing")].status}{"\n"}{end}' | grep -c '^True$' || true)
LOCKS=$(find "$RUN/state/.pulumi/locks" -name '*.json' 2>/dev/null | wc -l)
# everything stopped gracefully: nothing of any operation may be left running
stop_all
for _ in $(seq 1 30); do pgrep -f -- "pko-agent serve.*$RUN/agents" >/dev/null || break; sleep 1; done
ORPHANS=$(for p in /proc/[0-9]*; do c=$(readlink "$p/cwd" 2>/dev/null || true); case $c in "$RUN"/*) echo "${p#/proc/} $(cat "$p/comm" 2>/dev/null)";; esac; done | { grep -v ' pko-agent$' || true; } | wc -l)

stats() { tr ' ' '\n' <<< "$1" | grep -v '^$' | grep -v '^[?-]$' | sed 's/^~//' | sort -n | awk '{v[NR]=$1} END {if (NR == 0) print "-"; else printf "%s / %s / %s", v[1], v[int((NR+1)/2)], v[NR]}'; }
echo "stacks=$N replicas=$REPLICAS rounds=$ROUNDS lease_duration_s=$LEASE_S fault_after_s=$FAULT_AFTER_S sleep_s=$SLEEP_S"
echo "| fault | rounds | failover s (min / median / max) | change -> all Ready s (min / median / max) |"
echo "|---|---|---|---|"
for f in "${FAULTS[@]}"; do echo "| $f | ${COUNT[$f]:-0} | $(stats "${FAILOVER[$f]:-}") | $(stats "${CONVERGE[$f]:-}") |"; done
echo "operations: expected=$((N * (ROUNDS + 1))) lost=$LOST duplicated=$DUP overlapping=$OVERLAP; updates_failed=[${FAILED:-none}] updates_left_progressing=$PROGRESSING locks_left=$LOCKS orphan_processes=$ORPHANS"
echo "updates that succeeded unchanged after a config change: $UNCHANGED_ALL; refused RunMismatch: $MISMATCH_ALL"
echo "SIGTERM handoffs from the operators' own logs (signal received -> the survivors' last shard-table write taking shards):"
python3 "$ROOT/loadtest/handoff.py" "$RUN" | sed 's/^/  /'
echo "total $(( $(date +%s) - T_START )) s"
[ -s "$RUN/failed-updates.txt" ] && { echo "failed Updates (each retried by its Stack):"; sed 's/^/  /' "$RUN/failed-updates.txt"; }
[ "$LOST" -eq 0 ] && [ "$UNCHANGED_ALL" -eq 0 ] && [ "$DUP" -eq 0 ] && [ "$OVERLAP" -eq 0 ] && [ "$PROGRESSING" -eq 0 ] && [ "$LOCKS" -eq 0 ] && [ "$ORPHANS" -eq 0 ] || fail "operations lost, duplicated or overlapping, or leftovers"
