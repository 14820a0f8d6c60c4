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
