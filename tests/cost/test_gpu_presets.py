"""GPU models: one TOML per GPU, every one listed by `tpplan gpus`, one per AIConfigurator system,
each figure cited, and GPUs without fp8 tensor cores pricing fp8 GEMMs as bf16 ones (issue 33, item 7)."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import pytest
from cli_helpers import run_cli

from tpplan.cost import topology
from tpplan.cost.gemm import achieved_tflops, gemm_time
from tpplan.cost.sources.aic import aic_available
from tpplan.cost.topology import list_gpus, load_gpu
from tpplan.errors import TpplanError

SHORT_WORKLOAD = str(Path(__file__).parents[1] / "data" / "workload-prompt448-c8.toml")  # inside tiny contexts

GPU_DIR = Path(str(resources.files("tpplan.cost").joinpath("presets", "gpus")))


def _listed(monkeypatch, capsys) -> list[dict[str, object]]:
    code, out, _ = run_cli(monkeypatch, capsys, "gpus", "--json")
    assert code == 0
    return json.loads(out)["gpus"]


def test_every_toml_in_the_folder_loads_and_is_listed(monkeypatch, capsys):
    files = sorted(p.stem for p in GPU_DIR.glob("*.toml"))
    assert files == list_gpus()
    listed = _listed(monkeypatch, capsys)
    assert [g["preset"] for g in listed] == files
    for g in listed:
        gpu = load_gpu(str(g["preset"]))
        assert (g["name"], g["memory_GiB"], g["bf16_tflops"], g["fp8_tflops"]) == (
            gpu.name, gpu.memory_GiB, gpu.bf16_tflops, gpu.fp8_tflops)  # fmt: skip


def test_adding_a_gpu_is_one_toml_file(monkeypatch, capsys, tmp_path):
    """A new file in the presets folder (here a copy of the package's presets with one more) is a
    `--gpu` name, listed by `tpplan gpus` and usable in an audit, with no code change."""
    root = tmp_path / "cost"
    shutil.copytree(Path(str(resources.files("tpplan.cost"))) / "presets", root / "presets")
    new = root / "presets" / "gpus" / "x1-datasheet.toml"
    new.write_text(
        '# A made-up GPU for the test: every figure invented, said so.\nname = "Test X1"\nbf16_tflops = 100.0\n'
        'hbm_TBps = 1.0\nmemory_GiB = 48.0\nsoftware = "datasheet"\n'
    )
    real = resources.files
    monkeypatch.setattr(topology.resources, "files", lambda pkg: root if pkg == "tpplan.cost" else real(pkg))
    assert "x1-datasheet" in list_gpus()
    assert any(g["preset"] == "x1-datasheet" and g["fp8_tflops"] is None for g in _listed(monkeypatch, capsys))
    code, out, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-qwen3", "--tp", "2", "--topology",
                             "h200x8-ib400", "--gpu", "x1-datasheet", "--workload", "prompt16k-c8")  # fmt: skip
    assert code == 0, err
    assert "Predicted on h200x8-ib400+x1-datasheet" in " ".join(out.split())


@pytest.mark.skipif(not aic_available(), reason="needs tpplan[aic] (aiconfigurator-core)")
def test_one_gpu_model_per_aiconfigurator_system():
    """Every system AIConfigurator ships (a system file, tables or not) has a GPU model naming it."""
    import aiconfigurator_core

    systems_dir = Path(aiconfigurator_core.__file__).parent / "systems"
    shipped = {p.stem for p in systems_dir.glob("*.yaml") if (systems_dir / "data" / p.stem).is_dir()}
    modelled = {load_gpu(n).system for n in list_gpus()}
    assert shipped and shipped <= modelled, sorted(shipped - modelled)
    from tpplan.cost.sources.aic import aic_databases

    assert set(aic_databases()) <= modelled  # every system with kernel tables


def test_each_datasheet_preset_cites_its_figures():
    """The comment above the fields names where the figures come from, and each peak is quoted there
    (dense, or the sparse figure it halves)."""
    for path in sorted(GPU_DIR.glob("*-datasheet.toml")):
        text = path.read_text()
        head = "\n".join(line for line in text.splitlines() if line.startswith("#"))
        assert "datasheet" in head.lower() or "specifications" in head.lower(), path.name
        gpu = load_gpu(path.stem)
        for figure in (gpu.bf16_tflops, gpu.hbm_TBps):
            shown = (figure, 2 * figure, figure * 1e3, figure / 1e3, 2 * figure / 1e3)  # dense, sparse, GB/s, PFLOPS
            quoted = {f"{x:g}" for x in shown} | {f"{x:,g}" for x in shown}
            assert any(q in head for q in quoted), (path.name, figure)
        if gpu.fp8_tflops is None:
            assert "fp8" in head.lower(), path.name  # a missing figure is said, not silently left out


def test_a_gpu_without_fp8_prices_fp8_gemms_as_bf16():
    a100 = load_gpu("a100-sxm-datasheet")
    assert a100.fp8_tflops is None and not a100.has_fp8
    assert a100.peak_tflops("fp8") == a100.bf16_tflops == 312.0
    assert achieved_tflops(8192, 7168, 2048, a100, "fp8") == achieved_tflops(8192, 7168, 2048, a100, "bf16")
    # the weights' bytes stay fp8: a memory-bound fp8 GEMM still reads half the bytes
    assert gemm_time(1, 8192, 8192, a100, "fp8") < gemm_time(1, 8192, 8192, a100, "bf16")
    h100 = load_gpu("h100-datasheet")
    assert achieved_tflops(8192, 7168, 2048, h100, "fp8") > achieved_tflops(8192, 7168, 2048, h100, "bf16")


def test_fp8_on_a100_is_priced_not_refused_and_said(monkeypatch, capsys):
    args = ["audit", "--model", "tiny-deepseek-v3", "--tp", "2", "--topology", "h200x8-ib400", "--workload",
            SHORT_WORKLOAD, "--expert-dtype", "fp8"]  # fmt: skip
    code, out, err = run_cli(monkeypatch, capsys, *args, "--gpu", "a100-sxm-datasheet")
    assert code == 0, err
    said = " ".join(out.split())
    assert "TTFT" in said and "fp8: NVIDIA A100 SXM has no fp8 tensor cores" in said and "312 TFLOP/s" in said
    code, out, _ = run_cli(monkeypatch, capsys, *args, "--gpu", "h100-datasheet")
    assert code == 0 and "no fp8 tensor cores" not in out
    code, out, _ = run_cli(monkeypatch, capsys, *args[:-2], "--gpu", "a100-sxm-datasheet")  # nothing asks fp8
    assert code == 0 and "no fp8 tensor cores" not in out


def test_the_fp8_note_follows_what_asks_for_fp8():
    from tpplan.cost.gpu import fp8_fallback_note

    a100, h100 = load_gpu("a100-sxm-datasheet"), load_gpu("h100-datasheet")
    assert fp8_fallback_note(a100, "bf16", None, checkpoint_fp8=True)  # DeepSeek-V3's fp8 checkpoint
    assert fp8_fallback_note(a100, "fp8", None, checkpoint_fp8=False)
    assert fp8_fallback_note(a100, "bf16", None, checkpoint_fp8=False) is None
    assert fp8_fallback_note(h100, "fp8", "fp8", checkpoint_fp8=True) is None


def test_a_gpu_typo_points_to_tpplan_gpus():
    with pytest.raises(TpplanError) as exc:
        load_gpu("a100-sxm-datashet")
    assert "did you mean a100-sxm-datasheet?" in str(exc.value) or "tpplan gpus" in str(exc.value)
    with pytest.raises(TpplanError, match="`tpplan gpus`"):
        load_gpu("zzqqxx")


@pytest.mark.skipif(not aic_available(), reason="needs tpplan[aic] (aiconfigurator-core)")
def test_engine_on_a_gpu_whose_system_has_no_tables_is_one_line(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-qwen3", "--tp", "2", "--topology",
                           "h200x8-ib400", "--gpu", "l4-datasheet", "--engine", "sglang")  # fmt: skip
    assert code == 2 and "no kernel tables" in err and "`tpplan gpus`" in err and len(err.strip().splitlines()) == 1


def test_gpus_table_fits_100_columns(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "gpus")
    assert code == 0
    assert all(len(line) <= 100 for line in out.splitlines())
    for name in list_gpus():
        assert name in out  # whole, not folded
