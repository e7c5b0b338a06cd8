#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (one at a time, one job), then prints per target the
# executions per second and the coverage (libFuzzer's final `cov` and `ft`). Crashes, OOMs and
# timeouts land in fuzz/artifacts/TARGET/; the corpora grow in fuzz/corpus/TARGET/ (both ignored
# by git), seeded from fuzz/seeds/TARGET/ and the repository's examples and data.
#
#   fuzz/run.sh SECONDS [TARGET...]      needs nightly and `cargo install cargo-fuzz`
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(graph_file checkpoint csv session_ops)

cargo +nightly fuzz build -O >&2
mkdir -p logs
summary=()
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    [ -d "seeds/$t" ] && cp -n seeds/"$t"/* "corpus/$t/" 2>/dev/null || true
    dict=()
    [ -f "$t.dict" ] && dict=("-dict=$t.dict")
    log="logs/$t.log"
    echo "== $t: ${seconds}s" >&2
    if ! cargo +nightly fuzz run -O "$t" "corpus/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 "${dict[@]}" >"$log" 2>&1; then
        status=1
        echo "!! $t found a problem: see fuzz/$log and fuzz/artifacts/$t/" >&2
    fi
    runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
    rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
    last=$(grep -E '#[0-9]+.*(cov|ft):' "$log" | tail -1 || true)
    cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
    took=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | grep -oE '[0-9]+ second' | grep -oE '[0-9]+' | tail -1 || true)
    corpus=$(ls "corpus/$t" | wc -l)
    summary+=("$(printf '%-12s %8ss %12s %10s %8s %8s %8s' "$t" "${took:-?}" "${runs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$corpus")")
done
printf '%-12s %9s %12s %10s %8s %8s %8s\n' target time execs execs/s cov ft corpus
printf '%s\n' "${summary[@]}"
exit $status
