# Shared by the load tests (sourced; needs ROOT, NS and fail()): the bed's environment, release
# binaries in BIN (progress shown line by line), and delete_namespace.
eval "$("$ROOT/scripts/testbed/ensure.sh" 2>/dev/null | grep '^export')"
echo "building pko-operator and pko-agent (release)…"
(cd "$ROOT" && cargo build --release -p pko-operator -p pko-agent 2>&1 | grep --line-buffered -E '^(error|warning: unused)|Compiling |Finished' || true)
[ -x "$ROOT/target/release/pko-operator" ] || fail "build failed"
BIN="$ROOT/target/release"

# the namespace without an operator: release the finalizers only the operator would remove, then delete it
delete_namespace() {
  for s in $(kubectl -n $NS get stacks,updates -o name 2>/dev/null); do kubectl -n $NS patch "$s" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1; done
  kubectl delete ns $NS "$@" >/dev/null 2>&1 || true
}
