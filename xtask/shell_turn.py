#!/usr/bin/env python3
"""What a `shell` call costs end to end (BENCHMARKS.md, "Side by side with LangGraph"): a
script-model run of 100 turns, one `shell` call each (`echo N`), then an answer, by each
`agent` build in turn (A B, then B A), six rounds; prints each build's wall time a turn,
the median and every round.

    python3 xtask/shell_turn.py [--rounds N] [--sandbox] [--in DIR] [AGENT...]
    (default: target/release/agent)

`--sandbox` runs the commands in the sandbox; `--in DIR` makes DIR the workspace (the
store and script stay in a directory of their own; the commands change nothing there).
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

TURNS = 100


def flag(name, takes_value=False):
    """Takes `name` (and its value) off the command line: the value, True, or None."""
    if name not in sys.argv:
        return None
    at = sys.argv.index(name)
    value = sys.argv[at + 1] if takes_value else True
    del sys.argv[at:at + (2 if takes_value else 1)]
    return value


def main():
    sandbox = flag("--sandbox")
    workspace = flag("--in", takes_value=True)
    rounds, agents = speed.command_line("--rounds", 6)
    work = tempfile.mkdtemp()
    extra = ["--sandbox"] if sandbox else []
    try:
        turns = [{"tool_calls": [{"id": f"c{i}", "name": "shell",
                                  "arguments": {"command": f"echo {i}"}}]}
                 for i in range(TURNS)]
        turns.append({"final": "done"})
        script = os.path.join(work, "script.json")
        with open(script, "w") as out:
            json.dump({"turns": turns}, out)
        store = os.path.join(work, ".agent")
        times = {agent: [] for agent in agents}
        for r in range(rounds):
            for agent in agents if r % 2 == 0 else agents[::-1]:
                shutil.rmtree(store, ignore_errors=True)
                speed.settle()
                started = time.perf_counter()
                run = subprocess.run(
                    [agent, "run", "--model", f"script:{script}", "--workspace",
                     workspace or work, "--store", store, "--allow", "shell",
                     "--max-steps", str(TURNS + 5), "--max-tool-calls", str(TURNS + 5),
                     "--json", *extra, "echo"],
                    capture_output=True, check=True)
                wall = time.perf_counter() - started
                reason = json.loads(run.stdout)["reason"]
                if reason != "completed":
                    sys.exit(f"{agent} ended {reason}")
                times[agent].append(wall / TURNS * 1000)
        for agent, values in times.items():
            print(f"{agent}: {statistics.median(values):.2f} ms a `shell` turn, median of "
                  f"{rounds} ({', '.join(f'{v:.2f}' for v in values)})")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
