# The demos' git repository (sourced by scripts/demo.sh and scripts/demo-pod.sh; needs DEMO and GIT_PORT).
#   demo_git_serve ADDR   a bare repository with the `demo` YAML project ("release 1") on branch main,
#                         served by `git daemon` on git://ADDR:$GIT_PORT/demo.git
#   demo_git_push_release_2   a new commit on main ("release 2"); prints its SHA
demo_git_serve() {
  local addr="$1"
  rm -rf "$DEMO/git" "$DEMO/work" && mkdir -p "$DEMO/git" "$DEMO/work/app"
  git init -q --bare "$DEMO/git/demo.git"
  cat > "$DEMO/work/app/Pulumi.yaml" <<'YAML'
name: demo
runtime: yaml
resources:
  release:
    type: command:local:Command
    properties:
      create: echo "release 1"
outputs:
  release: ${release.stdout}
YAML
  git -C "$DEMO/work" init -q -b main && git -C "$DEMO/work" add . && git -C "$DEMO/work" -c user.email=demo@pko -c user.name=demo commit -q -m "release 1"
  git -C "$DEMO/work" push -q "$DEMO/git/demo.git" main
  setsid git daemon --reuseaddr --base-path="$DEMO/git" --export-all --listen="$addr" --port="$GIT_PORT" "$DEMO/git" > "$DEMO/git-daemon.log" 2>&1 < /dev/null &
  echo $! > "$DEMO/git-daemon.pid"
  for _ in $(seq 1 50); do git ls-remote "git://$addr:$GIT_PORT/demo.git" >/dev/null 2>&1 && break; sleep 0.1; done
}

demo_git_push_release_2() {
  sed -i 's/release 1/release 2/' "$DEMO/work/app/Pulumi.yaml"
  git -C "$DEMO/work" -c user.email=demo@pko -c user.name=demo commit -q -am "release 2"
  git -C "$DEMO/work" push -q "$DEMO/git/demo.git" main
  git -C "$DEMO/work" rev-parse HEAD
}

# The aggregated API logs.pulumi.com routed to the operator processes' --logs-api-bind-address on the API
# server's address ($API_IP), ports $2...: a Service without selector in namespace $1, an EndpointSlice per port, the
# APIService (a pod install gets these from the chart). Waits until the API server serves it.
logs_api_route() {
  local ns="$1"; shift
  local slices="" p
  kubectl -n "$ns" delete endpointslices -l kubernetes.io/service-name=pko-logs-api >/dev/null 2>&1 || true
  for p in "$@"; do
    slices="$slices---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: pko-logs-api-$p, namespace: $ns, labels: {kubernetes.io/service-name: pko-logs-api}}
addressType: IPv4
endpoints: [{addresses: [$API_IP], conditions: {ready: true}}]
ports: [{name: https, port: $p, protocol: TCP}]
"
  done
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: pko-logs-api, namespace: $ns}
spec: {ports: [{name: https, port: 443, targetPort: $1}]}
$slices---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1alpha1.logs.pulumi.com}
spec: {group: logs.pulumi.com, version: v1alpha1, insecureSkipTLSVerify: true, groupPriorityMinimum: 1000,
  versionPriority: 100, service: {name: pko-logs-api, namespace: $ns, port: 443}}
YAML
  for _ in $(seq 1 60); do kubectl get --raw /apis/logs.pulumi.com/v1alpha1 >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "the API server does not serve logs.pulumi.com" >&2; return 1
}
