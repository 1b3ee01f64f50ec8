"""Partitioning time against graph size (issue: 10,000 ops in at most 10 s, and 20,000 in at
most 2.5x the time of 10,000). Prints a table of medians over repeated runs."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import byoc  # noqa: E402

from synthetic import random_dag  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000, 20000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        mod = random_dag(size, seed=size)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            partitioned = byoc.partition_for(mod, "reference")
            times.append(time.perf_counter() - start)
        report = byoc.report(partitioned)
        rows.append((size, statistics.median(times), len(report.regions), report.offload_ratio_nodes))
    print(f"{'ops':>7}  {'median s':>9}  {'us/op':>7}  {'regions':>7}  {'offloaded':>9}")
    for size, seconds, regions, ratio in rows:
        print(f"{size:>7}  {seconds:>9.2f}  {seconds / size * 1e6:>7.0f}  {regions:>7}  {ratio:>9.1%}")
    times = dict((size, seconds) for size, seconds, _, _ in rows)
    if 10000 in times and 20000 in times:
        print(f"time(20,000) / time(10,000) = {times[20000] / times[10000]:.2f} (target at most 2.5)")


if __name__ == "__main__":
    main()
