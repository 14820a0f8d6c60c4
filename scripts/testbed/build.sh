#!/usr/bin/env bash
# Builds the test bed's third-party binaries from the Go module proxy into a versioned cache outside the
# repository. Idempotent: a component whose stamp file exists is skipped. Prints each step with its duration.
#
#   TESTBED_CACHE   cache root (default $HOME/.cache/pko/testbed); binaries land in $TESTBED_CACHE/<stamp>/bin
#   TESTBED_ONLY    space-separated subset of components to build (default: all)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/versions.sh"
. "$HERE/lib.sh"
mkdir -p "$TB_CACHE_ROOT"; exec 8> "$TB_CACHE_ROOT/.build.lock"; flock 8   # one build at a time per machine

export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
mkdir -p "$TB_BIN" "$TB_SRC" "$TB_STAMPS"

want() { [ -z "${TESTBED_ONLY:-}" ] || [[ " $TESTBED_ONLY " == *" $1 "* ]]; }

k8s_wrapper() { # the wrapper module of k8s.io/kubernetes (its staging modules pinned), in the current dir
  local SV="v0${K8S_VERSION#v1}"
  go mod init pko.testbed/k8s >/dev/null 2>&1
  local KMOD; KMOD="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | jq -r .GoMod)"
  local args=()
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$KMOD"); do
    args+=("-replace=$m=$m@$SV")
  done
  go mod edit "${args[@]}"
  go mod edit -go="$(awk '$1=="go"{print $2; exit}' "$KMOD")"
  # copy single-line and block godebug settings so the binaries keep k8s' GODEBUG defaults
  awk '/^godebug \(/{b=1;next} b&&/^\)/{b=0} b{print $1} /^godebug [^(]/{print $2}' "$KMOD" | while read -r kv; do
    [ -n "$kv" ] && go mod edit -godebug="$kv"
  done
}

k8s_build() { # k8s_build CMD... : builds k8s.io/kubernetes/cmd/<CMD> into the bin directory
  local minor P=k8s.io/kubernetes/cmd LDF="-s -w" p c pkgs=()
  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  for c in "$@"; do pkgs+=("$P/$c"); done
  go get "${pkgs[@]/%/@$K8S_VERSION}"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDF="$LDF -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  go build -mod=mod -trimpath -ldflags "$LDF" -o "$TB_BIN/" "${pkgs[@]}"
}

build_k8s() {
  local W="$TB_SRC/k8s-$K8S_VERSION"
  rm -rf "$W"; mkdir -p "$W"; cd "$W"
  k8s_wrapper
  k8s_build kube-apiserver kube-controller-manager kube-scheduler kubectl
}

build_k8s_node() {
  # kubelet and kube-proxy from the same pinned module as the control plane (its wrapper, when present)
  local W="$TB_SRC/k8s-$K8S_VERSION"
  if [ ! -f "$W/go.mod" ]; then mkdir -p "$W"; cd "$W"; k8s_wrapper; fi
  cd "$W"
  k8s_build kubelet kube-proxy
}

build_coredns() {
  # Service names resolve in pods as in a cluster: CoreDNS (its `kubernetes` plugin) on the node's address.
  local W="$TB_SRC/coredns-$COREDNS_VERSION" M
  M="$(go mod download -json "github.com/coredns/coredns@$COREDNS_VERSION" | jq -r .Dir)"
  rm -rf "$W"; cp -r "$M" "$W"; chmod -R u+w "$W"; cd "$W"
  go build -mod=mod -trimpath -ldflags "-s -w" -o "$TB_BIN/coredns" .
}

build_pause() {
  # The pod sandbox image's program (testbed.md §7.2): exits on SIGINT/SIGTERM, reaps children.
  local D="$TB_HOME/share/node"; mkdir -p "$D"
  gcc -static -O2 -o "$D/pause" "$HERE/node/pause.c"
}

build_pulumi() {
  local W="$TB_SRC/pulumi-$PULUMI_VERSION"
  rm -rf "$W"; mkdir -p "$W"; cd "$W"
  go mod init pko.testbed/pulumi >/dev/null 2>&1
  go mod edit -go=1.25.11 \
    -replace=github.com/atotto/clipboard=github.com/tgummerer/clipboard@v0.0.0-20241001131231-d02d263e614e
  # The nodejs/python/go language hosts are separate, untagged modules; the module proxy serves none of
  # their pseudo-versions ("This module version is not available"), so only the CLI is built here.
  go get "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi@$PULUMI_VERSION" "github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION"
  go build -mod=mod -trimpath -tags osusergo,grpcnotrace \
    -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION" -o "$TB_BIN/" \
    github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
}

build_pulumi_yaml() {
  # A wrapper module rather than `go install pkg@version`: the latter reads the module's version list
  # (for deprecation notices), which the module proxy refuses for pulumi modules.
  local W="$TB_SRC/pulumi-yaml-$PULUMI_YAML_VERSION"
  rm -rf "$W"; mkdir -p "$W"; cd "$W"
  go mod init pko.testbed/pulumi-yaml >/dev/null 2>&1
  go get "github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml@$PULUMI_YAML_VERSION"
  go build -mod=mod -trimpath \
    -ldflags "-s -w -X github.com/pulumi/pulumi-yaml/pkg/version.Version=${PULUMI_YAML_VERSION#v}" \
    -o "$TB_BIN/" github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml
}

build_pulumi_nodejs() {
  # The current nodejs language host is an untagged module the proxy does not serve; until v3.68 it lived
  # inside the tagged sdk module. That host runs today's @pulumi/pulumi programs with today's CLI.
  local W="$TB_SRC/pulumi-nodejs-$PULUMI_NODEJS_HOST_SDK"
  rm -rf "$W"; mkdir -p "$W"; cd "$W"
  go mod init pko.testbed/pulumi-nodejs >/dev/null 2>&1
  go get "github.com/pulumi/pulumi/sdk/v3@$PULUMI_NODEJS_HOST_SDK"
  go build -mod=mod -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_NODEJS_HOST_SDK" \
    -o "$TB_BIN/" github.com/pulumi/pulumi/sdk/v3/nodejs/cmd/pulumi-language-nodejs
}

build_pulumi_python() {
  # Like the nodejs host, the python host lived inside the tagged sdk module until v3.68. Next to its
  # binary it needs `pulumi-language-python-exec` (a script of the same module). That host ignores the
  # `virtualenv` runtime option of today's CLI and runs `python` from PATH, so the launcher in bin/ puts
  # the bed's virtualenv (the PyPI `pulumi` SDK of the CLI's version, from the command step) first.
  local W="$TB_SRC/pulumi-nodejs-$PULUMI_NODEJS_HOST_SDK" D="$TB_HOME/lib/python-host"
  [ -d "$W" ] || { mkdir -p "$W"; cd "$W"; go mod init pko.testbed/pulumi-nodejs >/dev/null 2>&1; go get "github.com/pulumi/pulumi/sdk/v3@$PULUMI_NODEJS_HOST_SDK"; }
  cd "$W"; mkdir -p "$D"
  go build -mod=mod -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_NODEJS_HOST_SDK" \
    -o "$D/" github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python
  install -m 0755 "$(go list -mod=mod -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)/python/cmd/pulumi-language-python-exec" "$D/"
  cat > "$TB_BIN/pulumi-language-python" <<WRAP
#!/bin/sh
PATH="$TB_HOME/venv-command/bin:\$PATH" exec "$D/pulumi-language-python" "\$@"
WRAP
  chmod +x "$TB_BIN/pulumi-language-python"
  # Python dynamic providers (`pulumi.dynamic`) run as the `pulumi-python` resource plugin: the SDK's
  # own launcher (`sdk/python/dist/pulumi-resource-pulumi-python`) is `python -m pulumi.dynamic`; ours
  # runs it from the bed's virtualenv. The drift-detection tests change such a resource behind Pulumi's back.
  cat > "$TB_BIN/pulumi-resource-pulumi-python" <<WRAP
#!/bin/sh
PATH="$TB_HOME/venv-command/bin:\$PATH" exec python3 -u -m pulumi.dynamic "\$@"
WRAP
  chmod +x "$TB_BIN/pulumi-resource-pulumi-python"
}

build_helm() {
  local W="$TB_SRC/helm-$HELM_VERSION"
  rm -rf "$W"; mkdir -p "$W"; cd "$W"
  go mod init pko.testbed/helm >/dev/null 2>&1
  go get "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  go build -mod=mod -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" -o "$TB_BIN/" \
    helm.sh/helm/v3/cmd/helm
}

build_flux_source_controller() {
  # Flux's source-controller, for the Flux source tests. Its go.mod replaces its own `api` module with
  # the nested directory, which a module zip leaves out, so the module is copied and the replacement
  # pointed at the published `api` module of the same version. Its CRDs are kept next to the binary.
  local W="$TB_SRC/source-controller-$FLUX_SOURCE_CONTROLLER_VERSION" D="$TB_HOME/share/flux-source-controller" M
  M="$(go mod download -json "github.com/fluxcd/source-controller@$FLUX_SOURCE_CONTROLLER_VERSION" | jq -r .Dir)"
  rm -rf "$W"; cp -r "$M" "$W"; chmod -R u+w "$W"; cd "$W"
  go mod edit -replace "github.com/fluxcd/source-controller/api=github.com/fluxcd/source-controller/api@$FLUX_SOURCE_CONTROLLER_VERSION"
  go build -mod=mod -trimpath -ldflags "-s -w" -o "$TB_BIN/source-controller" .
  rm -rf "$D"; mkdir -p "$D/crds"; cp config/crd/bases/*.yaml "$D/crds/"
}

build_pulumi_kubernetes() {
  # The real Kubernetes provider, an ambient plugin on PATH (no program downloads it). Its module carries
  # schema.json and terraform-mapping.json but not the *-embed.json files main.go embeds: the module's own
  # generate.go writes them (it needs VERSION). Its go.mod replaces sdk/v4 with ../sdk, which a module zip
  # leaves out: the writable copy drops the replacement and builds against the sdk/v4 it requires (served).
  local W="$TB_SRC/pulumi-kubernetes-$PULUMI_KUBERNETES_MODULE_VERSION" M
  M="$(go mod download -json "github.com/pulumi/pulumi-kubernetes/provider/v4@$PULUMI_KUBERNETES_MODULE_VERSION" | jq -r .Dir)"
  rm -rf "$W"; cp -r "$M" "$W"; chmod -R u+w "$W"; cd "$W"
  go mod edit -dropreplace=github.com/pulumi/pulumi-kubernetes/sdk/v4
  cd cmd/pulumi-resource-kubernetes
  VERSION="$PULUMI_KUBERNETES_VERSION" go run -mod=mod ./generate.go
  go build -mod=mod -trimpath \
    -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$PULUMI_KUBERNETES_VERSION" \
    -o "$TB_BIN/" .
}

build_pulumi_go() {
  # The Go language host, like the nodejs and python hosts, from the last sdk release that holds it inside
  # the tagged sdk module (v3.66; later releases moved it to an untagged module the proxy does not serve).
  # Go programs build with the bed's own Go toolchain. The step also builds the tests' Go program
  # (programs/go-kubernetes: pulumi sdk/v3, pulumi-kubernetes sdk/v4) once, so that the Go module and
  # build caches hold what its `go build` needs and a test's build reads only the caches.
  local W="$TB_SRC/pulumi-go-$PULUMI_GO_HOST_SDK" P="$TB_SRC/go-kubernetes"
  rm -rf "$W"; mkdir -p "$W"; cd "$W"
  go mod init pko.testbed/pulumi-go >/dev/null 2>&1
  go get "github.com/pulumi/pulumi/sdk/v3@$PULUMI_GO_HOST_SDK"
  go build -mod=mod -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_GO_HOST_SDK" \
    -o "$TB_BIN/" github.com/pulumi/pulumi/sdk/v3/go/pulumi-language-go
  rm -rf "$P"; cp -r "$HERE/programs/go-kubernetes" "$P"; cd "$P"
  go mod download
  # what `pulumi install` runs for a Go program: `go mod tidy` reads the modules of the tests of every
  # package imported (testify, rapid, …), which `go mod download` leaves out; a test's offline install
  # (GOPROXY=off) finds them only if they are cached (a fresh machine had none)
  go mod tidy
  env -u CGO_ENABLED go build -o /dev/null .   # the cgo setting a program build gets by default
}

build_pulumi_command() {
  "$HERE/build-command-provider.sh"
}

step() { # step NAME FUNCTION [STAMP-SUFFIX]
  local name="$1" fn="$2" stamp="$TB_STAMPS/$1${3:+-$3}"
  if ! want "$name"; then return 0; fi
  if [ -f "$stamp" ]; then tb_log "$name: already built ($(cat "$stamp"))"; return 0; fi
  local t0=$SECONDS
  tb_log "$name: building"
  ( "$fn" ) > "$TB_LOGS/build-$name.log" 2>&1 &
  local pid=$! rc=0 n=0
  # a heartbeat every 30 s: a cold build of one component takes up to ten minutes on two cores
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1; n=$((n + 1))
    if [ $((n % 30)) -eq 0 ]; then
      tb_log "$name: still building ($((SECONDS - t0)) s; log $TB_LOGS/build-$name.log: $(tail -1 "$TB_LOGS/build-$name.log" 2>/dev/null | cut -c1-80))"
    fi
  done
  wait "$pid" || rc=$?
  [ "$rc" -eq 0 ] || { tb_log "$name: FAILED after $((SECONDS - t0)) s; log: $TB_LOGS/build-$name.log"; tail -30 "$TB_LOGS/build-$name.log" >&2; exit 1; }
  echo "built in $((SECONDS - t0)) s on $(date -u +%FT%TZ)" > "$stamp"
  tb_log "$name: built in $((SECONDS - t0)) s"
}

mkdir -p "$TB_LOGS"
step k8s build_k8s
step pulumi build_pulumi
step pulumi-yaml build_pulumi_yaml
step pulumi-nodejs build_pulumi_nodejs
# The command provider is our own file: its hash (and its install script's: the venv also holds the
# Kubernetes provider's Python SDK) is part of the stamp so an edit reinstalls it.
step pulumi-command build_pulumi_command "$(cat "$HERE/command-provider/pulumi_resource_command.py" "$HERE/build-command-provider.sh" | sha256sum | cut -c1-12)"
# suffix: the stamp of a bed built before the dynamic-provider launcher was added
step pulumi-python build_pulumi_python dynamic
step helm build_helm "$HELM_VERSION"
# the node (testbed.md §7): kubelet, kube-proxy, CoreDNS and the sandbox's pause program
step k8s-node build_k8s_node
step coredns build_coredns "$COREDNS_VERSION"
step pause build_pause "$(sha256sum "$HERE/node/pause.c" | cut -c1-12)"
step flux-source-controller build_flux_source_controller "$FLUX_SOURCE_CONTROLLER_VERSION"
# the real Kubernetes provider (cold: 17 min on two shared cores, of which 2 min generate.go)
step pulumi-kubernetes build_pulumi_kubernetes "$PULUMI_KUBERNETES_MODULE_VERSION"
# the Go language host and the Go SDKs of the tests' Go programs (cold: module downloads and the
# kubernetes SDK's core and apps packages)
step pulumi-go build_pulumi_go "$PULUMI_GO_HOST_SDK-tidy-$(cat "$HERE"/programs/go-kubernetes/{go.mod,go.sum,main.go} | sha256sum | cut -c1-12)"
tb_log "binaries in $TB_BIN ($(du -sh "$TB_BIN" | cut -f1))"
