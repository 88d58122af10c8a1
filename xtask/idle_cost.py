#!/usr/bin/env python3
"""What a flush costs the code that runs after it, on this machine (BENCHMARKS.md, "Side by
side with LangGraph", tenth session). Builds a small C program with gcc and times two
fixed tasks, each right after one of these waits, 3,000 times (p50 and p10, in µs):

- none: back to back;
- flush: a 900-byte `pwrite` and an `fdatasync`, as a durable turn makes, on this disk;
- sleep: a 120 µs `nanosleep`, no I/O at all;
- spin: 130 µs of busy waiting in user space, so the CPU never stops;
- sleep+prefetch: the sleep, then the program's whole code prefetched before the timing
  starts (so that the code's cache lines are not what the task waits for).

The tasks: "code", straight-line calls to 1,024 small functions with two data-dependent
branches each (about 120 KB of code, always taking the same path, like a turn's code);
"data", loads of the 16,384 cache lines of a 1 MiB array in a fixed random order.

A task that takes longer after a flush or a sleep than back to back has lost what the
processor keeps between runs of the same code. No change to `agent` can keep that across
the wait; only less code a turn (or never waiting) makes the loss smaller.

    python3 xtask/idle_cost.py [--rounds N]   (default: 3000)
"""

import os
import random
import shutil
import subprocess
import sys
import tempfile

FUNCTIONS = 1024
ARRAY_KIB = 1024

MAIN = r"""
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
extern char __executable_start[], etext[];
int main(int argc, char **argv) {
  int rounds = atoi(argv[1]);
  const char *file = argv[2];
  size_t lines = (size_t)ARRAY_KIB * 1024 / 64;
  volatile uint64_t *array = aligned_alloc(4096, lines * 64);
  uint32_t *order = malloc(lines * sizeof *order);
  for (size_t i = 0; i < lines; i++) { array[i * 8] = i; order[i] = (uint32_t)i; }
  srand(7);
  for (size_t i = lines - 1; i > 0; i--) {
    size_t j = (size_t)rand() % (i + 1);
    uint32_t t = order[i]; order[i] = order[j]; order[j] = t;
  }
  int fd = open(file, O_RDWR | O_CREAT, 0644);
  if (fd < 0) { perror(file); return 1; }
  char buf[900];
  memset(buf, 'x', sizeof buf);
  const char *waits[] = {"none", "flush", "sleep", "spin", "sleep+prefetch"};
  double *taken = malloc(rounds * sizeof *taken);
  uint64_t x = 1;
  for (int task = 0; task < 2; task++) {
    for (int wait = 0; wait < 5; wait++) {
      for (int r = 0; r < rounds; r++) {
        if (wait == 1) {
          if (pwrite(fd, buf, sizeof buf, 0) < 0 || fdatasync(fd) < 0) { perror(file); return 1; }
        } else if (wait == 2 || wait == 4) {
          struct timespec pause = {0, 120000};
          nanosleep(&pause, 0);
        } else if (wait == 3) {
          double until = now() + 130;
          while (now() < until) {}
        }
        if (wait == 4)
          for (char *p = __executable_start; p < etext; p += 64) __builtin_prefetch(p, 0, 2);
        double start = now();
        if (task == 0) x = run(x);
        else for (size_t i = 0; i < lines; i++) x += array[order[i] * 8];
        taken[r] = now() - start;
      }
      qsort(taken, rounds, sizeof *taken, cmp);
      printf("%s\t%s\t%.1f\t%.1f\n", task == 0 ? "code" : "data", waits[wait],
             taken[rounds / 2], taken[rounds / 10]);
    }
  }
  unlink(file);
  return (int)(x & 0);
}
"""


def program():
    rng = random.Random(1)
    out = ["#define _GNU_SOURCE", "#include <fcntl.h>", "#include <stdint.h>",
           "#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>",
           "#include <time.h>", "#include <unistd.h>",
           f"#define ARRAY_KIB {ARRAY_KIB}", "volatile uint64_t seed = 12345;"]
    for i in range(FUNCTIONS):
        add, xor, mod = rng.randrange(1, 1 << 20), rng.randrange(1, 1 << 20), rng.randrange(3, 17)
        out.append(f"__attribute__((noinline)) static uint64_t f{i}(uint64_t x) {{ "
                   f"uint64_t y = seed; if ((y % {mod}) == 1) x += {add}; else x ^= {xor}; "
                   f"if (y & {1 << (i % 13)}) x *= 3; return x + {i}; }}")
    calls = " ".join(f"x = f{i}(x);" for i in range(FUNCTIONS))
    out.append(f"__attribute__((noinline)) static uint64_t run(uint64_t x) {{ {calls} return x; }}")
    return "\n".join(out) + MAIN


def main():
    rounds = 3000
    if sys.argv[1:2] == ["--rounds"] and len(sys.argv) == 3 and sys.argv[2].isdigit() \
            and int(sys.argv[2]) > 0:
        rounds = int(sys.argv[2])
    elif len(sys.argv) > 1:
        sys.exit("usage: python3 xtask/idle_cost.py [--rounds N], N a whole number above 0")
    if not shutil.which("gcc"):
        sys.exit("idle_cost.py needs gcc")
    work = tempfile.mkdtemp()
    try:
        source = os.path.join(work, "idle_cost.c")
        with open(source, "w") as f:
            f.write(program())
        binary = os.path.join(work, "idle_cost")
        subprocess.run(["gcc", "-O1", "-o", binary, source], check=True)
        out = subprocess.run([binary, str(rounds), os.path.join(work, "flushed.dat")],
                             check=True, capture_output=True, text=True).stdout
    finally:
        shutil.rmtree(work)
    print(f"{'task':<6}{'after':<16}{'p50 µs':>8}{'p10 µs':>8}")
    for line in out.splitlines():
        task, wait, p50, p10 = line.split("\t")
        print(f"{task:<6}{wait:<16}{p50:>8}{p10:>8}")


if __name__ == "__main__":
    main()
