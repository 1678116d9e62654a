#!/usr/bin/env bash
# Plants each defect of this folder, one at a time, in a scratch copy of
# the tree and runs the simulation over the first seeds: each must be
# caught, and the table says by which seed and which property
# (docs/agent.md, "The simulation").
#
#   lbnodeagent/defects/run.sh            # every defect, seeds 0..200
#   SEEDS=0..1000 lbnodeagent/defects/run.sh 03-contest-never-settles.patch
#
# A defect the simulation does not catch makes it exit 1. Outside CI: each
# defect is a release build of the simulation (about a minute once the
# dependencies are built in target/defects).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
seeds=${SEEDS:-0..200}
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
  out=$("$target/release/sim" --seeds "$seeds" 2>&1 || true)
  line=$(grep -m1 '^seed [0-9]* .* VIOLATION' <<<"$out" || true)
  if [[ -z $line ]]; then
    printf '%-40s %-10s %s\n' "${name%.patch}" 'NOT' "no violation in seeds $seeds"
    missed=1
  else
    seed=$(awk '{print $2}' <<<"$line")
    printf '%-40s %-10s %s\n' "${name%.patch}" "seed $seed" "${line#*VIOLATION }"
  fi
done
exit "$missed"
