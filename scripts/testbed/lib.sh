# Shared paths of the test bed (sourced). Everything lives outside the repository.
TB_CACHE_ROOT="${TESTBED_CACHE:-$HOME/.cache/pko/testbed}"
TB_STAMP="$(printf '%s\n' "$K8S_VERSION" "$PULUMI_VERSION" "$PULUMI_YAML_VERSION" "$PULUMI_COMMAND_VERSION" "$PULUMI_NODEJS_HOST_SDK" | sha256sum | cut -c1-12)"
TB_HOME="$TB_CACHE_ROOT/$TB_STAMP"
TB_BIN="$TB_HOME/bin"
TB_SRC="$TB_HOME/src"
TB_STAMPS="$TB_HOME/stamps"
TB_LOGS="$TB_HOME/logs"
# The running control plane: one per machine, under the cache root (not the stamp: a version change must
# still find and stop the old one).
TB_RUN="${TESTBED_RUN:-$TB_CACHE_ROOT/run}"
tb_log() { printf '[testbed %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# tb_start PIDS LOGDIR NAME CMD...: starts CMD as a daemon in its own session, logging to LOGDIR/NAME.log,
# and records "NAME PID" in the file PIDS. 8>&-: it must not inherit the caller's lock (fd 8), which it
# would hold for its whole life.
tb_start() {
  local pids="$1" logs="$2" name="$3"; shift 3
  setsid "$@" > "$logs/$name.log" 2>&1 < /dev/null 8>&- &
  echo "$name $!" >> "$pids"
}
# tb_wait_for WHAT SECONDS LOGDIR CMD...: polls CMD until it succeeds; after SECONDS says what was not
# ready (its logs in LOGDIR) and exits 1.
tb_wait_for() {
  local what="$1" t="$2" logs="$3"; shift 3
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $end ]; then tb_log "$what not ready after $t s; see $logs"; exit 1; fi
    sleep 0.3
  done
}
