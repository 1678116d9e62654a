#!/usr/bin/env bash
# Plants each defect of this folder, one at a time, in a scratch copy of
# the tree (the shell, the kernel worker, the transport: never the core,
# which the simulation's own defects cover), builds the release binaries
# from it, and runs the fault campaign on them from seed SEED until a run
# reports a violation (each run stops at the first round that shows one)
# or RUNS seeds passed. The table says which seed
# caught each, after how long, and its first violation (docs/agent.md,
# "The fault campaign"). Needs root.
#
#   tests/defects/run.sh                         # every defect
#   RUNS=5 SEED=100 tests/defects/run.sh 03-gossip-frames-far-ahead-are-refused.patch
#
# A defect the campaign does not catch makes it exit 1. Outside CI: each
# defect is a release build (a few minutes once the dependencies are built
# in target/defects-campaign) and up to RUNS campaigns of SECS seconds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
seed=${SEED:-1}
runs=${RUNS:-3}
secs=${SECS:-300}
target=${CARGO_TARGET_DIR:-$top/target/defects-campaign}
# The campaign itself comes from the tree as it is, not from the scratch
# copy: the defect is in what it tests, never in how.
(cd "$top" && cargo build -q -p hostlb-tests --bin hostlb-campaign)
campaign=$top/target/debug/hostlb-campaign
# The dependencies as the tree's own release build left them, if it did:
# only the workspace's crates are built again for each defect.
if [[ ! -d $target/release && -d $top/target/release/deps ]]; then
  mkdir -p "$target" && cp -a "$top/target/release" "$target/"
fi
scratch=$(mktemp -d /tmp/hostlb-defect.XXXXXX)
trap 'git -C "$top" worktree remove --force "$scratch/tree" >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
git -C "$top" worktree add --detach -q "$scratch/tree" HEAD
git -C "$top" diff HEAD -- lbnodeagent api allocator kubectl-hostlb | git -C "$scratch/tree" apply --allow-empty

if (($#)); then
  patches=("$@")
else
  patches=()
  for p in "$here"/*.patch; do patches+=("$(basename "$p")"); done
fi

missed=0
results=()
for name in "${patches[@]}"; do
  git -C "$scratch/tree" checkout -q -- .
  git -C "$top" diff HEAD -- lbnodeagent api allocator kubectl-hostlb | git -C "$scratch/tree" apply --allow-empty
  git -C "$scratch/tree" apply "$here/$name"
  (cd "$scratch/tree" && CARGO_TARGET_DIR=$target cargo build -q --release -p lbnodeagent -p hostlb-allocator -p kubectl-hostlb)
  caught=""
  start=$SECONDS
  for ((s = seed; s < seed + runs; s++)); do
    out=$("$campaign" --bin-dir "$target/release" --seed "$s" --secs "$secs" --stop-early --dir "$scratch/runs/${name%.patch}" 2>&1 || true)
    line=$(grep -m1 '^VIOLATION ' <<<"$out" || true)
    if [[ -n $line ]]; then
      caught="seed $s after $((SECONDS - start)) s: ${line#VIOLATION }"
      break
    fi
  done
  if [[ -z $caught ]]; then
    results+=("$(printf '%-50s NOT caught in seeds %s..%s' "${name%.patch}" "$seed" "$((seed + runs))")")
    missed=1
  else
    results+=("$(printf '%-50s %s' "${name%.patch}" "$caught")")
  fi
  printf '%s\n' "${results[-1]}"
done
printf '\n%s\n' "${results[@]}"
exit "$missed"
