#!/usr/bin/env bash
# Load test: N Stacks of one Program on the local test bed, with the operator's local runtime (agent
# pools: the Stacks share one pool of at most POOL_MAX agents per replica). Measures the time from
# `kubectl apply` to every Stack Ready, the resident memory of the operator (peak while converging, and
# at rest) and of the agents, dispatch latency, and the idle cost: agent processes left IDLE_WAIT_S
# after every Stack is Ready.
#
#   loadtest/stacks.sh [N]          N Stacks (default 100)
#   MAX_OPS=16 loadtest/stacks.sh   operations the operator drives at once (default 16)
#   TIMEOUT_S=1800                  give up after this many seconds (bounded run)
#   REPLICAS=3                      that many operator replicas in a fleet (--fleet, the bed's redis);
#                                   memory is reported per replica and summed; FLEET_ONE=1: one replica,
#                                   but as a fleet (Leases, Redis)
#   POOL_MAX=16                     agents per pool and replica (--pool-max-agents)
#   POOL_MIN=0                      agents kept per pool once it exists (--pool-min-agents): a warm pool
#   IDLE_TIMEOUT_S=60               --pool-idle-timeout-seconds; IDLE_WAIT_S (default: it + 15) is when
#                                   the agents left are counted
#   FAILOVER=1                      (fleet) SIGKILL the last replica once half the Stacks are Ready, restart
#                                   it once the survivors hold its shards; the API server's requests per
#                                   10 s around it go to REPORT_DIR/failover-requests.txt;
#                                   RESTART_DELAY_S=N restarts it N s after the takeover instead
#   SHARDS=2048                     (fleet) --shards; a fleet settles (every shard held, none moving)
#                                   before the apply, its CPU reported apart (fleet_formation_cpu_s)
#   REPORT_DIR=DIR                  where the report (PNG plots from the run's Prometheus, report.md) goes
#   HOLLOW=1                        HOLLOW AGENTS (kubemark-style, control-plane load only): operations
#                                   are simulated for that many seconds, no Pulumi runs; the report says so
#   BARE=1                          first, side by side in the same run: a bare `pulumi stack init` + `pulumi
#                                   up` loop over the same N programs at the same concurrency (BARE_C,
#                                   default REPLICAS × min(MAX_OPS, POOL_MAX)), timed; then prints
#                                   fleet time / bare time
#   CLI=1                           the kubectl plugin: `kubectl pko fleet` printed mid-run (half Ready),
#                                   then wall time, peak RSS and LISTs per call of `fleet` and `status`
#   REQ_BG_S=30                     API requests per operation (always): the API server's own counter
#                                   over the run, less the script's requests and the bed's background
#                                   counted over REQ_BG_S at rest before the apply (loadtest/requests.py)
#
# Everything listens on 127.0.0.1; the run stops by itself and cleans up (namespace, operator, agents).
set -euo pipefail
N=${1:-100}
MAX_OPS=${MAX_OPS:-16}
REPLICAS=${REPLICAS:-1}
TIMEOUT_S=${TIMEOUT_S:-1800}
POOL_MAX=${POOL_MAX:-16}
IDLE_TIMEOUT_S=${IDLE_TIMEOUT_S:-60}
IDLE_WAIT_S=${IDLE_WAIT_S:-$((IDLE_TIMEOUT_S + 15))}
HOLLOW=${HOLLOW:-}
POOL_MIN=${POOL_MIN:-0}
SHARDS=${SHARDS:-2048}
POOL=(--pool-min-agents "$POOL_MIN" --pool-max-agents "$POOL_MAX" --pool-idle-timeout-seconds "$IDLE_TIMEOUT_S")
[ -n "$HOLLOW" ] && POOL+=(--hollow-agents-seconds "$HOLLOW") && echo "HOLLOW AGENTS: operations simulated for $HOLLOW s, no Pulumi runs (control-plane load test)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN=/tmp/pko-load
NS=pko-load
fail() { echo "LOADTEST FAILED: $*" >&2; for l in "$RUN"/operator*.log; do [ -f "$l" ] && tail -20 "$l" >&2; done; exit 1; }

. "$ROOT/loadtest/lib.sh"
cleanup() {
  [ -n "${APPLY_PID:-}" ] && { kill "$APPLY_PID" 2>/dev/null; pkill -f -- "kubectl -n $NS apply -f $RUN/" 2>/dev/null; } || true
  prom_stop
  for f in "$RUN"/operator*.pid; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true; done
  sleep 2
  pkill -TERM -f -- "$RUN/agents" 2>/dev/null || true
  delete_namespace --wait=false
}
trap cleanup EXIT
for f in "$RUN"/operator*.pid; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true; done
pkill -TERM -f -- "$RUN/agents" 2>/dev/null || true
delete_namespace --wait=true --timeout=120s
rm -rf "$RUN" && mkdir -p "$RUN/state"

# BARE=1: the same N programs through a bare `pulumi` loop at the fleet's concurrency, before the fleet
# runs (the operators are not started yet), after one untimed warm-up `up`
if [ -n "${BARE:-}" ]; then
  [ -n "$HOLLOW" ] && fail "BARE=1 compares real operations: not with HOLLOW"
  PER=$(( MAX_OPS < POOL_MAX ? MAX_OPS : POOL_MAX ))
  BARE_C=${BARE_C:-$((REPLICAS * PER))}
  mkdir -p "$RUN/bare/state"
  for i in warmup $(seq -f 's%04g' 1 "$N"); do
    mkdir -p "$RUN/bare/$i"
    printf 'name: load\nruntime: yaml\nresources:\n  r:\n    type: command:local:Command\n    properties: {create: "echo ${pulumi.stack}"}\noutputs:\n  out: ${r.stdout}\n' > "$RUN/bare/$i/Pulumi.yaml"
  done
  bare_one() {
    cd "$RUN/bare/$1" && export PULUMI_BACKEND_URL="file://$RUN/bare/state" PULUMI_CONFIG_PASSPHRASE=load &&
      pulumi stack init "$1" --non-interactive > up.log 2>&1 && pulumi up --yes --skip-preview --non-interactive --stack "$1" >> up.log 2>&1 && touch done ||
      echo "bare loop: $1 failed (see $RUN/bare/$1/up.log)" >&2
  }
  export -f bare_one; export RUN
  bare_one warmup
  echo "bare loop: $N × (pulumi stack init + pulumi up), $BARE_C at once (progress every 10 s)"
  B0=$(date +%s.%N)
  seq -f 's%04g' 1 "$N" | xargs -P "$BARE_C" -I{} bash -c 'bare_one {}' &
  BARE_PID=$!
  while kill -0 $BARE_PID 2>/dev/null; do
    sleep 10; echo "  bare t=$(printf '%.0f' "$(echo "$(date +%s.%N) - $B0" | bc)")s done=$(find "$RUN/bare" -name done | wc -l)/$N"
  done
  wait $BARE_PID || true
  BARE_S=$(echo "$(date +%s.%N) - $B0" | bc)
  BARE_DONE=$(find "$RUN/bare" -maxdepth 2 -name done | wc -l)
  [ "$BARE_DONE" -eq $((N + 1)) ] || fail "bare loop: $((N + 1 - BARE_DONE)) of $N (+ warm-up) failed"
  printf 'bare loop: %d ups in %.1f s at %d at once\n' "$N" "$BARE_S" "$BARE_C"
fi

kubectl apply --server-side -f "$ROOT/deploy/crds/" >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl create namespace $NS >/dev/null
KCFG_SERVER="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
FLEET=()
if [ "$REPLICAS" -gt 1 ] || [ -n "${FLEET_ONE:-}" ]; then
  redis-cli -u "$REDIS_URL" --scan --pattern 'pko-load:*' | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null
  FLEET=(--fleet --fleet-namespace $NS --redis-url "$REDIS_URL" --redis-prefix pko-load --shards "$SHARDS")
fi
# CLI=1: the kubectl plugin's cost once every Stack is Ready — wall time and peak RSS of 5 calls each of
# `kubectl pko fleet` and `kubectl pko status -n NS`, and the LISTs they sent, from the API server's own
# apiserver_request_total (the operators only watch at rest: no LIST of their own in between; the bed's
# background over as long a window after the calls subtracted)
lists() { kubectl get --raw /metrics | awk '/^apiserver_request_total\{/ && /verb="LIST"/ && /resource="(leases|stacks|updates|workspaces)"/ { s += $NF } END { print s + 0 }'; }
cli_cost() {
  local what l0 l1 times
  for what in "fleet --fleet-namespace $NS" "status -n $NS"; do
    l0=$(lists); times=""; local t0; t0=$(date +%s.%N)
    for _ in 1 2 3 4 5; do times="$times $( { /usr/bin/time -f '%e %M' "$BIN/kubectl-pko" $what > /dev/null; } 2>&1 | tail -1 )"; done
    l1=$(lists)
    # the bed's background LISTs (its namespace controller lists every kind while it deletes test
    # namespaces), over an idle window as long as the calls took, are subtracted
    local took; took=$(echo "$(date +%s.%N) - $t0" | bc); local b0; b0=$(lists); sleep "$took"; l1=$(( l1 - ($(lists) - b0) ))
    # pairs "wall_s rss_kib" → median and max wall, peak RSS (mawk: no asort; sort does it)
    local sorted; sorted=$(echo "$times" | xargs -n 2 | sort -n)
    echo "$sorted" | awk -v w="kubectl pko ${what%% *}" -v n=$(( l1 - l0 )) '{ t[NR] = $1; if ($2 > m) m = $2 } END { printf "cli: %s: median %.2f s, max %.2f s, peak RSS %.1f MiB, %.1f LISTs per call (%d calls)\n", w, t[int((NR + 1) / 2)], t[NR], m / 1024, n / NR, NR }'
  done
}
OPS=()
start_replica() {
  local i=$1
  PULUMI_CONFIG_PASSPHRASE=load setsid "$BIN/pko-operator" run --runtime local --agent-bin "$BIN/pko-agent" \
    --program-fs-addr 127.0.0.1:$((19091 + i)) --max-operations "$MAX_OPS" --namespace-share-percent 100 --metrics-bind-address 127.0.0.1:$((18384 + i)) --metrics-secure=false --health-probe-bind-address 0 --namespaces $NS \
    --local-work-dir "$RUN/agents" --local-api-server "$KCFG_SERVER" --local-ca-file "$PKO_TESTBED_RUN/certs/ca.crt" \
    ${FLEET[@]+"${FLEET[@]}"} ${FLEET[@]+--replica-id load-$i} "${POOL[@]}" \
    >> "$RUN/operator-$i.log" 2>&1 < /dev/null &
  OPS[$i]=$!
  echo $! > "$RUN/operator-$i.pid"
}
for i in $(seq 0 $((REPLICAS - 1))); do start_replica "$i"; done
TARGETS=(); for i in $(seq 0 $((REPLICAS - 1))); do TARGETS+=("127.0.0.1:$((18384 + i))"); done
prom_start "$RUN/prometheus" "${PROM_PORT:-19990}" "${TARGETS[@]}"
sleep 1
for op in "${OPS[@]}"; do kill -0 "$op" || fail "an operator replica did not start"; done
OP=${OPS[0]}
rss() { local t=0 p; for p in "$@"; do t=$((t + $(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0))); done; echo $t; }
# anonymous resident memory (KiB): RSS without the binary's file-backed pages, which replicas on one
# machine share (the same executable) and the kernel may drop
anon() { local t=0 p; for p in "$@"; do t=$((t + $(awk '/^RssAnon:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0))); done; echo $t; }
# CPU seconds (user + system) used so far by processes "$@", summed
cpu_s() { local p; for p in "$@"; do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0; done | awk -v hz="$(getconf CLK_TCK)" '{ s += $1 } END { printf "%.1f", s / hz }'; }
# A fleet settles before the Stacks come, as in an install whose replicas run long before Stacks are
# applied: every shard held and nothing moving for two polls. Its CPU is reported apart from the
# workload's (fleet_formation_cpu_s), which is counted from the apply on.
if [ ${#FLEET[@]} -gt 0 ]; then
  echo "waiting for the fleet to settle (every one of $SHARDS shards held, none moving)…"
  T_SETTLE=$(date +%s); prev=""; stable=0
  while :; do
    held=$(for i in $(seq 0 $((REPLICAS - 1))); do curl -s "127.0.0.1:$((18384 + i))/metrics" | awk '$1 == "pko_fleet_shards_held" {print $2; f=1} END {if (!f) print 0}'; done | paste -sd' ')
    sum=$(echo "$held" | tr ' ' '\n' | awk '{ s += $1 } END { print s + 0 }')
    if [ "$sum" -ge "$SHARDS" ] && [ "$held" = "$prev" ]; then stable=$((stable + 1)); else stable=0; fi
    [ "$stable" -ge 2 ] && break
    [ $(( $(date +%s) - T_SETTLE )) -gt 300 ] && fail "the fleet did not settle within 300 s (shards held per replica: $held)"
    echo "  shards held per replica: $held"
    prev=$held; sleep 2
  done
  FORMATION_CPU=$(for op in "${OPS[@]}"; do cpu_s "$op"; echo; done | paste -sd' ')
  echo "fleet settled in $(( $(date +%s) - T_SETTLE )) s; fleet_formation_cpu_s per replica: $FORMATION_CPU"
fi
IDLE_KIB=$(rss "${OPS[@]}")
# API requests per operation (loadtest/requests.py): the API server's own apiserver_request_total, the
# bed's background counted first over REQ_BG_S at rest (operators running, nothing to do)
api_snap() { kubectl get --raw /metrics | python3 "$ROOT/loadtest/requests.py" snap > "$1"; }
# the bed's kube-controller-manager (its garbage collector above all: a namespace deleted by the run
# before goes on being collected into the next run — GETs answered 404, or 200 where this run reused a
# name) counts with everyone else in apiserver_request_total: its own client's requests by method and
# code, and the collector's queue
KCM_PORT=${TESTBED_KCM_PORT:-20257}
kcm_metrics() { curl -sk --max-time 5 --cert "$PKO_TESTBED_RUN/certs/admin.crt" --key "$PKO_TESTBED_RUN/certs/admin.key" "https://127.0.0.1:$KCM_PORT/metrics" 2>/dev/null; }
kcm_snap() {
  kcm_metrics \
    | awk '/^rest_client_requests_total\{/ { match($0, /code="[^"]*"/); c = substr($0, RSTART + 6, RLENGTH - 7); match($0, /method="[^"]*"/); m = substr($0, RSTART + 8, RLENGTH - 9); n[m " " c] += $NF }
           /^workqueue_adds_total\{name="garbage_collector_attempt_to_delete"\}/ { n["gc-attempt-to-delete"] += $NF }
           END { for (k in n) print k, n[k] }' | sort > "$1"
}
kcm_delta() {
  join -a 2 -e 0 -o 0,1.2,2.2 <(sed 's/ \([^ ]*\)$/|\1/; s/ /_/g; s/|/ /' "$1") <(sed 's/ \([^ ]*\)$/|\1/; s/ /_/g; s/|/ /' "$2") \
    | awk '{ d = $3 - $2; if (d > 0) printf " %s=%d", $1, d }'
}
REQ_BG_S=${REQ_BG_S:-30}
# the collector's queue of the namespace deleted before (names repeat from run to run: its GETs of
# `<update>-stack-outputs` then find this run's Secrets) drained first, for at most GC_WAIT_S (180)
gc_depth() {
  kcm_metrics \
    | awk '/^workqueue_depth\{name="garbage_collector_(attempt_to_delete|graph_changes)"\}/ { n += $NF } END { print n + 0 }'
}
T_GC=$(date +%s)
while [ "$(gc_depth)" -gt 0 ] && [ $(( $(date +%s) - T_GC )) -lt "${GC_WAIT_S:-180}" ]; do
  echo "  waiting for the bed's garbage collector: $(gc_depth) objects of earlier runs queued"; sleep 10
done
echo "garbage collector queue: $(gc_depth) after $(( $(date +%s) - T_GC )) s"
echo "counting the API server's background requests at rest for ${REQ_BG_S} s…"
api_snap "$RUN/req-bg0.json"; sleep "$REQ_BG_S"; api_snap "$RUN/req-bg1.json"
# FAILOVER=1: every 10 s, the API server's request counters and its own view (loadtest/window.py
# apiserver: latencies, etcd, watch cache, in flight), and the CPU of the machine and of each process
# tree (window.py cpu), for what happened around the SIGKILL; named by when the API server answered (a
# busy one takes seconds) and the Stacks Ready last polled
ETCD=$(pgrep -f "^etcd --name pko-testbed" | head -1 || true)
KCM=$(pgrep -f "kube-controller-manager --kubeconfig" | head -1 || true)
req_snap() {
  [ -n "${FAILOVER:-}" ] || return 0
  local groups=(apiserver=${APISERVER:-} etcd=${ETCD:-} controller-manager=${KCM:-} prometheus=${PROM_PID:-} kubectl-apply=${APPLY_PID:-}) i
  for i in "${!OPS[@]}"; do groups+=("replica-$i=${OPS[$i]}"); done
  python3 "$ROOT/loadtest/window.py" cpu "${groups[@]}" > "$RUN/cpu.json"
  kubectl get --raw /metrics > "$RUN/metrics.txt" || return 0
  local name="t$(( $(date +%s) - T0 ))-r$ready"
  python3 "$ROOT/loadtest/requests.py" snap < "$RUN/metrics.txt" > "$RUN/req-$name.json"
  python3 "$ROOT/loadtest/window.py" apiserver < "$RUN/metrics.txt" > "$RUN/api-$name.json"
  mv "$RUN/cpu.json" "$RUN/cpu-$name.json"
}
declare -A PEAK_OF ANON_OF
for op in "${OPS[@]}"; do PEAK_OF[$op]=0; ANON_OF[$op]=0; done

{
  cat <<YAML
apiVersion: pulumi.com/v1
kind: Program
metadata: {name: load}
program:
  resources:
    r:
      type: command:local:Command
      properties: {create: "echo \${pulumi.stack}"}
  outputs:
    out: \${r.stdout}
YAML
  for i in $(seq -f '%04g' 1 "$N"); do
    printf -- '---\napiVersion: pulumi.com/v1\nkind: Stack\nmetadata: {name: s%s}\nspec: {stack: s%s, programRef: {name: load}, backend: "file://%s/state"}\n' "$i" "$i" "$RUN"
  done
} > "$RUN/manifests.yaml"

APISERVER=$(pgrep -f "kube-apiserver.*--secure-port=${KCFG_SERVER##*:}( |$)" | head -1 || true)
declare -A CPU0
for op in "${OPS[@]}"; do CPU0[$op]=$(cpu_s "$op"); done
API_CPU0=$(cpu_s ${APISERVER:-})
api_snap "$RUN/req-run0.json"; kcm_snap "$RUN/kcm-run0.txt"
T0=$(date +%s)
# in chunks of 1,000 objects, four `kubectl apply` at once (one apply of 10,000 took minutes alone)
awk -v out="$RUN/manifests.part" '/^---$/ { c++ } { print > sprintf("%s.%03d", out, int(c / 1000)) }' "$RUN/manifests.yaml"
# in the background: memory and Ready are sampled while it runs (a 10,000-Stack apply takes minutes)
ls "$RUN"/manifests.part.* | xargs -P 4 -I{} kubectl -n $NS apply -f {} >/dev/null &
APPLY_PID=$!; APPLIED_S=""
echo "applying $N Stacks; waiting for Ready (progress every 10 s)"
PEAK=0; LAST=$T0
# memory every 2 s; Ready (a LIST of every Stack) every POLL_S: each second of LISTing 10,000 Stacks
# is API-server time the run itself needs
POLL_S=${POLL_S:-$(( N > 2000 ? N / 1000 * 2 : 2 ))}
LAST_POLL=0; ready=0
while :; do
  now=$(date +%s); [ $((now - T0)) -gt "$TIMEOUT_S" ] && fail "not all Stacks Ready after ${TIMEOUT_S} s"
  if [ -z "$APPLIED_S" ] && ! kill -0 $APPLY_PID 2>/dev/null; then
    wait $APPLY_PID || fail "kubectl apply of the Stacks failed"
    APPLIED_S=$((now - T0)); echo "  applied $N Stacks in ${APPLIED_S} s"
  fi
  r=$(rss "${OPS[@]}"); [ "$r" -gt "$PEAK" ] && PEAK=$r
  for op in "${OPS[@]}"; do x=$(rss "$op"); [ "$x" -gt "${PEAK_OF[$op]}" ] && PEAK_OF[$op]=$x; x=$(anon "$op"); [ "$x" -gt "${ANON_OF[$op]}" ] && ANON_OF[$op]=$x; done
  if [ $((now - LAST_POLL)) -ge "$POLL_S" ]; then
    LAST_POLL=$now
    POLLS=$((${POLLS:-0} + 1))
    ready=$(kubectl -n $NS get stacks -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c '^True$' || true)
  fi
  [ "$ready" -ge "$N" ] && [ -n "$APPLIED_S" ] && break
  # FAILOVER=1 (fleet): SIGKILL the last replica once half the Stacks are Ready; restart it once the
  # survivors hold its shards (as a Deployment restarts a killed pod)
  if [ -n "${FAILOVER:-}" ] && [ "$REPLICAS" -gt 1 ] && [ -z "${KILLED_AT:-}" ] && [ "$ready" -ge $((N / 2)) ]; then
    v=$((REPLICAS - 1)); kill -KILL "${OPS[$v]}"; KILLED_AT=$(date +%s.%N); KILL_T=$(( $(date +%s) - T0 ))
    echo "  FAILOVER: SIGKILL replica $v at ready=$ready/$N"
    while [ "$(shards_held_by "load-$v")" -gt 0 ]; do
      sleep 0.5
      [ $(( $(date +%s) - LAST )) -ge 10 ] && LAST=$(date +%s) && req_snap
    done
    FAILOVER_S=$(echo "$(date +%s.%N) - $KILLED_AT" | bc)
    echo "  FAILOVER: its shards held by the survivors after ${FAILOVER_S} s"
    # RESTART_DELAY_S: later, as a Deployment replacing a killed pod takes a while (scheduling, start)
    RESTART_AT=$(( $(date +%s) + ${RESTART_DELAY_S:-0} ))
  fi
  if [ -n "${RESTART_AT:-}" ] && [ "$(date +%s)" -ge "$RESTART_AT" ]; then
    RESTART_AT=""; v=$((REPLICAS - 1)); RESTARTED_AT=$(date +%s)
    echo "  FAILOVER: restarting replica $v at t=$((RESTARTED_AT - T0)) s"
    start_replica "$v"; PEAK_OF[${OPS[$v]}]=0; ANON_OF[${OPS[$v]}]=0; CPU0[${OPS[$v]}]=0
  fi
  # CLI=1: what `kubectl pko fleet` shows mid-run (queues and pools busy)
  if [ -n "${CLI:-}" ] && [ -z "${CLI_MID:-}" ] && [ "$ready" -ge $((N / 2)) ]; then
    CLI_MID=1; echo "  kubectl pko fleet at ready=$ready/$N:"; "$BIN/kubectl-pko" fleet --fleet-namespace $NS | sed 's/^/    /' | tee "$RUN/fleet-mid.txt"
  fi
  if [ $((now - LAST)) -ge 10 ]; then
    LAST=$now; echo "  t=$((now - T0))s ready=$ready/$N operator_rss_mib=$((r / 1024))"
    req_snap
  fi
  sleep 2
done
READY_S=$(( $(date +%s) - T0 ))
CPU_PER=""; CPU_TOTAL=0
for op in "${OPS[@]}"; do c=$(echo "$(cpu_s "$op") - ${CPU0[$op]}" | bc); CPU_PER="$CPU_PER $c"; CPU_TOTAL=$(echo "$CPU_TOTAL + $c" | bc); done
API_CPU=$(echo "$(cpu_s ${APISERVER:-}) - $API_CPU0" | bc)
api_snap "$RUN/req-run1.json"; kcm_snap "$RUN/kcm-run1.txt"
sleep 10   # let the last status writes and requeues settle
REST_KIB=$(rss "${OPS[@]}")
PER_REPLICA=""
for op in "${OPS[@]}"; do PER_REPLICA="$PER_REPLICA peak=$((PEAK_OF[$op] / 1024))/rest=$(($(rss "$op") / 1024))/anon=$((ANON_OF[$op] / 1024))"; done
AGENTS_KIB=0; AGENTS=0
for p in $(pgrep -f -- "pko-agent serve .*$RUN/agents"); do AGENTS_KIB=$((AGENTS_KIB + $(rss "$p"))); AGENTS=$((AGENTS + 1)); done
UPDATES=$(kubectl -n $NS get updates -o name | wc -l)
FAILED=$(kubectl -n $NS get updates -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Failed")].status}/{.status.conditions[?(@.type=="Failed")].reason}{"\n"}{end}' | { grep '^True/' || true; } | sort | uniq -c | tr '\n' ' ')
echo "stacks=$N max_operations=$MAX_OPS all_ready_s=$READY_S updates=$UPDATES failed_updates_by_reason=[${FAILED:-none}]"
if [ -n "${KEEP:-}" ]; then trap - EXIT; echo "kept: namespace $NS, operator pids ${OPS[*]} (logs $RUN/operator-*.log)"; fi
echo "operator_rss_mib (all $REPLICAS replica(s)): idle=$((IDLE_KIB / 1024)) peak=$((PEAK / 1024)) at_rest=$((REST_KIB / 1024))"
echo "per replica (MiB; anon: peak anonymous memory, RSS without the executable's shared file pages):$PER_REPLICA"
echo "operator_cpu_s (apply → all Ready): total=$CPU_TOTAL per replica:$CPU_PER; kube-apiserver=$API_CPU"
echo "kube-apiserver_cpu_s_per_operation=$(echo "scale=4; $API_CPU / $UPDATES" | bc) ($UPDATES operations)"
# the script's own requests: client-side `kubectl apply` reads the namespace and reads then creates
# each Stack (one namespace GET per object applied, measured), and the Program once per chunk of
# 1,000; each Ready poll lists every Stack
CHUNKS=$(ls "$RUN"/manifests.part.* | wc -l)
python3 "$ROOT/loadtest/requests.py" table "$RUN/req-run0.json" "$RUN/req-run1.json" "$RUN/req-bg0.json" "$RUN/req-bg1.json" "$REQ_BG_S" "$READY_S" "$UPDATES" \
  "GET stacks=$N;POST stacks=$N;GET namespaces=$N;GET programs=$CHUNKS;POST programs=1;LIST stacks=${POLLS:-0}" | tee "$RUN/requests.txt"
echo "kube-controller-manager over the run (counted in the table above; method_code=requests):$(kcm_delta "$RUN/kcm-run0.txt" "$RUN/kcm-run1.txt")"
[ -n "${FORMATION_CPU:-}" ] && echo "fleet_formation_cpu_s (start → settled, before the apply): $FORMATION_CPU"
echo "agents=$AGENTS agents_rss_mib_total=$((AGENTS_KIB / 1024))"
[ -n "${CLI:-}" ] && cli_cost
for i in $(seq 0 $((REPLICAS - 1))); do
  echo "replica $i:"; curl -s http://127.0.0.1:$((18384 + i))/metrics | grep -E '^(stacks_active|programs_active|pko_update_operations_total|pko_update_operation_duration_seconds_(sum|count)|pko_fleet_shards_held|pko_pool_agents_started_total|pko_secret_reads_total|pko_stale_passes_total|pko_outputs_reads_total)' | sed 's/^/  /' || true
done
# dispatch latency (first push → the operation's first event on its agent), from the histograms of all
# replicas: p50 and p99 by linear interpolation within the Prometheus buckets
for i in $(seq 0 $((REPLICAS - 1))); do curl -s http://127.0.0.1:$((18384 + i))/metrics; done \
  | awk '/^pko_dispatch_latency_seconds_bucket/ { match($0, /le="[^"]+"/); le = substr($0, RSTART + 4, RLENGTH - 5); c[le] += $NF }
         END { n = 0; for (le in c) { les[++n] = le }
               for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if ((les[i] == "+Inf" ? 1e99 : les[i] + 0) > (les[j] == "+Inf" ? 1e99 : les[j] + 0)) { t = les[i]; les[i] = les[j]; les[j] = t }
               total = c["+Inf"]; if (total == 0) { print "dispatch_latency: no samples"; exit }
               split("0.5 0.99", qs, " ")
               for (k = 1; k <= 2; k++) { q = qs[k] * total; prev = 0; prevc = 0
                 for (i = 1; i <= n; i++) { if (c[les[i]] >= q) { hi = (les[i] == "+Inf" ? prev : les[i]); v = prev + (hi - prev) * (c[les[i]] == prevc ? 0 : (q - prevc) / (c[les[i]] - prevc)); printf "dispatch_latency_p%s_s=%.3f ", qs[k] * 100, v; break }
                   prev = les[i]; prevc = c[les[i]] } }
               printf "(samples %d)\n", total }'
# coordination cost at rest: Lease writes per second per replica over 30 s (fleet only)
if [ "${#FLEET[@]}" -gt 0 ]; then
  lease_writes() { for i in $(seq 0 $((REPLICAS - 1))); do curl -s http://127.0.0.1:$((18384 + i))/metrics; done | awk '/^pko_fleet_lease_writes_total/ { s += $NF } END { print s + 0 }'; }
  w0=$(lease_writes); sleep 30; w1=$(lease_writes)
  echo "coordination_writes_at_rest: $(echo "scale=3; ($w1 - $w0) / 30 / $REPLICAS" | bc) per second per replica (Lease writes over 30 s, $REPLICAS replica(s))"
fi
echo "idle cost: waiting ${IDLE_WAIT_S} s (pool idle timeout ${IDLE_TIMEOUT_S} s)…"
sleep "$IDLE_WAIT_S"
echo "agents_left_after_idle=$(pgrep -fc -- "$RUN/agents/pools" || true) (${IDLE_WAIT_S} s after all Ready)"
if [ -n "${BARE_S:-}" ]; then
  printf 'fleet_vs_bare: fleet %d s (apply → all Ready, %d replica(s)) / bare loop %.1f s (%d at once) = %.3f\n' "$READY_S" "$REPLICAS" "$BARE_S" "$BARE_C" "$(echo "$READY_S / $BARE_S" | bc -l)"
fi
[ -n "${FAILOVER_S:-}" ] && echo "failover mid-run: the SIGKILLed replica's shards were held by the survivors after ${FAILOVER_S} s"
# the timeline from the objects (created, labelled, queued, Ready per 5 s): tells a stall of the apply
# from one of the labeller or of the operators
mkdir -p "${REPORT_DIR:-$RUN/report}"
kubectl -n $NS get stacks -o json > "$RUN/stacks.json" && kubectl -n $NS get updates -o json > "$RUN/updates.json" \
  && python3 "$ROOT/loadtest/timeline.py" "$RUN/stacks.json" "$RUN/updates.json" "$T0" 5 > "${REPORT_DIR:-$RUN/report}/timeline.tsv" || echo "timeline: not written"
[ -n "${KILLED_AT:-}" ] && echo "timeline: SIGKILL at t=$(echo "$KILLED_AT - $T0" | bc | cut -d. -f1) s"
# which requests the API server served around the SIGKILL, per 10 s (loadtest/requests.py timeline)
[ -n "${KILL_T:-}" ] && python3 "$ROOT/loadtest/requests.py" timeline "$KILL_T" "$RUN"/req-t*-r*.json > "${REPORT_DIR:-$RUN/report}/failover-requests.txt" \
  && awk -v k="$KILL_T" 'NR <= 2 { print; next } { split(substr($1, 1 + ($1 ~ /^\*/)), w, "-"); if (w[1] + 0 >= k - 30 && w[1] + 0 <= k + 120) print }' "${REPORT_DIR:-$RUN/report}/failover-requests.txt"
# and what the machine's CPU went to, and how the API server fared, over the same windows
[ -n "${KILL_T:-}" ] && python3 "$ROOT/loadtest/window.py" timeline "$KILL_T" cpu "$RUN"/cpu-t*-r*.json | tee "${REPORT_DIR:-$RUN/report}/failover-cpu.txt" || true
[ -n "${KILL_T:-}" ] && python3 "$ROOT/loadtest/window.py" timeline "$KILL_T" api "$RUN"/api-t*-r*.json | tee "${REPORT_DIR:-$RUN/report}/failover-apiserver.txt" || true
TITLE="stacks.sh: $N Stacks, $REPLICAS replica(s), MAX_OPS=$MAX_OPS, POOL_MAX=$POOL_MAX${HOLLOW:+ — HOLLOW AGENTS (operations simulated for $HOLLOW s, no Pulumi ran)}"
EVENTS=("$T0:apply" "$((T0 + READY_S)):all Ready")
[ -n "${KILLED_AT:-}" ] && EVENTS+=("$KILLED_AT:SIGKILL replica $((REPLICAS - 1))")
[ -n "${RESTARTED_AT:-}" ] && EVENTS+=("$RESTARTED_AT:restart replica $((REPLICAS - 1))")
plot_report "$T0" "$(date +%s)" "${REPORT_DIR:-$RUN/report}" "$TITLE" "${EVENTS[@]}"
if [ -n "$HOLLOW" ]; then echo "NOTE: HOLLOW AGENTS — operations were simulated (${HOLLOW} s each); no Pulumi ran"; fi
