#!/usr/bin/env bash
# Imports an image into the node's containerd (namespace k8s.io), without a registry (testbed.md §7.3).
#
#   import-image.sh pause            builds the sandbox image from the bed's static pause program
#   import-image.sh ARCHIVE BASE     imports an OCI archive (umoci layout, tar) as BASE:<its ref name>
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$HERE/versions.sh"
. "$HERE/lib.sh"
. "$HERE/node/env.sh"
CTR=(ctr -a "$NODE_CONTAINERD_SOCK" -n k8s.io)
if [ "$1" = pause ]; then
  if has_image "$PAUSE_IMAGE"; then exit 0; fi
  D="$(mktemp -d)"; trap 'rm -rf "$D"' EXIT
  umoci init --layout "$D/img" && umoci new --image "$D/img:local"
  umoci unpack --image "$D/img:local" "$D/bundle" >/dev/null
  install -m 0755 "$TB_HOME/share/node/pause" "$D/bundle/rootfs/pause"
  umoci repack --image "$D/img:local" "$D/bundle"
  umoci config --image "$D/img:local" --config.entrypoint /pause --config.user 65535:65535
  tar -C "$D/img" -cf "$D/pause.tar" .
  "${CTR[@]}" images import --base-name "${PAUSE_IMAGE%:*}" "$D/pause.tar" >/dev/null
else
  "${CTR[@]}" images import --base-name "$2" "$1" >/dev/null
fi
