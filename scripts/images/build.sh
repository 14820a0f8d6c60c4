#!/usr/bin/env bash
# `make images`: builds the container images of deploy/images/*.Dockerfile without a container engine or
# registry, from Debian's tools only: mmdebstrap makes the Debian root filesystem the Dockerfile's base
# stands for (cached per package list), umoci lays our files over it as one more layer and writes the OCI
# image (labels, user, entrypoint); the archives land in $TESTBED_CACHE/images/<name>.tar and, when the
# test bed's node runs, are imported into its containerd as docker.io/library/<name>:<version> (what a pod
# naming `<name>:<version>` with pullPolicy IfNotPresent runs). Prints each step with its duration.
#
#   scripts/images/build.sh [IMAGE...]      pko-operator pko-agent pko-workspace (default: all three)
#   PKO_IMAGES_PROFILE=release|dev          the cargo profile of the binaries (default release)
#   PKO_IMAGES_BIN_DIR=DIR                  take pko-operator and pko-agent from DIR, no cargo build (the
#                                           end-to-end tests: cargo holds its lock while they run)
# An image whose inputs (binaries, base, this script) did not change is neither rebuilt nor re-imported.
#
# Needs root (mmdebstrap's root mode, umoci unpack), the bed's Pulumi binaries for pko-workspace (make
# testbed), and the network to Debian's mirror on a cold cache.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TB="$ROOT/scripts/testbed"
. "$TB/versions.sh"; . "$TB/lib.sh"; . "$TB/node/env.sh"
log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
IMAGES=("$@"); [ ${#IMAGES[@]} -gt 0 ] || IMAGES=(pko-operator pko-agent pko-workspace)
PROFILE="${PKO_IMAGES_PROFILE:-release}"
VERSION="$(awk -F'"' '/^version = /{print $2; exit}' "$ROOT/Cargo.toml")"
REVISION="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
git -C "$ROOT" diff --quiet HEAD 2>/dev/null || REVISION="$REVISION-dirty"
SOURCE="$(awk -F'"' '/^repository = /{print $2; exit}' "$ROOT/Cargo.toml")"
OUT="$NODE_IMAGES"; BASES="$TB_CACHE_ROOT/image-bases"; mkdir -p "$OUT" "$BASES"
exec 7> "$TB_CACHE_ROOT/.images.lock"; flock 7
for b in mmdebstrap umoci; do command -v "$b" >/dev/null || { echo "missing $b: run scripts/testbed/packages.sh (make testbed)" >&2; exit 1; }; done
T0=$SECONDS

# The Debian part of each image, as its Dockerfile installs it (slim: no docs, man pages or locales).
base() { # base NAME PACKAGES... -> prints the path of the cached root filesystem tar
  local name="$1"; shift
  local key; key="$(printf '%s\n' bookworm "$@" | sha256sum | cut -c1-12)"
  local tar="$BASES/$name-$key.tar" part="$BASES/partial-$name-$key.tar"   # mmdebstrap picks the format by extension
  if [ ! -f "$tar" ]; then
    rm -rf "$part"
    local t=$SECONDS
    log "$name base: mmdebstrap bookworm minbase + $* (Debian mirror)"
    mmdebstrap --quiet --variant=minbase --include="$(IFS=,; echo "$*")" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
      bookworm "$part" >&2
    mv "$part" "$tar"
    log "$name base: $(du -h "$tar" | cut -f1) in $((SECONDS - t)) s"
  fi
  echo "$tar"
}

# image NAME BASE-TAR USER ENTRYPOINT-JSON... : lays the staged files ($STAGE) over the base as an OCI image
image() {
  local name="$1" basetar="$2" user="$3"; shift 3
  local W; W="$(mktemp -d)"
  umoci init --layout "$W/img" && umoci new --image "$W/img:$VERSION"
  umoci unpack --image "$W/img:$VERSION" "$W/bundle" >/dev/null
  tar -C "$W/bundle/rootfs" -xf "$basetar"
  cp -a "$STAGE/." "$W/bundle/rootfs/"
  umoci repack --image "$W/img:$VERSION" "$W/bundle"
  local cfg=(--config.user "$user" --author "pko-rs"
    --config.label "org.opencontainers.image.title=$name" --config.label "org.opencontainers.image.version=$VERSION"
    --config.label "org.opencontainers.image.revision=$REVISION" --config.label "org.opencontainers.image.source=$SOURCE"
    --config.label "org.opencontainers.image.licenses=Apache-2.0")
  local a; for a in "$@"; do cfg+=("$a"); done
  umoci config --image "$W/img:$VERSION" "${cfg[@]}"
  umoci gc --layout "$W/img"
  tar -C "$W/img" -cf "$OUT/$name.tar.part" . && mv "$OUT/$name.tar.part" "$OUT/$name.tar"
  rm -rf "$W"
}

passwd() { # passwd UID NAME HOME: an /etc/passwd and /etc/group entry in the stage (appended at build)
  mkdir -p "$STAGE/etc" "$STAGE$3"
  cp "$ROOTFS_ETC/passwd" "$ROOTFS_ETC/group" "$STAGE/etc/"
  echo "$2:x:$1:$1:$2:$3:/bin/sh" >> "$STAGE/etc/passwd"; echo "$2:x:$1:" >> "$STAGE/etc/group"
  chown "$1:$1" "$STAGE$3"
}
etc_of() { ROOTFS_ETC="$(mktemp -d)"; tar -C "$ROOTFS_ETC" -xf "$1" --strip-components=2 ./etc/passwd ./etc/group; }

# --- the binaries ---
if [ -n "${PKO_IMAGES_BIN_DIR:-}" ]; then
  BIN_DIR="$PKO_IMAGES_BIN_DIR"
else
  TARGET_DIR="$(cargo metadata --format-version 1 --no-deps --manifest-path "$ROOT/Cargo.toml" | jq -r .target_directory)"
  BIN_DIR="$TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")"
fi
if [ -z "${PKO_IMAGES_BIN_DIR:-}" ] && [[ " ${IMAGES[*]} " == *" pko-operator "* || " ${IMAGES[*]} " == *" pko-agent "* ]]; then
  t=$SECONDS; log "cargo build --profile $PROFILE (pko-operator, pko-agent)"
  cargo build --manifest-path "$ROOT/Cargo.toml" --profile "$PROFILE" -p pko-operator -p pko-agent --bins
  log "binaries in $((SECONDS - t)) s"
fi

inputs() { # the hash of what image $1 is made of
  case "$1" in
    pko-operator|pko-agent) sha256sum "$BIN_DIR/$1" "$0" ;;
    pko-workspace) sha256sum "$TB_BIN"/pulumi* "$TB/command-provider/pulumi_resource_command.py" "$0" "$(go env GOROOT)/VERSION" ;;
  esac | awk '{print $1}' | sha256sum | cut -c1-16
}
for name in "${IMAGES[@]}"; do
  t=$SECONDS; key="$(inputs "$name")"
  if [ -f "$OUT/$name.tar" ] && [ "$(cat "$OUT/$name.inputs" 2>/dev/null)" = "$key" ]; then
    log "$name:$VERSION: unchanged ($OUT/$name.tar)"
  else
  STAGE="$(mktemp -d)"
  case "$name" in
    pko-operator|pko-agent)
      # git and ssh: the operator resolves git sources; tini as PID 1 (PKO's images do the same)
      B="$(base runtime ca-certificates git openssh-client tini)"; etc_of "$B"
      passwd 65532 nonroot /home/nonroot
      install -m 0755 "$BIN_DIR/$name" "$STAGE/$name"
      ln -s /usr/bin/tini-static "$STAGE/tini"
      # the agent image's /tini is copied into workspace pods (cp follows the link): the static one
      [ "$name" = pko-agent ] && { rm "$STAGE/tini"; tar -C "$STAGE" -xf "$B" --strip-components=3 ./usr/bin/tini-static; mv "$STAGE/tini-static" "$STAGE/tini"; }
      args=(--config.entrypoint /tini --config.entrypoint -- --config.entrypoint "/$name")
      [ "$name" = pko-operator ] && args+=(--config.cmd run)
      image "$name" "$B" 65532:65532 "${args[@]}" --config.workingdir /home/nonroot --config.env HOME=/home/nonroot
      ;;
    pko-workspace)
      # the role of pulumi/pulumi:latest-nonroot in PKO: the CLI, language hosts, runtimes, a provider
      for b in pulumi pulumi-language-yaml pulumi-language-nodejs pulumi-language-go pulumi-resource-kubernetes; do
        [ -x "$TB_BIN/$b" ] || { echo "missing $TB_BIN/$b: make testbed builds it" >&2; exit 1; }
      done
      B="$(base workspace ca-certificates git openssh-client tini nodejs npm python3 python3-venv)"; etc_of "$B"
      passwd 1000 pulumi /home/pulumi
      P="$STAGE/opt/pulumi"; mkdir -p "$P/bin" "$P/lib"
      install -m 0755 "$TB_BIN/pulumi" "$TB_BIN/pulumi-language-yaml" "$TB_BIN/pulumi-language-nodejs" "$P/bin/"
      # the real Kubernetes provider, an ambient plugin on PATH (PKO's image downloads it on first use;
      # the bed is offline); the virtualenv below holds its Python SDK
      install -m 0755 "$TB_BIN/pulumi-resource-kubernetes" "$P/bin/"
      # Go, as PKO's image carries it: the language host and the bed's own Go toolchain (no C compiler:
      # cgo off); a Go program's modules come from the module proxy or, offline, a mounted module cache
      install -m 0755 "$TB_BIN/pulumi-language-go" "$P/bin/"
      mkdir -p "$STAGE/usr/local"; cp -a "$(go env GOROOT)" "$STAGE/usr/local/go"
      install -m 0755 "$TB_HOME/lib/python-host/pulumi-language-python" "$TB_HOME/lib/python-host/pulumi-language-python-exec" "$P/bin/"
      # the Python SDK (the CLI's version) in a virtualenv first on PATH: the python host, the command
      # provider and dynamic providers run from it (the Dockerfile: pip install pulumi==<version>)
      SP="$(ls -d "$TB_HOME"/venv-command/lib/python3*/site-packages)"
      mkdir -p "$P/venv/lib/$(basename "$(dirname "$SP")")"
      cp -a "$SP" "$P/venv/lib/$(basename "$(dirname "$SP")")/"
      printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n' > "$P/venv/pyvenv.cfg"
      mkdir -p "$P/venv/bin"; ln -s /usr/bin/python3 "$P/venv/bin/python3"; ln -s python3 "$P/venv/bin/python"
      ln -s lib "$P/venv/lib64"
      install -m 0644 "$TB/command-provider/pulumi_resource_command.py" "$P/lib/"
      printf '#!/bin/sh\nexec /opt/pulumi/venv/bin/python3 -u /opt/pulumi/lib/pulumi_resource_command.py "$@"\n' > "$P/bin/pulumi-resource-command"
      printf '#!/bin/sh\nexec /opt/pulumi/venv/bin/python3 -u -m pulumi.dynamic "$@"\n' > "$P/bin/pulumi-resource-pulumi-python"
      chmod 0755 "$P/bin/pulumi-resource-command" "$P/bin/pulumi-resource-pulumi-python"
      image "$name" "$B" 1000:1000 --config.entrypoint /usr/bin/tini --config.entrypoint -- --config.cmd pulumi \
        --config.workingdir /home/pulumi --config.env HOME=/home/pulumi \
        --config.env PATH=/opt/pulumi/venv/bin:/opt/pulumi/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --config.env PULUMI_SKIP_UPDATE_CHECK=true
      ;;
    *) echo "unknown image $name (pko-operator, pko-agent, pko-workspace)" >&2; exit 2 ;;
  esac
  rm -rf "$STAGE" "$ROOTFS_ETC"
  echo "$key" > "$OUT/$name.inputs"
  log "$name:$VERSION: $(du -h "$OUT/$name.tar" | cut -f1) in $((SECONDS - t)) s ($OUT/$name.tar)"
  fi
  if [ -S "$NODE_CONTAINERD_SOCK" ]; then
    ref="docker.io/library/$name:$VERSION"
    if [ "$(cat "$NODE_STATE/imported-$name" 2>/dev/null)" = "$key" ] \
       && has_image "$ref"; then
      log "$ref: already in the node's containerd"
    else
      t=$SECONDS
      "$TB/node/import-image.sh" "$OUT/$name.tar" "docker.io/library/$name"
      echo "$key" > "$NODE_STATE/imported-$name"
      log "$ref: imported into the node's containerd in $((SECONDS - t)) s"
    fi
  fi
done
log "images done in $((SECONDS - T0)) s"
