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
