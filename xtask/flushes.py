#!/usr/bin/env python3
"""What a durable flush costs on this disk, three ways, interleaved write by write so that
the disk's drift falls on all three alike (BENCHMARKS.md, "Durable commits"):

- a 4 KiB overwrite and `fdatasync` (the fsync p50 of `speed.py`);
- a 610-byte append and `fdatasync`, as sled's log grows by a turn: the file's length
  changes, so the file system must write its metadata too;
- the same append into a stretch zeroed ahead of it, as `vendor/sled` writes its log.

    python3 xtask/flushes.py [WRITES]
"""

import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AHEAD = 32 * 1024


def main():
    writes = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    where = os.path.join(ROOT, "target")
    os.makedirs(where, exist_ok=True)
    files = [tempfile.mkstemp(dir=where) for _ in range(3)]
    (over, _), (append, _), (ahead, _) = files
    block, record = b"x" * 4096, b"y" * 610
    zeroed = 0
    times = ([], [], [])
    try:
        for i in range(writes):
            os.pwrite(over, block, (i % 64) * 4096)
            started = time.perf_counter()
            os.fdatasync(over)
            times[0].append(time.perf_counter() - started)

            at = i * len(record)
            os.pwrite(append, record, at)
            started = time.perf_counter()
            os.fdatasync(append)
            times[1].append(time.perf_counter() - started)

            end = at + len(record)
            if end > zeroed:
                zeroed = (end + AHEAD + 4095) // 4096 * 4096
                os.pwrite(ahead, bytes(zeroed - end), end)
            os.pwrite(ahead, record, at)
            started = time.perf_counter()
            os.fdatasync(ahead)
            times[2].append(time.perf_counter() - started)
    finally:
        for fd, path in files:
            os.close(fd)
            os.unlink(path)
    names = ("4 KiB overwrite", "610 B append", "610 B append, zeroed ahead")
    for name, values in zip(names, times):
        print(f"{name:28} fdatasync p50 {statistics.median(values) * 1e6:5.0f} µs")


if __name__ == "__main__":
    main()
