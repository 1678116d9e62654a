#!/usr/bin/env bash
# Plants each defect of this folder, one at a time, in a scratch copy of
# the tree and runs the simulation over the first seeds: each must be
# caught, and the table says by which seed and which property
# (docs/agent.md, "The simulation").
#
#   lbnodeagent/defects/run.sh            # every defect, each over its seeds
#   SEEDS=0..1000 lbnodeagent/defects/run.sh 03-contest-never-settles.patch
#
# A patch may say, above its diff, which seeds it needs (`Seeds: 0..6000`:
# only some clusters can show it; 0..200 otherwise, and SEEDS overrides
# both) and which of the core's tests catch it when no seed of those does
# (`Tests: NAME ...`, each in agent::core::tests, each of which must then
# fail). A defect caught by neither makes it exit 1. Outside CI: each
# defect is a release build of the simulation (about a minute once the
# dependencies are built in target/defects), and a defect caught by tests
# a debug build of the library's tests.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$top/target/defects}
scratch=$(mktemp -d /tmp/hostlb-defect.XXXXXX)
trap 'git -C "$top" worktree remove --force "$scratch/tree" >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
git -C "$top" worktree add --detach -q "$scratch/tree" HEAD
# Uncommitted changes of the core count too: the defects are planted in
# the tree as it is.
git -C "$top" diff HEAD -- lbnodeagent api | git -C "$scratch/tree" apply --allow-empty

if (($#)); then
  patches=("$@")
else
  patches=()
  for p in "$here"/*.patch; do patches+=("$(basename "$p")"); done
fi

missed=0
printf '%-40s %-10s %s\n' defect caught 'violation'
for name in "${patches[@]}"; do
  git -C "$scratch/tree" checkout -q -- .
  git -C "$top" diff HEAD -- lbnodeagent api | git -C "$scratch/tree" apply --allow-empty
  git -C "$scratch/tree" apply "$here/$name"
  (cd "$scratch/tree" && CARGO_TARGET_DIR=$target cargo build -q --release -p lbnodeagent --features sim --bin sim)
  header=$(sed '/^diff --git /,$d' "$here/$name")
  seeds=${SEEDS:-$(sed -n 's/^Seeds: *//p' <<<"$header")}
  seeds=${seeds:-0..200}
  tests=$(sed -n 's/^Tests: *//p' <<<"$header")
  out=$("$target/release/sim" --seeds "$seeds" 2>&1 || true)
  line=$(grep -m1 '^seed [0-9]* .* VIOLATION' <<<"$out" || true)
  if [[ -n $line ]]; then
    seed=$(awk '{print $2}' <<<"$line")
    printf '%-40s %-10s %s\n' "${name%.patch}" "seed $seed" "${line#*VIOLATION }"
    continue
  fi
  failed=() passed=()
  for t in $tests; do
    # Failed as a test, not as a build: its own line says so.
    run=$(cd "$scratch/tree" && CARGO_TARGET_DIR=$target cargo test -p lbnodeagent --lib -- --exact "agent::core::tests::$t" 2>&1 || true)
    if grep -qx "test agent::core::tests::$t \.\.\. FAILED" <<<"$run"; then
      failed+=("$t")
    else
      passed+=("$t")
    fi
  done
  if [[ -n $tests && ${#passed[@]} -eq 0 ]]; then
    printf '%-40s %-10s %s\n' "${name%.patch}" 'tests' "no violation in seeds $seeds; failed: ${failed[*]}"
  else
    printf '%-40s %-10s %s\n' "${name%.patch}" 'NOT' "no violation in seeds $seeds${passed:+; passed: ${passed[*]}}"
    missed=1
  fi
done
exit "$missed"
