"""What cotainr-lumi costs `cotainr info`: stock cotainr beside cotainr with it.

Runs `cotainr info` from each given environment in turn (alternating, so
that every row sees the same load) and prints the median wall and CPU time
(user + system of the child) of each, and each median against the first
environment's (the baseline: a venv with only cotainr). Issue 39/41: with
cotainr-lumi installed, `cotainr info` costs at most 1.3x stock.

Usage: python benchmarks/info.py --runs 9 NAME=VENV [NAME=VENV ...]
       (the first NAME=VENV is the baseline)
"""

import argparse
import os
import statistics
import subprocess
import time


def timed(command):
    """Wall and CPU seconds of one run of `command`."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{command[0]} info failed")
    return wall, usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("venvs", nargs="+", metavar="NAME=VENV")
    args = parser.parse_args()
    venvs = dict(item.split("=", 1) for item in args.venvs)
    times = {name: [] for name in venvs}
    for _ in range(args.runs):
        for name, venv in venvs.items():
            times[name].append(timed([os.path.join(venv, "bin", "cotainr"), "info"]))
    print(f"cotainr info, medians of {args.runs} (alternating), load {os.getloadavg()}")
    print("| environment | wall | CPU | wall / baseline | CPU / baseline |")
    print("| --- | --- | --- | --- | --- |")
    baseline = None
    for name, runs in times.items():
        wall = statistics.median(run[0] for run in runs)
        cpu = statistics.median(run[1] for run in runs)
        if baseline is None:
            baseline = (wall, cpu)
        print(
            f"| {name} | {wall * 1000:.0f} ms | {cpu * 1000:.0f} ms "
            f"| {wall / baseline[0]:.2f}x | {cpu / baseline[1]:.2f}x |"
        )


if __name__ == "__main__":
    main()
