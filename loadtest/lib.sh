# Shared by the load tests (sourced; needs ROOT, NS and fail()): the bed's environment, release
# binaries in BIN (progress shown line by line), delete_namespace, shards_of / shards_held_by, and a per-run Prometheus
# with its plotted report (prom_start, prom_stop, plot_report).
eval "$("$ROOT/scripts/testbed/ensure.sh" 2>/dev/null | grep '^export')"
echo "building pko-operator and pko-agent (release)…"
(cd "$ROOT" && cargo build --release -p pko-operator -p pko-agent 2>&1 | grep --line-buffered -E '^(error|warning: unused)|Compiling |Finished' || true)
[ -x "$ROOT/target/release/pko-operator" ] || fail "build failed"
BIN="$ROOT/target/release"

# the namespace without an operator: release the finalizers only the operator would remove (unfinalize.py:
# merge patches over kept connections; one `kubectl patch` per object went at ~4 objects/s), then delete it
delete_namespace() {
  kubectl get ns $NS >/dev/null 2>&1 || return 0
  python3 "$ROOT/loadtest/unfinalize.py" $NS 16 || echo "unfinalize failed: the namespace may stay Terminating" >&2
  kubectl delete ns $NS "$@" >/dev/null 2>&1 || true
}

# shards_of REPLICA: the numbers of the shards whose Leases (fleet in $NS) name REPLICA as holder, sorted
shards_of() { kubectl -n $NS get leases -o jsonpath='{range .items[*]}{.metadata.name} {.spec.holderIdentity}{"\n"}{end}' | awk -v r="$1" '$1 ~ /-shard-/ && $2 == r {sub(/.*-shard-/, "", $1); print $1}' | sort; }
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
