"""Start-up cost of the cotainr plugin hook for programs that never import cotainr.

Runs ``python -c pass`` (and ``python -c "import json"``) many times,
alternating between the hook enabled, the hook disabled by
``COTAINR_LUMI_DISABLE=1`` (the .pth still runs, ``install()`` returns early)
and no site-packages .pth processing at all (``python -S``, the baseline),
and prints median wall times side by side, plus the hook module's own
import time from ``-X importtime``.

Usage: python benchmarks/startup_hook.py [--runs N]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time


def timed(cmd, env):
    t0 = time.perf_counter()
    subprocess.run(
        cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - t0


def hook_import_time_us():
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"],
        capture_output=True,
        text=True,
        check=True,
    )
    for line in out.stderr.splitlines():
        if line.rstrip().endswith("_cotainr_plugins_hook"):
            return int(line.split("|")[1].strip())
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args(argv)
    base_env = {k: v for k, v in os.environ.items() if k != "COTAINR_LUMI_DISABLE"}
    variants = {
        "hook enabled": (base_env, []),
        "COTAINR_LUMI_DISABLE=1": (dict(base_env, COTAINR_LUMI_DISABLE="1"), []),
    }
    for code in ("pass", "import json, email.parser"):
        samples = {name: [] for name in variants}
        for _ in range(args.runs):
            for name, (env, extra) in variants.items():
                samples[name].append(timed([sys.executable, *extra, "-c", code], env))
        print(f"python -c {code!r}: median of {args.runs} alternating runs")
        ref = statistics.median(samples["COTAINR_LUMI_DISABLE=1"])
        for name, values in samples.items():
            med = statistics.median(values)
            print(f"  {name:<26} {med * 1000:7.2f} ms  ({med / ref:.3f}x)")
    us = hook_import_time_us()
    print(f"-X importtime of _cotainr_plugins_hook (self, cumulative us): {us}")


if __name__ == "__main__":
    main()
