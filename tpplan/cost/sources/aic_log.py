"""AIConfigurator's log records routed away from stderr, and the low-fidelity fallback tables they name.

AIC logs through `logging.getLogger(__name__)` with no handler of its own, so without one Python's
last-resort handler prints its warnings (e.g. `PerfDatabase._emit_resolver_warnings`' "Loading
low-fidelity fallback rows for <table> from <path>", sdk/perf_database.py in 0.12.0) to stderr in
the middle of tpplan's output. They are routed to the `tpplan.aic` logger at DEBUG (shown only when
a caller configures logging that verbosely); what a user needs to know, that a table tpplan prices
from served fallback rows, the provenance says (`fallback_tables`, `cost.provenance`).
"""

from __future__ import annotations

import logging

AIC_LOGGER = "aiconfigurator_core"
LOW_FIDELITY = "Loading low-fidelity fallback rows"
TABLE_CLASS = {  # AIC's table files the queries below read (`PerfDataFilename` values) -> the band class priced
    "gemm_perf.parquet": "gemm",
    "context_attention_perf.parquet": "attention",
    "context_mla_perf.parquet": "attention",
    "moe_perf.parquet": "moe",
    "nccl_perf.parquet": "collectives",
    "custom_allreduce_perf.parquet": "collectives",
}
_FALLBACKS: dict[str, str] = {}  # AIC table file -> the file it served low-fidelity rows from


class _AicLogRoute(logging.Handler):
    """Re-logs AIC's records at DEBUG on `tpplan.aic` and notes its low-fidelity fallbacks."""

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith(LOW_FIDELITY) and isinstance(record.args, tuple) and len(record.args) >= 2:
            _FALLBACKS.setdefault(str(record.args[0]), str(record.args[1]))
        logging.getLogger("tpplan.aic").debug("%s %s: %s", record.levelname, record.name, record.getMessage())


def route_aic_logging() -> None:
    """Send AIC's log records to `tpplan.aic` at DEBUG instead of stderr (idempotent)."""
    logger = logging.getLogger(AIC_LOGGER)
    if not any(isinstance(h, _AicLogRoute) for h in logger.handlers):
        logger.addHandler(_AicLogRoute())
    logger.propagate = False


def fallback_tables() -> dict[str, str]:
    """The AIC tables tpplan prices from that served low-fidelity fallback rows in this process
    (AIC's words: "framework-implicit and may differ from real backend behavior"), to their files."""
    return {t: f for t, f in _FALLBACKS.items() if t in TABLE_CLASS}


__all__ = ["AIC_LOGGER", "LOW_FIDELITY", "TABLE_CLASS", "fallback_tables", "route_aic_logging"]
