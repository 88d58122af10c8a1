#!/usr/bin/env python3
"""Peak resident memory of 100-, 3,000- and 10,000-turn runs of ../shared/bench's workload,
for one or more `agent` binaries run in turn, and the medians' ratios to the 100-turn run
(BENCHMARKS.md, "Side by side with LangGraph"). A single run's peak moves by about half a
megabyte with the binary's pages the kernel happens to map (`RssFile`), so each figure
is the median of several runs.

    python3 xtask/rss.py [--rounds N] [AGENT...]   (default: 5, target/release/agent)
"""

import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import speed  # noqa: E402

TURNS = (100, 3000, 10000)


def main():
    rounds, agents = speed.command_line("--rounds", 5)
    works = {n: tempfile.mkdtemp() for n in TURNS}
    try:
        for n, work in works.items():
            speed.workload(n, work)
        peaks = {(a, n): [] for a in agents for n in TURNS}
        for _ in range(rounds):
            for n, work in works.items():
                for agent in agents:
                    shutil.rmtree(os.path.join(work, ".agent"), ignore_errors=True)
                    peak_kb = speed.timed([agent] + speed.run_args(n, work))[3]
                    peaks[(agent, n)].append(peak_kb / 1024)
        for agent in agents:
            median = {n: statistics.median(peaks[(agent, n)]) for n in TURNS}
            figures = ", ".join(f"{n:,} turns {median[n]:.1f} MB" for n in TURNS)
            print(f"{agent}: peak resident, median of {rounds}: {figures}; 3,000 and "
                  f"10,000 against 100: {median[3000] / median[100]:.2f} and "
                  f"{median[10000] / median[100]:.2f} times")
    finally:
        for work in works.values():
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
