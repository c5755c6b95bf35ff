"""Time `--engine` against no engine, whole process: docs/benchmarks.md, "`--engine` at interactive speed".

Usage: `python -m tools.bench_engine [--runs N] [--cold-runs N] [--tpplan DIR]`. Each command runs as
`python -m tpplan ... --json -` in a new process started in DIR (default this checkout; `-m` puts the
working folder first on the path), its wall time and CPU time (user+sys of the child and what it
waited for) taken from `os.wait4`. Three cases:
- warm: the AIC answer cache holds every answer (one unmeasured run first); runs interleaved with the
  same command without `--engine`, which is the yardstick (issue 34: audit under 1 s, search within 1.5x);
- new question: the cache holds the tables' axes and listing but not this model's answers (a model
  never asked before on a database already used: the first `--engine` run of a new model);
- cold: an empty cache (the first `--engine` run on a machine).
Prints one line per case and command: each run's wall time, the median wall and median CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEEPSEEK = "--model deepseek-v3 --topology h200x8-ib400 --nodes 1 -w prompt16k-c8"
AUDIT, SEARCH = f"audit {DEEPSEEK}", f"search {DEEPSEEK}"
NEW_MODEL = "audit --model kimi-k2 --topology h200x8-ib400 --nodes 1 -w prompt16k-c8"  # after deepseek-v3
ENGINE = " --engine sglang"


def timed(command: str, tpplan: Path, cache: Path) -> tuple[float, float]:
    """(wall s, CPU s) of `tpplan COMMAND --json -` in a new process."""
    env = {**os.environ, "PYTHONPATH": str(tpplan), "TPPLAN_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    args = [sys.executable, "-m", "tpplan", *command.split(), "--json", "-"]
    start = os.times().elapsed
    child = subprocess.Popen(args, env=env, cwd=tpplan, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"`tpplan {command}` failed")
    return os.times().elapsed - start, usage.ru_utime + usage.ru_stime


def line(case: str, command: str, runs: list[tuple[float, float]]) -> str:
    walls = " ".join(f"{w:.2f}" for w, _ in runs)
    wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
    return f"{case:12s} tpplan {command}: {walls}; median {wall:.2f} s wall, {cpu:.2f} s CPU"


def keep_axes_only(cache: Path) -> None:
    """Drop the answers of the cache's database files, keep the tables' axes (`aic_axes`)."""
    for path in cache.glob("h200_sxm-*.json"):
        data = json.loads(path.read_text())
        data["answers"] = {k: v for k, v in data["answers"].items() if k.startswith("axes:")}
        path.write_text(json.dumps(data))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cold-runs", type=int, default=3)
    ap.add_argument("--tpplan", type=Path, default=ROOT, help="folder holding the tpplan package to time")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpplan-bench-engine-") as scratch:
        warm = Path(scratch) / "warm"
        for command in (AUDIT, SEARCH):
            timed(command + ENGINE, args.tpplan, warm)  # fills the cache
            runs: dict[str, list[tuple[float, float]]] = {command: [], command + ENGINE: []}
            for _ in range(args.runs):
                for c in runs:
                    runs[c].append(timed(c, args.tpplan, warm))
            for c, r in runs.items():
                print(line("warm", c, r), flush=True)
        for case in ("new question", "cold"):
            runs = {NEW_MODEL + ENGINE if case == "new question" else AUDIT + ENGINE: []}
            for i in range(args.cold_runs):
                cache = Path(scratch) / f"{case}-{i}"
                if case == "new question":
                    shutil.copytree(warm, cache)
                    keep_axes_only(cache)
                for c in runs:
                    runs[c].append(timed(c, args.tpplan, cache))
            for c, r in runs.items():
                print(line(case, c, r), flush=True)


if __name__ == "__main__":
    main()
