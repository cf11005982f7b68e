"""Run every benchmark in sequence (never two at once: they compete for the same cores and disk).

`python bench/run_all.py [--quick]`; exits non-zero if any benchmark failed to run.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench._common import parse_args

BENCHMARKS = [
    "headline",
    "throughput",
    "fairness",
    "lateness",
    "vs_apscheduler",
    "due_scan",
    "consume",
    "e2e_latency",
    "console",
    "control_reads",
    "audit",
    "observability",
    "postgres",
    "cron",
]


def main() -> None:
    args = parse_args(__doc__ or "")
    here = Path(__file__).resolve().parent
    failed = []
    for name in BENCHMARKS:
        print(f"\n===== {name}{' --quick' if args.quick else ''} =====", flush=True)
        started = time.perf_counter()
        command = [sys.executable, str(here / f"{name}.py"), *(["--quick"] if args.quick else [])]
        code = subprocess.run(command, check=False).returncode
        print(f"({name}: {time.perf_counter() - started:.0f} s, exit {code})", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
