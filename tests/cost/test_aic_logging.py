"""AIConfigurator's own log records stay off tpplan's stderr; a fallback that matters reaches the provenance.

AIC logs through `logging` with no handler of its own, so Python's last-resort handler would print its
warnings ("Loading low-fidelity fallback rows for ...", `PerfDatabase._emit_resolver_warnings`,
sdk/perf_database.py in aiconfigurator-core 0.12.0) into a command's output."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.cli_helpers import run_cli
from tpplan.cost import provenance as prov
from tpplan.cost.bands import BandPart
from tpplan.cost.sources import aic_log

AIC_LINES = ("low-fidelity", "aiconfigurator", "Loading database")
COMMAND = ("audit", "--model", "qwen3-32b", "--topology", "h200x8-ib400", "--tp", "8", "--plan", "baseline",
           "--engine", "sglang", "--json")  # fmt: skip


def _warn_fallback(table: str) -> None:
    """What AIC's resolver logs for a table it serves low-fidelity rows for (its format and arguments)."""
    logging.getLogger("aiconfigurator_core.sdk.perf_database").warning(
        "Loading low-fidelity fallback rows for %s from %s. Queries returning these rows are framework-implicit "
        "and may differ from real backend behavior.",
        table,
        f"/data/h200_sxm/{table}",
    )


def test_aic_records_go_to_debug_logging_not_stderr(monkeypatch, capfd, caplog) -> None:
    monkeypatch.setattr(aic_log, "_FALLBACKS", {})
    aic_log.route_aic_logging()
    aic_log.route_aic_logging()  # idempotent: one route, not two
    assert sum(isinstance(h, aic_log._AicLogRoute) for h in logging.getLogger(aic_log.AIC_LOGGER).handlers) == 1
    with caplog.at_level(logging.DEBUG, logger="tpplan.aic"):
        _warn_fallback("mla_bmm_perf.parquet")  # a decode table tpplan never prices from
        _warn_fallback("moe_perf.parquet")
    assert capfd.readouterr().err == ""
    routed = [r for r in caplog.records if r.name == "tpplan.aic"]
    assert [r.levelno for r in routed] == [logging.DEBUG, logging.DEBUG]
    assert "moe_perf.parquet" in routed[1].getMessage()
    assert aic_log.fallback_tables() == {"moe_perf.parquet": "/data/h200_sxm/moe_perf.parquet"}


def test_the_provenance_names_a_fallback_table_only_where_it_priced_from_it(monkeypatch) -> None:
    parts = [BandPart("moe", "aic", 0.6, 0.1, ""), BandPart("gemm", "kernel-model", 0.4, 0.05, "")]
    monkeypatch.setattr(aic_log, "_FALLBACKS", {"moe_perf.parquet": "x", "gemm_perf.parquet": "y"})
    note = prov._aic_fallback_note(parts)
    assert "low-fidelity fallback rows" in note and "for moe" in note and "gemm" not in note  # gemm: not AIC's
    monkeypatch.setattr(aic_log, "_FALLBACKS", {"mla_bmm_perf.parquet": "z"})
    assert prov._aic_fallback_note(parts) == ""


def _priced_from_aic(out: str) -> bool:
    parts = json.loads(out)["plans"][0]["prediction"]["provenance"]["parts"]
    return any(p["source"] == "aic" for p in parts)


def test_a_command_pricing_from_aic_prints_no_aic_log_lines(monkeypatch, capsys) -> None:
    pytest.importorskip("aiconfigurator_core")
    code, out, err = run_cli(monkeypatch, capsys, *COMMAND)
    assert code == 0 and _priced_from_aic(out)
    assert not [line for line in err.splitlines() if any(w in line for w in AIC_LINES)], err
    assert "mla_bmm_perf.parquet" in aic_log._FALLBACKS  # AIC did warn (in this process), and it was routed


@pytest.mark.slow
def test_a_fresh_process_pricing_from_aic_prints_no_aic_line() -> None:
    """In a new interpreter AIC's once-per-database warning certainly fires during the command; stderr
    holds none of it (nothing at all but the command's progress lines)."""
    pytest.importorskip("aiconfigurator_core")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "tpplan", *COMMAND], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and _priced_from_aic(run.stdout)
    # Only tpplan's own progress lines, which a run past QUIET_S prints (a cold AIC load on a busy machine).
    assert all(line.startswith("tpplan audit qwen3-32b: ") for line in run.stderr.splitlines()), run.stderr
