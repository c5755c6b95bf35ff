"""Write the memo's files atomically: all of report.md, report.html and the PNGs, or nothing.

Everything is rendered in memory first, written into a temporary directory next to the target,
then renamed into place. An error at any step removes the temporary directory, so a failed run
never leaves a half-written report (or an empty output directory) behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tpplan.bench_results import BenchResults
from tpplan.cost.topology import Topology
from tpplan.cost.workload import Workload
from tpplan.errors import TpplanError
from tpplan.report.analysis import Analysis, PredictFn, analyse
from tpplan.report.memo import Memo, build_memo


def write_memo(memo: Memo, out: str | Path) -> Path:
    """Put report.md, report.html and the PNGs in `out`, replacing an earlier report there."""
    target = Path(out)
    parent = target.parent if str(target.parent) else Path(".")
    if target.exists() and not target.is_dir():
        raise TpplanError(f"--out {target}", "exists and is not a directory", "pass a directory path")
    if not parent.is_dir():
        raise TpplanError(f"--out {target}", f"parent directory {parent} does not exist", "create it first")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
    old: Path | None = None
    try:
        (tmp / "report.md").write_text(memo.markdown, encoding="utf-8")
        (tmp / "report.html").write_text(memo.html, encoding="utf-8")
        for name, data in memo.pngs.items():
            (tmp / name).write_bytes(data)
        os.chmod(tmp, 0o755)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=parent))
            os.rmdir(old)
            os.rename(target, old)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not target.exists():
            os.rename(old, target)  # put the earlier report back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def write_report(
    model: str,
    topology: Topology,
    workloads: list[Workload],
    out: str | Path,
    *,
    tp: int | None = None,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
    plans: list[str] | None = None,
    bench: BenchResults | None = None,
    predictor: PredictFn | None = None,
    command: str = "",
) -> tuple[Analysis, Path]:
    """Analyse, render and write the memo; returns the analysis and the output directory."""
    analysis = analyse(
        model,
        topology,
        workloads,
        tp=tp,
        dtype=dtype,
        expert_dtype=expert_dtype,
        plans=plans,
        predictor=predictor,
        bench=bench,
    )
    memo = build_memo(analysis, command)
    return analysis, write_memo(memo, out)
