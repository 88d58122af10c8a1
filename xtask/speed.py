#!/usr/bin/env python3
"""The figures of a turn's cost (BENCHMARKS.md, "Side by side with LangGraph"), from the
release `agent` on ../shared/bench's workload: N one-call `read_file` turns, then a final
answer. Run by `cargo xtask bench`, or alone:

    python3 xtask/speed.py [--quick]

Prints, for N = 100, 1,000, 3,000 and 10,000: wall, user and system time, peak resident
memory and store bytes a turn; the marginal wall time a turn from 1,000 to 3,000 turns
against the disk's fsync p50, and (where `perf` may trace) three 3,000-turn runs' period
against the `fdatasync`s each makes; the instructions of a 1,000- and a 3,000-turn run (callgrind:
the whole process, and its main thread, which drives the run and makes the commits) and
the marginal instructions a turn between them; the disk's fsync p50; `agent show` and `agent context`
on the 10,000-turn run; and process start to the first model call on a one-turn run.
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "..", "shared", "bench")
AGENT = os.path.join(ROOT, "target", "release", "agent")


def workload(n, work):
    subprocess.run(
        [sys.executable, os.path.join(BENCH, "gen_script.py"), str(n), work],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def run_args(n, work):
    return [
        "run", "--model", f"script:{work}/script.json", "--workspace", work,
        "--store", f"{work}/.agent", "--max-steps", str(n + 5),
        "--max-tool-calls", str(n + 5), "--json", "read the records",
    ]


def timed(argv):
    """Wall, user and system seconds and peak resident KB of one child process."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            sys.exit(f"{argv[:2]} exited {proc.returncode}: {err.read().decode()[-500:]}")
        return wall, usage.ru_utime, usage.ru_stime, usage.ru_maxrss, out.read()


def store_bytes(path):
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(base, name))
    return total


def callgrind(n):
    """Instructions of a whole run (every thread) and of its main thread, which drives the
    run and makes its commits (the others read files for the tools and write for sled)."""
    work = tempfile.mkdtemp()
    try:
        workload(n, work)
        out = os.path.join(work, "cg.out")
        proc = subprocess.run(
            # `--fair-sched=yes`: valgrind runs one thread at a time, and with its default
            # lock a thread spinning on a lock another holds is counted for as long as
            # the holder waits its turn (sled's I/O thread counted 1 M to 600 M between
            # identical runs); handing turns over in order makes the count repeatable.
            ["valgrind", "--tool=callgrind", "--fair-sched=yes", "--separate-threads=yes",
             f"--callgrind-out-file={out}", AGENT] + run_args(n, work),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True,
        )
        total = int(re.search(rb"Collected : (\d+)", proc.stderr).group(1))
        with open(out + "-01") as main_thread:
            main = int(re.search(r"^summary: (\d+)", main_thread.read(), re.M).group(1))
        return total, main
    finally:
        shutil.rmtree(work)


def command_line(option, default):
    """The number given with `option` (anywhere on the command line, else `default`) and
    the other arguments: the `agent` binaries to measure, or `AGENT` when none is given,
    built first from this tree (whatever an earlier build left there may be another
    version)."""
    args = sys.argv[1:]
    value = default
    if option in args:
        at = args.index(option)
        value = int(args[at + 1])
        del args[at:at + 2]
    if not args:
        build()
    return value, args or [AGENT]


def build():
    """The release `agent` of this tree, at `AGENT`."""
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "agent-cli"], cwd=ROOT,
                   check=True)


def settle():
    """Writes back what earlier steps left dirty (a workload's files just made, a deleted
    store's freed blocks) so that it does not fall on the next measurement: the fsync
    baseline and the runs then see the same quiet disk (`xtask/marginal.py` too)."""
    os.sync()
    time.sleep(1)


def fsync_p50(samples=300):
    """A 4 KiB write and `fdatasync` of the disk the store is on, as the store's bench does."""
    fd, path = tempfile.mkstemp()
    try:
        times = []
        block = b"x" * 4096
        for i in range(samples):
            os.pwrite(fd, block, (i % 64) * 4096)
            started = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        os.close(fd)
        os.unlink(path)


def flushes_in_run(n, agent=None):
    """The turn's period (from one flush's return to the next's, a mean) and the run's own
    flushes, from `perf`'s `fdatasync` tracepoints on an n-turn run: their mean and p50, in
    µs, and how many. None where `perf` cannot trace (it needs the tracepoints and the right
    to use them)."""
    if not shutil.which("perf"):
        return None
    work = tempfile.mkdtemp()
    try:
        workload(n, work)
        settle()
        data = os.path.join(work, "perf.data")
        events = "syscalls:sys_enter_fdatasync,syscalls:sys_exit_fdatasync"
        traced = subprocess.run(
            ["perf", "record", "-q", "-e", events, "-o", data, agent or AGENT]
            + run_args(n, work),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if traced.returncode != 0:
            return None
        script = subprocess.run(["perf", "script", "-i", data, "-F", "time,event"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        enters, exits = [], []
        for line in script.stdout.splitlines():
            at, event = line.split()[:2]
            (enters if "enter" in event else exits).append(float(at.rstrip(":")))
        flushes = [(b - a) * 1e6 for a, b in zip(enters, exits)]
        if len(exits) < 2:
            return None
        period = (exits[-1] - exits[0]) * 1e6 / (len(exits) - 1)
        return period, statistics.mean(flushes), statistics.median(flushes), len(flushes)
    finally:
        shutil.rmtree(work)


def start_to_first_call(samples=30):
    """Process start (the spawn included) to the moment the `run_started` event reaches
    us (printed by `--events` once that commit is durable; the model is called right
    after), and the whole one-turn run, in a store that exists; in ms."""
    work = tempfile.mkdtemp()
    try:
        workload(1, work)
        to_start, whole = [], []
        # Runs into a store that exists (the first run of a new store also creates it).
        subprocess.run([AGENT] + run_args(1, work), stdout=subprocess.DEVNULL, check=True)
        # What the longer runs before left to write back is not this start's to wait for.
        settle()
        for _ in range(samples):
            started = time.perf_counter()
            proc = subprocess.Popen(
                [AGENT] + run_args(1, work) + ["--events"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
            for line in proc.stdout:
                if json.loads(line).get("type") == "run_started":
                    to_start.append((time.perf_counter() - started) * 1000)
                    break
            proc.stdout.read()
            if proc.wait() != 0:
                sys.exit("a one-turn run failed")
            whole.append((time.perf_counter() - started) * 1000)
        return to_start, whole
    finally:
        shutil.rmtree(work)


def main():
    quick = "--quick" in sys.argv
    build()
    settle()
    fsyncs = [fsync_p50()]
    print(f"fsync p50 (4 KiB write + fdatasync): {fsyncs[0] * 1e6:.0f} µs")
    sizes = [100, 1000] if quick else [100, 1000, 3000, 10000]
    kept = None
    walls = {}
    for n in sizes:
        work = tempfile.mkdtemp()
        workload(n, work)
        settle()
        wall, user, system, rss, _ = timed([AGENT] + run_args(n, work))
        walls[n] = wall
        settle()
        fsyncs.append(fsync_p50())
        stored = store_bytes(os.path.join(work, ".agent"))
        print(f"N={n}: {wall:.2f} s wall ({wall / n * 1000:.3f} ms a turn), {user:.2f} s "
              f"user, {system:.2f} s system, peak resident {rss / 1024:.1f} MB, store "
              f"{stored / 1024:.0f} KB ({stored / n:.0f} bytes a turn)")
        if kept:
            shutil.rmtree(kept)
        kept = work
    if 1000 in walls and 3000 in walls:
        # A turn without the process's start and end: one `fdatasync` of the run's log.
        marginal = (walls[3000] - walls[1000]) / 2000
        fsync = statistics.median(fsyncs)
        print(f"marginal wall a turn, 1,000 to 3,000 turns: {marginal * 1000:.3f} ms, "
              f"{marginal / fsync:.2f} times the fsync p50 of {fsync * 1e6:.0f} µs (median "
              f"of {len(fsyncs)}, around the runs); 1 fdatasync a turn")
    # Three runs: the disk's pace drifts from one to the next.
    in_runs = [] if quick else [flushes_in_run(3000) for _ in range(3)]
    for in_run in filter(None, in_runs):
        period, flush, flush_p50, count = in_run
        print(f"in a 3,000-turn run under perf: a turn every {period:.0f} µs (mean), its "
              f"fdatasync mean {flush:.0f} µs, p50 {flush_p50:.0f} µs ({count} flushes): "
              f"{period / flush:.2f} times their mean, {period / flush_p50:.2f} times their "
              f"p50")
    if not quick and kept:
        runs = json.loads(subprocess.run(
            [AGENT, "runs", "--store", f"{kept}/.agent", "--json"],
            stdout=subprocess.PIPE, check=True).stdout)
        run_id = runs[0]["run_id"]
        for what in ("show", "context"):
            walls = [timed([AGENT, what, run_id, "--store", f"{kept}/.agent"])[0]
                     for _ in range(3)]
            print(f"agent {what} on the 10,000-turn run: {statistics.median(walls) * 1000:.0f} "
                  f"ms (median of 3)")
    if kept:
        shutil.rmtree(kept)
    to_start, whole = start_to_first_call()
    print(f"process start to the first model call: p50 {statistics.median(to_start):.1f} ms, "
          f"min {min(to_start):.1f} ms; whole one-turn run p50 "
          f"{statistics.median(whole):.1f} ms ({len(whole)} runs)")
    if shutil.which("valgrind") and not quick:
        (small, small_main), (big, big_main) = callgrind(1000), callgrind(3000)
        print(f"instructions, whole process: N=1000 {small / 1e6:.1f} M ({small // 1000} a "
              f"turn), N=3000 {big / 1e6:.1f} M; marginal {(big - small) // 2000} a turn")
        print(f"instructions, main thread (drives the run, makes the commits): N=1000 "
              f"{small_main / 1e6:.1f} M, N=3000 {big_main / 1e6:.1f} M; marginal "
              f"{(big_main - small_main) // 2000} a turn")


if __name__ == "__main__":
    main()
