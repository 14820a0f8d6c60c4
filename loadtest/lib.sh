# Shared by the load tests (sourced; needs ROOT, NS and fail()): the bed's environment, release
# binaries in BIN (progress shown line by line), delete_namespace, shards_of / shards_held_by, and a per-run Prometheus
# with its plotted report (prom_start, prom_stop, plot_report).
eval "$("$ROOT/scripts/testbed/ensure.sh" 2>/dev/null | grep '^export')"
# PKO_BIN=DIR: binaries built elsewhere (another commit, for a side-by-side run), used as they are
if [ -n "${PKO_BIN:-}" ]; then
  [ -x "$PKO_BIN/pko-operator" ] && [ -x "$PKO_BIN/pko-agent" ] || fail "PKO_BIN=$PKO_BIN has no pko-operator and pko-agent"
  echo "binaries: $PKO_BIN (not built)"
  BIN="$PKO_BIN"
else
  echo "building pko-operator, pko-agent and kubectl-pko (release)…"
  # a failed build fails the run (never a run of binaries left from an earlier build)
  (cd "$ROOT" && cargo build --release -p pko-operator -p pko-agent -p pko-cli 2>&1; echo "cargo-exit=$?") | tee "${TMPDIR:-/tmp}/pko-load-build.log" \
    | { grep --line-buffered -E '^(error|warning: unused)|Compiling |Finished' || true; }
  grep -q '^cargo-exit=0$' "${TMPDIR:-/tmp}/pko-load-build.log" || fail "the release build failed (${TMPDIR:-/tmp}/pko-load-build.log)"
  BIN="$ROOT/target/release"
fi

# the namespace without an operator: release the finalizers only the operator would remove (unfinalize.py:
# merge patches over kept connections; one `kubectl patch` per object went at ~4 objects/s), then delete it
delete_namespace() {
  kubectl get ns $NS >/dev/null 2>&1 || return 0
  python3 "$ROOT/loadtest/unfinalize.py" $NS 16 || echo "unfinalize failed: the namespace may stay Terminating" >&2
  kubectl delete ns $NS "$@" >/dev/null 2>&1 || true
}

# shards_of REPLICA: the numbers of the shards the shard table (fleet `pko` in $NS) gives REPLICA, sorted
shards_of() { python3 "$ROOT/scripts/shard_table.py" holders $NS | awk -v r="$1" '$2 == r {print $1}' | sort; }
# shards_held_by REPLICA: how many
shards_held_by() { shards_of "$1" | wc -l; }

# Prometheus for a run's report (Debian's `prometheus`, a bed package): prom_start DIR PORT TARGET...
# scrapes the replicas' metrics endpoints (host:port) every 2 s into DIR; prom_stop stops it.
prom_start() {
  local dir=$1 port=$2; shift 2
  mkdir -p "$dir"
  { echo "global: {scrape_interval: 2s, evaluation_interval: 2s}"
    echo "scrape_configs:"
    echo "- job_name: pko"
    echo "  static_configs:"
    echo "  - targets: [$(printf '"%s",' "$@" | sed 's/,$//')]"; } > "$dir/prometheus.yml"
  prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
    --web.listen-address="127.0.0.1:$port" > "$dir/prometheus.log" 2>&1 &
  PROM_PID=$!
  PROM_URL="http://127.0.0.1:$port"
  for _ in $(seq 1 30); do curl -sf "$PROM_URL/-/ready" >/dev/null && return 0; sleep 1; done
  fail "prometheus did not start (see $dir/prometheus.log)"
}
prom_stop() { [ -n "${PROM_PID:-}" ] && kill "$PROM_PID" 2>/dev/null || true; }

# plot_report START END OUT TITLE [EVENT_T:LABEL...]: PNG plots and report.md from the run's Prometheus
# (matplotlib in a virtualenv under ~/.cache/pko, made once from PyPI).
plot_report() {
  local venv="${XDG_CACHE_HOME:-$HOME/.cache}/pko/plot-venv"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    echo "making the plotting virtualenv ($venv, matplotlib from PyPI)…"
    python3 -m venv "$venv" && "$venv/bin/pip" install -q matplotlib || { echo "no matplotlib: report skipped" >&2; return 0; }
  fi
  sleep 3   # the last scrape
  "$venv/bin/python" "$ROOT/loadtest/plot.py" "$PROM_URL" "$@"
}

# --- rounds of changes over a fleet (failover.sh, chaos.sh; need NS, N, RUN, T_START, TIMEOUT_S, fail) ---

# traced_manifests CREATE: the Program `traced` (config gen; one resource whose create runs CREATE, a
# shell command of Pulumi YAML, on every change of gen) and N Stacks s001… of it on RUN's file backend
traced_manifests() {
  cat <<YAML
apiVersion: pulumi.com/v1
kind: Program
metadata: {name: traced}
program:
  configuration:
    gen: {type: String, default: "0"}
  resources:
    r:
      type: command:local:Command
      properties:
        create: "$1"
        triggers: ["\${gen}"]
YAML
  for i in $(seq -f '%03g' 1 "$N"); do
    printf -- '---\napiVersion: pulumi.com/v1\nkind: Stack\nmetadata: {name: s%s}\nspec: {stack: s%s, programRef: {name: traced}, backend: "file://%s/state", config: {gen: "0"}, envRefs: {PULUMI_CONFIG_PASSPHRASE: {type: Literal, literal: {value: load}}}}\n' "$i" "$i" "$RUN"
  done
}

# converged GEN: how many Stacks are Ready at their current generation with config gen=GEN
converged() {
  kubectl -n $NS get stacks -o jsonpath='{range .items[*]}{.spec.config.gen} {.metadata.generation} {.status.observedGeneration} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null \
    | awk -v n="$1" '$1 == n && $2 == $3 && $4 == "True"' | wc -l || true
}
# wait_converged GEN: until all N are (progress every 15 s on stderr); prints the seconds it took
wait_converged() {
  local n=$1 t0 last now c
  t0=$(date +%s); last=$t0
  while :; do
    now=$(date +%s); [ $((now - T_START)) -gt "$TIMEOUT_S" ] && fail "not converged on gen=$n after ${TIMEOUT_S} s in all"
    c=$(converged "$n"); [ "$c" -ge "$N" ] && break
    if [ $((now - last)) -ge 15 ]; then last=$now; echo "    gen=$n: $c/$N Ready ($((now - t0)) s)" >&2; fi
    sleep 1
  done
  echo $(( $(date +%s) - t0 ))
}

# watch_leases LOG: every change of a shard's holder in the shard table of NS from now on, stamped as it
# arrives, as `<time> pko-shard-<k> <holder>` lines into LOG; its pid in WATCHER (stop: pkill -P $WATCHER)
watch_leases() {
  ( kubectl -n $NS get leases -l pulumi.com/lease=table -w -o jsonpath='{.metadata.annotations.pulumi\.com/shard-table}{"\n"}' 2>/dev/null \
      | python3 -u "$ROOT/scripts/shard_table.py" stamp > "$1" ) 2>/dev/null &
  WATCHER=$!
  disown $WATCHER
  # the watch's initial list must be in before the fault: on a loaded bed kubectl took up to 6 s to list, and
  # a SIGTERM handoff (done within that) was then stamped at the list's arrival
  for _ in $(seq 1 300); do [ -s "$1" ] && break; sleep 0.1; done
}
# moved_after T LOG VICTIM SHARD...: seconds from T until the last of these shards was seen (in LOG) held
# by another replica than VICTIM; `?` while one was not
moved_after() {
  local t=$1 log=$2 victim=$3; shift 3
  printf 'pko-shard-%s\n' "$@" | awk -v t="$t" -v v="$victim" '
    NR == FNR { want[$1] = 1; n++; next }
    $1 > t && ($2 in want) && $3 != v && $3 != "" && !($2 in seen) { seen[$2] = $1; if ($1 - t > max) max = $1 - t; got++ }
    END { if (got < n) print "?"; else printf "%.1f", max }' - "$log"
}
