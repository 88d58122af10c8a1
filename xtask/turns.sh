#!/usr/bin/env bash
# The side-by-side workload of ../shared/bench (N one-call `read_file` turns, then a final
# answer) through the release `agent` binary: wall and CPU time, peak memory and store
# size; with --callgrind, the instructions of the whole process, and of its main thread,
# which drives the run and makes its commits (xtask/speed.py gives every figure at once).
#
#   xtask/turns.sh N [--callgrind]
set -euo pipefail
n="${1:?usage: xtask/turns.sh N [--callgrind]}"
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$root/../shared/bench/gen_script.py" "$n" "$work"
cargo build -q --release -p agent-cli --manifest-path "$root/Cargo.toml"
agent="$root/target/release/agent"
args=(run --model "script:$work/script.json" --workspace "$work" --store "$work/.agent"
  --max-steps $((n + 5)) --max-tool-calls $((n + 5)) --json "read the records")
if [ "${2:-}" = "--callgrind" ]; then
  # --fair-sched=yes keeps threads spinning on a lock from being counted at random.
  valgrind --tool=callgrind --fair-sched=yes --separate-threads=yes --callgrind-out-file="$work/cg.out" \
    "$agent" "${args[@]}" > /dev/null 2> "$work/cg.err"
  total=$(grep -oE "Collected : [0-9]+" "$work/cg.err" | grep -oE "[0-9]+")
  main=$(grep -E "^summary: " "$work/cg.out-01" | grep -oE "[0-9]+")
  echo "N=$n: $total instructions in all, $((total / n)) per turn; main thread $main"
else
  /usr/bin/time -f "N=$n: %e s wall, %U s user, %S s system, %M KB peak resident" \
    "$agent" "${args[@]}" > /dev/null
  echo "N=$n: store $(du -sk "$work/.agent" | cut -f1) KB"
fi
