"""AIC's answers kept on disk (`tpplan.cost.sources.aic_cache`): a later process answers from the
file without loading AIC, a new package version or a broken file starts afresh, writes are atomic,
and forked search workers save what they asked. Only the checks that ask AIC itself need the package."""

from __future__ import annotations

import json
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tpplan.cost.kernel_source import CollectiveShape
from tpplan.cost.sources import aic_cache
from tpplan.cost.sources.aic_cache import answer_file, forget, save_all


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    forget()
    monkeypatch.setenv(aic_cache.CACHE_ENV, str(tmp_path))
    yield tmp_path
    forget()


def test_an_answer_survives_the_process_and_a_new_package_version_starts_afresh(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer_file("sys-eng-1").put("moe|k", [0.004, "aic:x", False], {"moe_perf.parquet": "fallback.parquet"})
    forget()  # writes the file and drops the process's copy
    again = answer_file("sys-eng-1")
    assert again.get("moe|k") == (True, [0.004, "aic:x", False])
    assert again.fallbacks == {"moe_perf.parquet": "fallback.parquet"}
    assert again.get("gemm|other") == (False, None)
    forget()
    monkeypatch.setattr(aic_cache, "package_version", lambda: "9.9.9")
    fresh = answer_file("sys-eng-1")
    assert fresh.get("moe|k") == (False, None)
    fresh.put("moe|k", None)
    forget()
    names = sorted(p.name for p in cache.iterdir() if p.name != ".lock")
    assert len(names) == 1 and ".aic-9.9.9." in names[0], names  # the old version's file was replaced


def test_a_broken_file_is_ignored_and_rewritten_and_no_temporary_file_is_left(cache: Path) -> None:
    path = answer_file("sys-eng-2").path
    forget()
    path.write_text("{not json", encoding="utf-8")
    f = answer_file("sys-eng-2")
    assert f.get("x") == (False, None)
    f.put("x", [1.0, "aic:y", True])
    save_all()
    assert json.loads(path.read_text(encoding="utf-8"))["answers"] == {"x": [1.0, "aic:y", True]}
    assert sorted(p.name for p in cache.iterdir()) == [".lock", path.name]


def test_an_unwritable_cache_folder_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    forget()
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv(aic_cache.CACHE_ENV, str(blocker / "cache"))
    answer_file("sys-eng-3").put("x", None)
    forget()  # the save fails quietly; the answers are recomputed next time
    assert blocker.read_text(encoding="utf-8") == ""


def _ask_in_worker(key: str) -> None:
    answer_file("sys-eng-4").put(key, [2.0, "aic:w", False])


def test_forked_workers_save_their_answers(cache: Path) -> None:
    with ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as pool:
        list(pool.map(_ask_in_worker, ["a", "b"]))
    forget()
    f = answer_file("sys-eng-4")
    assert f.get("a")[0] and f.get("b")[0]


def test_a_later_process_prices_from_the_file_without_loading_aic(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("aiconfigurator_core")
    from tpplan.cost.sources import aic

    shape = CollectiveShape("all_reduce", 8 * 2**20, 8, 8)
    first = aic.AicSource("h200_sxm", "sglang").collective(shape)
    assert first is not None
    forget()

    def no_load(*_args: object) -> None:
        raise AssertionError("the database was loaded for a question the file holds")

    monkeypatch.setattr(aic, "_load", no_load)
    assert aic.AicSource("h200_sxm", "sglang").collective(shape) == first
