#!/usr/bin/env python3
"""Two `agent` builds' durable turn side by side (BENCHMARKS.md, "Side by side with
LangGraph"): in each round, a 3,000-turn run of ../shared/bench's workload by each build
under `perf` (`speed.flushes_in_run`), A then B in odd rounds and B then A in even ones,
so that the disk's drift within a round falls on both alike. Prints each run's period (a
turn every so many µs) and its `fdatasync`s' p50, then the medians and the paired
difference of the periods, B minus A. Quicker than `marginal.py`, whose separate fsync
measurements drift on a shared disk; 16 rounds take about three minutes.

    python3 xtask/period.py [--rounds N] A B   (default: 16 rounds)
"""

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import speed  # noqa: E402


def main():
    rounds, agents = speed.command_line("--rounds", 16)
    if len(agents) != 2:
        sys.exit("period.py: give two `agent` binaries, A and B")
    runs = {agent: [] for agent in agents}
    for r in range(rounds):
        order = agents if r % 2 == 0 else agents[::-1]
        for agent in order:
            traced = speed.flushes_in_run(3000, agent)
            if traced is None:
                sys.exit("period.py: `perf` cannot trace `fdatasync` on this machine")
            period, _, flush_p50, _ = traced
            runs[agent].append((period, flush_p50))
            print(f"round {r + 1}, {agent}: a turn every {period:.0f} µs, its fdatasync "
                  f"p50 {flush_p50:.0f} µs: {period / flush_p50:.2f} times", flush=True)
    for agent, values in runs.items():
        periods = [p for p, _ in values]
        gaps = [p - f for p, f in values]
        ratios = [p / f for p, f in values]
        print(f"{agent}: median period {statistics.median(periods):.0f} µs, between "
              f"flushes {statistics.median(gaps):.0f} µs, {statistics.median(ratios):.2f} "
              f"times its flushes' p50 (from {min(ratios):.2f} to {max(ratios):.2f})")
    a, b = (runs[agent] for agent in agents)
    differences = [pb - pa for (pa, _), (pb, _) in zip(a, b)]
    faster = sum(d < 0 for d in differences)
    print(f"B - A, paired by round: median {statistics.median(differences):+.1f} µs a turn; "
          f"B faster in {faster} of {len(differences)} rounds")


if __name__ == "__main__":
    main()
