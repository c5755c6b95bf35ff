"""Write the memo's files atomically: all of report.md, report.html and the PNGs, or nothing.

Everything is rendered in memory first, then `tpplan.outputs.write_dir` writes it into a temporary
directory next to the target and renames it into place. An error at any step removes the temporary
directory, so a failed run never leaves a half-written report (or an empty output directory)
behind, and a directory tpplan did not write is never replaced.
"""

from __future__ import annotations

from pathlib import Path

from tpplan.cost.topology import Topology
from tpplan.cost.workload import Workload
from tpplan.outputs import write_dir
from tpplan.report.analysis import PredictFn, analyse
from tpplan.report.memo import Memo, build_memo
from tpplan.report.memo_ask import MemoAsk
from tpplan.report.results import Analysis


def write_memo(memo: Memo, out: str | Path) -> Path:
    """Put report.md, report.html and the PNGs in `out`, replacing only an earlier report tpplan wrote.

    A folder that is not empty and was not written by tpplan is refused (`tpplan.outputs.check_dir`).
    """
    files = {"report.md": memo.markdown.encode("utf-8"), "report.html": memo.html.encode("utf-8"), **memo.pngs}
    return write_dir(out, files, "--out")


def write_report(
    model: str,
    topology: Topology,
    workloads: list[Workload],
    out: str | Path,
    ask: MemoAsk | None = None,
    *,
    predictor: PredictFn | None = None,
    command: str = "",
) -> tuple[Analysis, Path]:
    """Analyse (`ask`: the memo's options, `MemoAsk`), render and write the memo; returns the analysis and
    the output directory."""
    analysis = analyse(model, topology, workloads, ask, predictor=predictor)
    memo = build_memo(analysis, command)
    return analysis, write_memo(memo, out)
