#!/usr/bin/env python3
"""CPU of a 1,000-turn run, LangGraph + SqliteSaver against the release `agent`, in
interleaved pairs (BENCHMARKS.md, "Side by side with LangGraph"): ../shared/bench's
`langgraph_loop.py --steps 1000 --variant sqlite`, then `agent` on `gen_script.py 1000`,
each process's user + system time from `wait4` (microseconds, not /usr/bin/time's
hundredths), a `sync` after each LangGraph run.

    python3 -m venv /tmp/lgvenv
    /tmp/lgvenv/bin/pip install -r ../shared/bench/anchors/requirements.txt
    python3 xtask/pairs.py [PAIRS] [--python /tmp/lgvenv/bin/python]
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "..", "shared", "bench")
AGENT = os.path.join(ROOT, "target", "release", "agent")


def cpu(argv, cwd=None):
    """User + system seconds of one child process."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{argv[:2]} failed")
    return usage.ru_utime + usage.ru_stime


def main():
    args = sys.argv[1:]
    python = "/tmp/lgvenv/bin/python"
    if "--python" in args:
        at = args.index("--python")
        python = args[at + 1]
        del args[at : at + 2]
    pairs = int(args[0]) if args else 5
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "agent-cli"], cwd=ROOT, check=True)
    work = tempfile.mkdtemp()
    try:
        subprocess.run([sys.executable, os.path.join(BENCH, "gen_script.py"), "1000", work],
                       check=True, stdout=subprocess.DEVNULL)
        ratios = []
        for i in range(pairs):
            theirs = cpu([python, "langgraph_loop.py", "--steps", "1000", "--variant", "sqlite"],
                         cwd=os.path.join(BENCH, "anchors"))
            os.sync()
            shutil.rmtree(os.path.join(work, ".agent"), ignore_errors=True)
            ours = cpu([AGENT, "run", "--model", f"script:{work}/script.json", "--workspace", work,
                        "--store", f"{work}/.agent", "--max-steps", "1005", "--max-tool-calls",
                        "1005", "--json", "read the records"])
            ratios.append(theirs / ours)
            print(f"pair {i + 1}: LangGraph {theirs:.2f} s CPU, agent {ours:.3f} s CPU: "
                  f"{theirs / ours:.0f} times less", flush=True)
        print(f"median {statistics.median(ratios):.0f} times less, min {min(ratios):.0f}, "
              f"max {max(ratios):.0f}")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
