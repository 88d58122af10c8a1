#!/usr/bin/env python3
"""Process start to the first model call, for one or more `agent` binaries run in turn
(BENCHMARKS.md, "Side by side with LangGraph"), so that the host's drift falls on each
alike: `speed.py`'s measure (the spawn included, up to the moment the `run_started` event
reaches us: `--events` prints it once its commit is durable, and the model is called right
after) and the whole one-turn run, in ms, each binary's runs into a store of its own that
exists.

    python3 xtask/startup.py [--runs N] [AGENT...]   (default: target/release/agent)
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import speed  # noqa: E402


def one(agent, work):
    """Start to `run_started`, and start to exit, of one one-turn run; in ms."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [agent] + speed.run_args(1, work) + ["--events"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    first = None
    for line in proc.stdout:
        if json.loads(line).get("type") == "run_started":
            first = (time.perf_counter() - started) * 1000
            break
    proc.stdout.read()
    if proc.wait() != 0 or first is None:
        sys.exit(f"a one-turn run of {agent} failed")
    return first, (time.perf_counter() - started) * 1000


def main():
    runs, agents = speed.command_line("--runs", 40)
    works = {}
    try:
        for agent in agents:
            works[agent] = tempfile.mkdtemp()
            speed.workload(1, works[agent])
            # The store exists before the runs measured (a new store's first run makes it).
            subprocess.run([agent] + speed.run_args(1, works[agent]),
                           stdout=subprocess.DEVNULL, check=True)
        firsts = {agent: [] for agent in agents}
        wholes = {agent: [] for agent in agents}
        for _ in range(runs):
            for agent in agents:
                first, whole = one(agent, works[agent])
                firsts[agent].append(first)
                wholes[agent].append(whole)
        for agent in agents:
            f = sorted(firsts[agent])
            print(f"{agent}: first model call p50 {statistics.median(f):.2f} ms "
                  f"(min {f[0]:.2f}, p90 {f[int(len(f) * 0.9)]:.2f}); whole one-turn run "
                  f"p50 {statistics.median(wholes[agent]):.2f} ms ({runs} runs)")
    finally:
        for work in works.values():
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
