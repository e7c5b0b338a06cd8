#!/usr/bin/env bash
# Mutation testing of the engine's heart (docs/mutation-testing.md): cargo-mutants over
# crates/core/src/tape/ and crates/core/src/graph/ (without file/), one file at a time, so that
# each finished file's results are usable while the rest still run. Not in CI: it takes hours.
#
#   bench/mutants.sh                       # the ten files below, most important first
#   bench/mutants.sh tape/sweeps.rs        # chosen files (paths under crates/core/src)
#   MUTANTS_RE='add_into' bench/mutants.sh tape/sweeps.rs   # only the mutants whose name matches
#   bench/mutants.sh --summary             # the table of what has finished, nothing run
#
# The mutants are applied in place to a scratch git worktree at the current commit
# ($MUTANTS_TREE, outside the repository), never to this checkout, which stays free to edit;
# its target directory starts as a copy of this checkout's, so only tapegrad-core and the two
# test binaries of .cargo/mutants.toml rebuild per mutant. Each file's outcome goes to
# $MUTANTS_OUT/<dir>_<file>/mutants.out (caught.txt, missed.txt, unviable.txt, timeout.txt).
# Needs `cargo install cargo-mutants --locked`. Runs at nice 19, one mutant at a time.
set -euo pipefail

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
tree=${MUTANTS_TREE:-/tmp/tapegrad-mutants/tree}
out=${MUTANTS_OUT:-/tmp/tapegrad-mutants/out}
default_files=(
  tape/sweeps.rs tape/steps.rs tape/audit.rs tape/tape.rs tape/node.rs
  graph/backprop.rs graph/saved.rs graph/eval.rs graph/jvp.rs graph/lower.rs graph/record.rs
)

# One row per file run: its mutants, how many were tested (fewer if the run was stopped), caught,
# missed, unviable, timeouts, and the catch rate of the viable ones (caught + timeouts over
# tested - unviable; a timeout is a detected mutant).
summary() {
  local total=(0 0 0 0 0)
  printf '%-20s %7s %7s %6s %6s %8s %8s %7s\n' file of tested caught missed unviable timeouts caught%
  for dir in "$out"/*/mutants.out; do
    [ -f "$dir/outcomes.json" ] || continue
    local name counts
    name=$(basename "$(dirname "$dir")")
    counts=()
    for kind in caught missed unviable timeout; do
      counts+=("$(count "$dir/$kind.txt")")
    done
    local n=$((counts[0] + counts[1] + counts[2] + counts[3])) of
    of=$(grep -o '"genre"' "$dir/mutants.json" 2>/dev/null | wc -l) # one per mutant listed
    printf '%-20s %7s %7d %6d %6d %8d %8d %7s\n' "$name" "$of" "$n" "${counts[@]}" "$(rate "${counts[@]}")"
    total=($((total[0] + n)) $((total[1] + counts[0])) $((total[2] + counts[1]))
      $((total[3] + counts[2])) $((total[4] + counts[3])))
  done
  printf '%-20s %7s %7d %6d %6d %8d %8d %7s\n' total '' "${total[@]}" \
    "$(rate "${total[1]}" "${total[2]}" "${total[3]}" "${total[4]}")"
}

count() { if [ -f "$1" ]; then grep -c . "$1" || true; else echo 0; fi; }

rate() { # caught missed unviable timeout
  local viable=$(($1 + $2 + $4))
  if [ "$viable" -eq 0 ]; then echo -; else awk -v c=$(($1 + $4)) -v v="$viable" 'BEGIN { printf "%.1f", 100 * c / v }'; fi
}

# All in a function, read whole before it runs: editing the script during a run (hours) must not
# change what the running copy does.
main() {
  if [ "${1:-}" = "--summary" ]; then
    summary
    exit 0
  fi
  files=("$@")
  [ ${#files[@]} -gt 0 ] || files=("${default_files[@]}")

  # The scratch tree, at this checkout's commit (commit a new test before running it).
  commit=$(git -C "$repo" rev-parse HEAD)
  if [ ! -e "$tree/.git" ]; then
    mkdir -p "$(dirname "$tree")"
    git -C "$repo" worktree add --detach "$tree" "$commit"
  else
    # --force: a run killed hard may have left a mutated file behind.
    git -C "$tree" checkout --quiet --force --detach "$commit"
  fi
  if [ ! -d "$tree/target" ] && [ -d "$repo/target" ]; then
    cp -a "$repo/target" "$tree/target"
  fi
  mkdir -p "$out"

  # The clean build and test run: they must pass, and their time sets the mutants' timeout.
  cd "$tree"
  nice -n 19 cargo test -p tapegrad-core --test laws --test regressions --no-run
  start=$(date +%s)
  nice -n 19 cargo test -p tapegrad-core --test laws --test regressions >"$out/baseline.log" 2>&1 ||
    { tail -30 "$out/baseline.log"; echo "the clean tests fail: fix them first" >&2; exit 1; }
  clean=$(($(date +%s) - start))
  # Generous, since the machine may be busier during a mutant than during this run.
  timeout=$((clean * 5 > 120 ? clean * 5 : 120))
  echo "clean test run: ${clean} s; timeout per mutant: ${timeout} s (commit ${commit:0:10})"

  for f in "${files[@]}"; do
    name=$(echo "${f%.rs}" | tr / _)
    echo "== crates/core/src/$f -> $out/$name ($(date -u +%H:%M:%S) UTC)"
    # In place, so one mutant at a time (cargo-mutants refuses --jobs there).
    args=(--in-place --package tapegrad-core --file "crates/core/src/$f" --baseline skip --timeout "$timeout" --output "$out/$name")
    [ -z "${MUTANTS_RE:-}" ] || args+=(--re "$MUTANTS_RE")
    # Exit status 2 means missed mutants, 3 timeouts: the summary reports them; go on.
    nice -n 19 cargo mutants "${args[@]}" || true
  done
  summary
}

main "$@"
exit
