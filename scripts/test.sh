#!/usr/bin/env bash
# `make test`: runs every test of the workspace and ends with one summary line over all test binaries
# ("summary: N passed, N failed"), so the total is visible whatever binary ran last.
set -uo pipefail
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# CI builds once from clean: incremental compilation data would only take disk (GBs for the test binaries)
[ "${CI:-}" = true ] && export CARGO_INCREMENTAL=0
# a full disk fails the build far from its cause: say how much there is before starting
target="$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)"
mkdir -p "$target"
free_gib=$(df -BG --output=avail "$target" | tail -1 | tr -dc 0-9)
echo "disk: ${free_gib} GiB free under $target (measured: a cold build of the tests takes 4.5 GiB, 7.3 with incremental data)"
[ "$free_gib" -lt 10 ] && echo "disk: warning: less than 10 GiB free; the build or the images may run out of space" >&2
# binaries first: tests of one crate start the binaries of another (e.g. pko-agent)
cargo build --workspace --bins 2>&1 | tail -1
# the images of the in-cluster tests, from those binaries, imported into the bed's node (a cold machine:
# a few minutes, with progress); the tests find them unchanged
PKO_IMAGES_BIN_DIR="$target/debug" scripts/images/build.sh
cargo test --workspace "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
passed=$(grep -oE '^test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -oE '; [0-9]+ failed' "$log" | awk '{s+=$2} END {print s+0}')
echo "summary: $passed passed, $failed failed"
exit "$status"
