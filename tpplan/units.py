"""Unit conversions and their printed forms, one helper each.

The audit and search JSON, the CLI tables and the report's sentences all compute a percent change
and print a byte count the same way, from here (a base module: the planner and the report import it).
"""

from __future__ import annotations

GIB = 2**30  # bytes per GiB


def gib(nbytes: float) -> str:
    """A byte count as the report prints it: "1,234.5 GiB"."""
    return f"{nbytes / GIB:,.1f} GiB"


def pct_change(value: float, base: float) -> float:
    """Percent change from `base` to `value`, 100 (value - base) / base; 0 where `base` is 0."""
    return 0.0 if not base else 100.0 * (value - base) / base


def pct_change_json(value: float, base: float) -> float | None:
    """`pct_change` as the JSON outputs carry it: rounded to 0.01, null where `base` is 0."""
    return None if not base else round(pct_change(value, base), 2)


def signed_pct(pct: float | None, missing: str = "") -> str:
    """A percent change as a table cell or sentence prints it, "+1.2%" (`missing` where there is none)."""
    return missing if pct is None else f"{pct:+.1f}%"
