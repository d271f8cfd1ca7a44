"""Run every benchmark script in this folder (`make bench`): each `bench_*.py`, in name order.

Each script prints its own short table and writes JSON under benchmarks/out/; append the
numbers worth keeping to benchmarks/RESULTS.md with the date, commit and machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    here = Path(__file__).resolve().parent
    scripts = sorted(here.glob("bench_*.py"))
    if not scripts:
        print("no benchmarks yet")
        return 0
    failed = 0
    for script in scripts:
        print(f"== {script.name}", flush=True)
        failed += subprocess.run([sys.executable, str(script), *sys.argv[1:]], check=False).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
