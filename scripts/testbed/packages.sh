#!/usr/bin/env bash
# Installs the Debian packages the test bed needs, without starting their daemons. Idempotent.
set -euo pipefail
PKGS=(etcd-server etcd-client redis-server prometheus openssl git jq iproute2 util-linux curl ca-certificates openssh-server openssh-client
  # the node (testbed.md §7) and the images built without a container engine (`make images`)
  containerd runc containernetworking-plugins iptables conntrack umoci mmdebstrap tini gcc libc6-dev)
# TESTBED_PACKAGES=minimal (`make demo`): the control plane, Redis and git only
[ "${TESTBED_PACKAGES:-}" = minimal ] && PKGS=(etcd-server etcd-client redis-server openssl git jq iproute2 util-linux curl ca-certificates)
missing=()
for p in "${PKGS[@]}"; do [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "[testbed] installing ${missing[*]}" >&2
# postinst scripts of etcd-server, redis-server and containerd would start daemons on the default ports: block that.
printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null; $SUDO chmod +x /usr/sbin/policy-rc.d
trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
