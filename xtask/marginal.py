#!/usr/bin/env python3
"""The marginal wall time of a durable turn against the disk's fsync p50, for one or more
`agent` binaries, interleaved so that the disk's drift falls on each alike (BENCHMARKS.md,
"Durable commits"): in each round and for each binary, a 1,000-turn and a 3,000-turn run of
../shared/bench's workload, with the fsync p50 measured before, between and after; the
marginal turn is (wall(3,000) - wall(1,000)) / 2,000, without the process's start and end.
Before each run and each fsync measurement the disk is left to settle (`sync`, one
second), so that neither pays for what the other left dirty. Where `perf` may trace, each
round also traces a 3,000-turn run of each binary and prints its period (mean) against
the p50 of its own `fdatasync`s: the same ratio measured in the run, which the disk's drift
between separate measurements does not move.

    python3 xtask/marginal.py [--rounds N] [AGENT...]   (default: target/release/agent)
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import speed  # noqa: E402


def fsync_p50():
    speed.settle()
    return speed.fsync_p50(200)


def wall(agent, n, work):
    subprocess.run(["rm", "-rf", os.path.join(work, ".agent")], check=True)
    speed.settle()
    started = time.perf_counter()
    subprocess.run([agent] + speed.run_args(n, work), stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main():
    rounds, agents = speed.command_line("--rounds", 4)
    works = {n: tempfile.mkdtemp() for n in (1000, 3000)}
    try:
        for n, work in works.items():
            speed.workload(n, work)
        ratios = {a: [] for a in agents}
        in_run = {a: [] for a in agents}
        for r in range(rounds):
            for agent in agents:
                fsyncs = [fsync_p50()]
                small = wall(agent, 1000, works[1000])
                fsyncs.append(fsync_p50())
                big = wall(agent, 3000, works[3000])
                fsyncs.append(fsync_p50())
                marginal = (big - small) / 2000
                fsync = statistics.median(fsyncs)
                ratios[agent].append(marginal / fsync)
                print(f"round {r + 1}, {agent}: {marginal * 1e6:.0f} µs a turn, fsync p50 "
                      f"{fsync * 1e6:.0f} µs: {marginal / fsync:.2f} times", flush=True)
                traced = speed.flushes_in_run(3000, agent)
                if traced:
                    period, _, flush_p50, _ = traced
                    in_run[agent].append(period / flush_p50)
                    print(f"  in a traced 3,000-turn run: a turn every {period:.0f} µs, its "
                          f"fdatasync p50 {flush_p50:.0f} µs: {period / flush_p50:.2f} times",
                          flush=True)
        for agent, values in ratios.items():
            print(f"{agent}: median {statistics.median(values):.2f} times the fsync p50 "
                  f"(from {min(values):.2f} to {max(values):.2f})")
            if in_run[agent]:
                traced = in_run[agent]
                print(f"  in the run: median {statistics.median(traced):.2f} times its own "
                      f"flushes' p50 (from {min(traced):.2f} to {max(traced):.2f})")
    finally:
        for work in works.values():
            subprocess.run(["rm", "-rf", work], check=True)


if __name__ == "__main__":
    main()
