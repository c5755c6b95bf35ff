"""AIC's answers kept on disk (`tpplan.cost.sources.aic_cache`): a later process answers from the
file without loading AIC, a new package version or a broken file starts afresh, writes are atomic,
and forked search workers save what they asked. Only the checks that ask AIC itself need the package."""

from __future__ import annotations

import json
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tpplan.cost.kernel_source import AttentionShape, CollectiveShape, GemmShape, MoeShape
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


# --- the tables' measured axes (aic_axes): kept in the answer file, the same decisions as AIC's views ---

SHAPES = [  # one question of each kind the adapter answers, inside, outside and beyond its tables
    GemmShape(8192, 7168, 2112, "bf16"),
    GemmShape(8192, 7168, 2112, "fp8_block"),
    GemmShape(8192, 7168, 2112, "fp8"),  # a stand-in format
    GemmShape(2**22, 7168, 2112, "bf16"),  # far beyond the measured m: no answer
    AttentionShape(8192, 0, 8, 1, 128, 128),  # GQA
    AttentionShape(8192, 0, 32, 32, 128, 128),  # MHA (AIC's kv-heads key 0)
    AttentionShape(4096, 4096, 16, 2, 128, 128),  # cached context: extrapolated
    AttentionShape(8192, 0, 16, 16, 192, 128, "mla"),
    AttentionShape(8192, 0, 16, 16, 100, 100),  # a head_dim AIC never measured
    MoeShape(8192, 7168, 2048, 256, 8, 8, 1, "fp8_block"),
    MoeShape(8192, 7168, 2048, 256, 8, 8, 1, "bf16"),
    MoeShape(8192, 7168, 2048, 256, 8, 3, 1, "fp8_block"),  # a TP it never measured: no answer
    CollectiveShape("all_reduce", 8 * 2**20, 8, 8),  # the engine's custom all-reduce
    CollectiveShape("all_gather", 8 * 2**20, 4, 4),
    CollectiveShape("reduce_scatter", 2**30, 8, 8),
    CollectiveShape("all_reduce", 8 * 2**20, 16, 8),  # across nodes: no answer
]


def _ask(src: Any, shape: Any) -> Any:
    kind = {GemmShape: "gemm", AttentionShape: "attention", MoeShape: "moe", CollectiveShape: "collective"}
    return getattr(src, kind[type(shape)])(shape)


@pytest.mark.slow
def test_prices_are_the_same_from_aic_from_the_axes_file_and_from_the_answers(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cold (AIC's views read for the axes), then from the file's axes with the engine answering, then
    from the file's answers alone: the same price (or the same absence of one) for every question."""
    pytest.importorskip("aiconfigurator_core")
    from tpplan.cost.sources import aic
    from tpplan.cost.sources.aic_axes import build_axes

    for engine in ("sglang", "trtllm"):
        cold = [_ask(aic.AicSource("h200_sxm", engine), s) for s in SHAPES]
        assert sum(p is None for p in cold) >= 4 and sum(p is not None for p in cold) >= 8, cold
        if engine == "sglang":  # the axes read from the engine's view are those of the op classes' tables
            src = aic.AicSource("h200_sxm", engine)
            for family in ("gemm", "context_attention", "context_mla", "moe", "nccl", "custom_allreduce"):
                assert src._axes(family) == build_axes(family, src.table(family)), family
        forget()
        path = answer_file(f"h200_sxm-{engine}-{aic.default_version('h200_sxm', engine)}").path
        data = json.loads(path.read_text(encoding="utf-8"))
        assert {k for k in data["answers"] if k.startswith("axes:")} == {
            f"axes:{f}" for f in ("gemm", "context_attention", "context_mla", "moe", "nccl", "custom_allreduce")
        }
        data["answers"] = {k: v for k, v in data["answers"].items() if k.startswith("axes:")}
        path.write_text(json.dumps(data), encoding="utf-8")  # the axes alone: the engine answers again
        forget()  # answer_file() above read the whole file into this process

        def no_view(*_args: object) -> None:
            raise AssertionError("AIC's Python view was read although the file holds the table's axes")

        with monkeypatch.context() as m:
            m.setattr(aic.AicSource, "_view", no_view)
            assert [_ask(aic.AicSource("h200_sxm", engine), s) for s in SHAPES] == cold
        forget()

        def no_load(*_args: object) -> None:
            raise AssertionError("the database was loaded for a question the file holds")

        with monkeypatch.context() as m:
            m.setattr(aic, "_load", no_load)
            assert [_ask(aic.AicSource("h200_sxm", engine), s) for s in SHAPES] == cold
        forget()


def test_the_axes_of_a_table_are_its_first_and_last_measured_values() -> None:
    """On a hand-made table in AIC's nested layout: formats by name, ranges per layout, token lists
    shared between MoE configurations, and integral keys found by the shape's integers."""
    from enum import Enum

    from tpplan.cost.sources.aic_axes import axis_key, build_axes, reach

    Quant = Enum("Quant", ["bfloat16", "fp8_block", "half"])
    gemm = build_axes("gemm", {Quant.bfloat16: {64: {512: {256: {}}, 1024: {128: {}}}, 8: {2048: {4096: {}}}}})
    assert gemm == {"bfloat16": [[8, 64], [512, 2048], [128, 4096]]}
    by_heads = {8: {1024: {1: {}, 4: {}}}, 32: {16384: {2: {}}}}
    attention = build_axes("context_attention", {Quant.bfloat16: {Quant.bfloat16: {0: {128: {0: by_heads}}}}})
    axes = attention["layouts"][axis_key(0, 128, 0)]
    assert axes == [[8, 32], [1024, 16384], [1, 4]] and reach(axes, 64, 1024, 1) == 2.0
    tokens = {1: {}, 8192: {}}
    moe = build_axes(
        "moe", {Quant.fp8_block: {"balanced": {8: {256: {7168: {2048: {8.0: {1: tokens}, 4: {2: tokens}}}}}}}}
    )
    assert moe["quants"] == ["fp8_block"] and moe["tokens"] == [[1, 8192]]
    assert moe["configs"] == {
        axis_key("fp8_block", "balanced", 8, 256, 7168, 2048, tp, ep): 0 for tp, ep in [(8, 1), (4, 2)]
    }
    nccl = build_axes("nccl", {Quant.half: {"all_gather": {4: {1: {}, 2**20: {}}}}})
    assert nccl == {"all_gather": {"4": [1, 2**20]}}
    assert build_axes("custom_allreduce", None) == {} and build_axes("nccl", {Quant.bfloat16: {}}) == {}
