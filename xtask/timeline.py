#!/usr/bin/env python3
"""Where a durable turn's time goes between two flushes (BENCHMARKS.md, "Side by side with
LangGraph"): traces every system call of the main thread of an N-turn run of
../shared/bench's workload (`perf record -e raw_syscalls:sys_{enter,exit}`), cuts the
trace into turns at each `fdatasync`, and prints for the most common sequence of calls
each call's median gap before it (user code) and its median duration, in µs. Tracing
adds about a microsecond to each call.

    python3 xtask/timeline.py [--turns N] [AGENT]   (default: 3000, target/release/agent)
"""

import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import speed  # noqa: E402

NAMES = {0: "read", 1: "write", 3: "close", 5: "fstat", 17: "pread64", 18: "pwrite64",
         28: "madvise", 75: "fdatasync", 202: "futex", 232: "epoll_wait", 257: "openat",
         332: "statx", 437: "openat2"}


def main():
    turns, agents = speed.command_line("--turns", 3000)
    agent = agents[0]
    if not shutil.which("perf"):
        sys.exit("timeline.py needs perf (linux-perf) and the right to trace system calls")
    work = tempfile.mkdtemp()
    try:
        speed.workload(turns, work)
        speed.settle()
        data = os.path.join(work, "perf.data")
        traced = subprocess.run(
            ["perf", "record", "-q", "-e", "raw_syscalls:sys_enter,raw_syscalls:sys_exit",
             "-o", data, agent] + speed.run_args(turns, work),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if traced.returncode != 0:
            sys.exit("perf could not trace the run (perf_event_paranoid?)")
        script = subprocess.run(["perf", "script", "-i", data, "-F", "tid,time,event,trace"],
                                capture_output=True, text=True).stdout
    finally:
        shutil.rmtree(work)
    events = []
    for line in script.splitlines():
        m = re.match(r"\s*(\d+)\s+([0-9.]+):\s+(\S+):\s+NR (\d+)", line)
        if m:
            events.append((int(m.group(1)), float(m.group(2)),
                           m.group(3).endswith("enter"), int(m.group(4))))
    main_tid = events[0][0]
    calls, last_exit, entered = [], None, None
    for tid, at, enter, nr in events:
        if tid != main_tid:
            continue
        if enter:
            entered = (at, nr)
        elif entered and entered[1] == nr:
            gap = (entered[0] - last_exit) * 1e6 if last_exit else 0.0
            calls.append((NAMES.get(nr, str(nr)), gap, (at - entered[0]) * 1e6))
            last_exit = at
    cut, current = [], []
    for call in calls:
        current.append(call)
        if call[0] == "fdatasync":
            cut.append(current)
            current = []
    # Leave out the start and the end of the run.
    cut = cut[len(cut) // 10:-5]
    shapes = collections.Counter(tuple(c[0] for c in t) for t in cut)
    if not shapes:
        sys.exit(f"timeline.py: the main thread of {agent} made no fdatasync in {turns} "
                 "turns; is it a build that flushes on another thread?")
    shape, count = shapes.most_common(1)[0]
    chosen = [t for t in cut if tuple(c[0] for c in t) == shape]
    print(f"{count} of {len(cut)} turns make these {len(shape)} calls, in this order:")
    total = 0.0
    for i, name in enumerate(shape):
        gap = statistics.median(t[i][1] for t in chosen)
        took = statistics.median(t[i][2] for t in chosen)
        total += gap + took
        print(f"{i:3} {name:<10} after {gap:6.1f} µs of user code, took {took:6.1f} µs "
              f"(so far {total:6.1f})")
    whole = statistics.median(sum(c[1] + c[2] for c in t) for t in chosen)
    flush = statistics.median(t[-1][2] for t in chosen)
    print(f"a turn: p50 {whole:.1f} µs, its fdatasync p50 {flush:.1f} µs, the rest "
          f"{whole - flush:.1f} µs")


if __name__ == "__main__":
    main()
