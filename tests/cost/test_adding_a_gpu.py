"""Adding a GPU is one TOML file (issue 30): a made-up chip written to a temp folder is a `--gpu` for
audit and search, by path or, dropped into (a copy of) the presets folder, by name, and its figures
move the prices the way the file says. tests/cost/test_gpu_presets.py holds the listing side."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import pytest
from cli_helpers import run_cli

from tpplan.cost import topology
from tpplan.cost.gemm import gemm_time
from tpplan.cost.topology import list_gpus, load_gpu

H100 = load_gpu("h100-datasheet")
BASE = ["--model", "tiny-qwen3", "--tp", "2", "--topology", "h200x8-ib400"]


def _chip(folder: Path, stem: str, *, hbm: float = 1.0, bf16: float = 1.0, memory_GiB: float = 100.0) -> Path:
    """An H100 datasheet model with its HBM bandwidth and bf16 peak scaled: every figure made up, said so."""
    path = folder / f"{stem}.toml"
    path.write_text(
        f"# A made-up GPU for a test: the H100 datasheet with HBM x{hbm:g} and bf16 x{bf16:g}.\n"
        f'name = "Test {stem}"\nbf16_tflops = {H100.bf16_tflops * bf16}\nhbm_TBps = {H100.hbm_TBps * hbm}\n'
        f'memory_GiB = {memory_GiB}\nsoftware = "datasheet"\n'
    )
    return path


def _json(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = run_cli(monkeypatch, capsys, *args, "--json", "-")
    assert code == 0, err
    return json.loads(out)


def _attention_s(plan: dict) -> float:
    ops = plan["prediction"]["layer_kinds"]["gqa+dense"]["ops"]
    return next(o["seconds"] for o in ops if o["op"] == "attention")


def test_double_hbm_bandwidth_halves_a_memory_bound_op_and_leaves_a_compute_bound_one(tmp_path):
    fast = load_gpu(str(_chip(tmp_path, "hbm2x", hbm=2.0)))
    assert fast.hbm_TBps == 2 * H100.hbm_TBps and fast.bf16_tflops == H100.bf16_tflops
    decode = gemm_time(1, 8192, 8192, fast, "bf16") / gemm_time(1, 8192, 8192, H100, "bf16")  # weight-bound
    assert decode == pytest.approx(0.5, rel=0.05)
    assert gemm_time(8192, 8192, 8192, fast, "bf16") == gemm_time(8192, 8192, 8192, H100, "bf16")  # compute-bound


def test_a_gpu_file_by_path_prices_audit_and_search(monkeypatch, capsys, tmp_path):
    """Double the bf16 peak: the compute-bound attention op takes half the time in the audit, and the
    search's best forward time drops; the file's memory is the memory both size against."""
    chip = str(_chip(tmp_path, "bf16x2", bf16=2.0))
    base = _json(monkeypatch, capsys, "audit", *BASE, "--gpu", "h100-datasheet", "--workload", "prompt16k-c8")
    new = _json(monkeypatch, capsys, "audit", *BASE, "--gpu", chip, "--workload", "prompt16k-c8")
    b, n = base["plans"][0], new["plans"][0]
    assert _attention_s(n) == pytest.approx(_attention_s(b) / 2, rel=1e-9)
    assert n["prediction"]["forward_s"] < b["prediction"]["forward_s"]
    assert n["prediction"]["memory_bytes_per_rank"]["gpu"] == 100.0 * 2**30
    s_base = _json(monkeypatch, capsys, "search", *BASE, "--gpu", "h100-datasheet")
    s_new = _json(monkeypatch, capsys, "search", *BASE, "--gpu", chip)
    assert s_new["gpu_memory_bytes"] == 100.0 * 2**30
    assert s_new["plans"][0]["forward_s"] < s_base["plans"][0]["forward_s"]


def test_a_gpu_file_in_the_presets_folder_is_a_name_for_search(monkeypatch, capsys, tmp_path):
    """Dropped into (a copy of) presets/gpus/, the file is `--gpu NAME` with no other edit."""
    root, presets = tmp_path / "cost", Path(str(resources.files("tpplan.cost"))) / "presets"
    (root / "presets").mkdir(parents=True)
    for entry in presets.iterdir():  # the rest linked (fast), gpus/ copied to add a file to
        (root / "presets" / entry.name).symlink_to(entry)
    (root / "presets" / "gpus").unlink()
    shutil.copytree(presets / "gpus", root / "presets" / "gpus")
    _chip(root / "presets" / "gpus", "hbm2x-datasheet", hbm=2.0, memory_GiB=64.0)
    real = resources.files
    monkeypatch.setattr(topology.resources, "files", lambda pkg: root if pkg == "tpplan.cost" else real(pkg))
    assert "hbm2x-datasheet" in list_gpus()
    listed = _json(monkeypatch, capsys, "gpus")["gpus"]
    row = next(g for g in listed if g["preset"] == "hbm2x-datasheet")
    assert row["hbm_TBps"] == 2 * H100.hbm_TBps and row["memory_GiB"] == 64.0
    found = _json(monkeypatch, capsys, "search", *BASE, "--gpu", "hbm2x-datasheet")
    assert found["topology"] == "h200x8-ib400+hbm2x-datasheet" and found["gpu_memory_bytes"] == 64.0 * 2**30
