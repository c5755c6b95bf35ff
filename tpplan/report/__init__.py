"""The decision memo (`tpplan report`): audit + prediction -> report.md, report.html, PNGs.

Torch-free. `write_report` is the one entry point the CLI uses; the pieces (analysis, memo,
plots, engines, bench results) are importable on their own for tests and notebooks.
"""

from __future__ import annotations

from tpplan.report.writer import write_report

__all__ = ["write_report"]
