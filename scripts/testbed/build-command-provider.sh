#!/usr/bin/env bash
# Installs the test-bed `command` provider plugin: a Python virtualenv with the PyPI `pulumi` SDK (pinned
# to the CLI's version) and a `pulumi-resource-command` launcher in the bin directory.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/versions.sh"
. "$HERE/lib.sh"
VENV="$TB_HOME/venv-command"
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "pulumi==${PULUMI_VERSION#v}"
# the Kubernetes provider's Python SDK for real Python programs (issue 36): the newest release not newer
# than the bed's provider build (4.25.0-alpha), so Pulumi does not warn of an older plugin on PATH
"$VENV/bin/pip" install -q --disable-pip-version-check "pulumi-kubernetes==${PULUMI_KUBERNETES_PYTHON_VERSION}" "pulumi==${PULUMI_VERSION#v}"
mkdir -p "$TB_HOME/lib"
cp "$HERE/command-provider/pulumi_resource_command.py" "$TB_HOME/lib/"
cat > "$TB_BIN/pulumi-resource-command" <<WRAP
#!/bin/sh
exec "$VENV/bin/python3" -u "$TB_HOME/lib/pulumi_resource_command.py" "\$@"
WRAP
chmod +x "$TB_BIN/pulumi-resource-command"
