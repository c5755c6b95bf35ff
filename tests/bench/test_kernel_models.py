"""Physical kernel models: the fit recovers known constants, judges held-out points, and the predictor
uses the models only for the implementations they were fitted on."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpplan.bench.model_fit import fit_sweep, nelder_mead
from tpplan.cost import kernel_models as M
from tpplan.cost.gemm import achieved_tflops
from tpplan.cost.topology import load_topology
from tpplan.mesh import Mesh

REPO = Path(__file__).resolve().parents[2]
FIT = REPO / "docs/benchmarks/h200-2026-12-01/kernel-models-fit.json"


def test_smoothmax_is_between_max_and_sum_and_does_not_underflow() -> None:
    assert M.smoothmax(3e-4, 1e-4, 150.0) == pytest.approx(3e-4, rel=1e-6)  # (3e-4)^150 underflows unscaled
    assert M.smoothmax(2.0, 1.0, 1.0) == pytest.approx(3.0)
    assert 2.0 < M.smoothmax(2.0, 1.0, 3.0) < 3.0


def test_nelder_mead_finds_a_known_minimum() -> None:
    x = nelder_mead(lambda v: (v[0] - 1.5) ** 2 + 10 * (v[1] + 0.5) ** 2, [0.0, 0.0])
    assert x == pytest.approx([1.5, -0.5], abs=1e-3)


def test_fit_recovers_the_constants_of_synthetic_kda_points_and_flags_held_out_ones() -> None:
    true = {"c0_s": 1e-3, "c1_s": 5e-8, "b_s": 4e-9, "p": 6.0}
    pts = [{"family": "kda", "heads": h, "tokens": t, "seconds": M.recurrence_s(true, h, t)}
           for h in (96, 48, 24, 12, 6, 3, 1) for t in (1024, 2048, 4096, 8192)]  # fmt: skip
    res = fit_sweep(pts)
    sets = {r["set"] for r in res["points"]}
    assert sets == {"fit", "held-out"}
    assert max(abs(r["error"]) for r in res["points"]) < 0.02  # held-out heads/tokens too
    assert res["constants"]["kda"]["c0_s"] == pytest.approx(1e-3, rel=0.1)


def test_shipped_fit_is_the_fit_of_the_shipped_sweep() -> None:
    """kernel-models-fit.json (and so the h200-kernel-models preset) is reproducible from the sweep."""
    pts = [p for f in ("kernel-sweep.json", "kernel-sweep-in-model-shapes.json")
           for p in json.loads((FIT.parent / f).read_text())["points"]]  # fmt: skip
    got = fit_sweep(pts)["constants"]
    shipped = json.loads(FIT.read_text())["constants"]
    preset = load_topology("h200-kernel-models").gpu.kernel_models
    for name, consts in shipped.items():
        for k, v in consts.items():
            assert got[name][k] == pytest.approx(v, rel=1e-6), (name, k)
            assert preset[name][k] == pytest.approx(v, rel=1e-9), (name, k)


def test_fitted_for_matches_recorded_implementations_only() -> None:
    km = M.KernelModels(load_topology("h200-kernel-models").gpu.kernel_models)
    assert km.fitted_for("kda", "fla.chunk_kda")
    assert not km.fitted_for("kda", "tpplan batched chunked delta rule (torch)")
    assert not km.fitted_for("mla", "flash x2 (KV-cache prefix + causal chunk, merged by log-sum-exp)")
    assert not km.fitted_for("gdn", "fla.chunk_gated_delta_rule")  # no constants measured
    assert not km.fitted_for("kda", None)


def test_gemm_scale_multiplies_the_table_rate() -> None:
    gpu = load_topology("h200x2").gpu
    base = achieved_tflops(8192, 7168, 2112, gpu)
    faster = achieved_tflops(8192, 7168, 2112, gpu.model_copy(update={"gemm_scale": 1.1}))
    assert faster == pytest.approx(base * 1.1)


def test_calibrate_kernel_models_writes_a_topology_and_refuses_a_bad_file(tmp_path: Path) -> None:
    out = tmp_path / "t.toml"
    cmd = [sys.executable, "-m", "tpplan", "calibrate", "--kernel-models", str(FIT), "--base-topology", "h200x2",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert load_topology(str(out)).gpu.kernel_models["kda"]["p"] > 1
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    cmd[5] = str(bad)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "--kernel-models" in proc.stderr and "Traceback" not in proc.stderr


def test_predictions_say_when_a_physical_model_priced_a_shape_its_sweep_never_measured() -> None:
    from tpplan.bench.model_slice import build_slice
    from tpplan.cost.predict import cached_predictor
    from tpplan.plans.named import make_plan

    g = build_slice("kimi-k3", None, 128).graph
    p = cached_predictor(
        g, make_plan("baseline", g, 1), load_topology("h200-kernel-models"), Mesh(1, pp=1), "bf16", None
    )
    res = next(r for r in p.audit.layer_results if r.kind == "kda+moe")

    def kda(tokens: int) -> object:
        return next(o for o in p.kind_time(res, ((tokens, 0),)).ops if o.op == "kda")

    assert not kda(8192).extrapolated and kda(12288).extrapolated  # the sweep went to 8K tokens
    gemm = next(o for o in p.kind_time(res, ((12288, 0),)).ops if o.op == "q_proj")
    assert not gemm.extrapolated  # GEMMs come from the table, not a physical model


def test_sweep_two_fits_the_norm_model_and_the_predictor_prices_norms_with_it() -> None:
    """Synthetic RMSNorm points (sweep 2's timing) give back their constants with the held-out widths
    predicted; a topology carrying them prices the norm ops by them (and flags widths outside the
    measured range), while a topology without them keeps the roofline."""
    from tpplan.cost.predict import predict_plan
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan

    true = {"a_s": 6e-6, "TBps": 2.5}
    pts = [{"family": "norm", "width": w, "tokens": t, "timing": "host ahead",
            "seconds": M.stream_s(true, 4.0 * w * t)}
           for w in (7168, 2304, 12288, 1536, 512) for t in (1024, 2048, 4096, 8192)]  # fmt: skip
    res = fit_sweep(pts)
    c = res["constants"]["norm"]
    assert c["TBps"] == pytest.approx(2.5, rel=0.01) and c["impl"] == "fla fused rms_norm"
    assert {r["set"] for r in res["points"]} == {"fit", "held-out"}
    assert max(abs(r["error"]) for r in res["points"]) < 0.01

    base = load_topology("h200x2")
    fitted = base.model_copy(update={"gpu": base.gpu.model_copy(update={"kernel_models": {"norm": c}})})
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    plan = make_plan("baseline", graph, 1)

    def norm_ops(topo: object) -> list[object]:
        p = predict_plan(graph, plan, topo, mesh=Mesh(1, pp=1), tokens=4096)
        return [o for k in p.kinds for o in k.ops if o.op in ("o_norm", "latent_norm", "q_a_layernorm")]

    with_model, roofline = norm_ops(fitted), norm_ops(base)
    assert with_model and len(with_model) == len(roofline)
    for a, b in zip(with_model, roofline, strict=True):
        assert a.seconds == pytest.approx(M.stream_s(c, a.bytes_per_rank), rel=1e-9)
        assert a.seconds != pytest.approx(b.seconds, rel=1e-3)
    tiny_width = any(o.extrapolated for o in with_model)  # tiny K3's widths are below the swept 512
    assert tiny_width


def test_model_fit_writes_only_files_tpplan_wrote(tmp_path: Path) -> None:
    """`python -m tpplan.bench.model_fit` refuses an output it did not write (one line, exit non-zero,
    the file untouched) and may replace its own."""
    sweep = tmp_path / "sweep.json"
    pts = [{"family": "short_conv", "channels": c, "tokens": t, "seconds": 1e-5 + 4.0 * c * t / 2e12}
           for c in (12288, 768, 3072) for t in (1024, 8192)]  # fmt: skip
    sweep.write_text(json.dumps({"points": pts}))
    foreign = tmp_path / "fit.json"
    foreign.write_text("mine")
    cmd = [sys.executable, "-m", "tpplan.bench.model_fit", str(sweep), str(foreign)]
    bad = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode != 0 and "tpplan did not write it" in bad.stderr and "Traceback" not in bad.stderr
    assert foreign.read_text() == "mine"
    fresh = tmp_path / "new.json"
    for _ in range(2):  # the second run replaces the file the first one wrote
        ok = subprocess.run([*cmd[:-1], str(fresh)], capture_output=True, text=True, cwd=REPO, timeout=120)
        assert ok.returncode == 0, ok.stderr
    assert "short_conv" in json.loads(fresh.read_text())["constants"]


def test_clock_factor_is_the_median_fit_ratio_and_prices_the_held_out_twins() -> None:
    """Idle / loaded twins (same call, `preamble` on the loaded one): the factor is the median ratio of
    the fit set's pairs only; every loaded point is priced as the boost model's time x factor."""
    from tpplan.bench.clock_fit import fit_clock_factors, pairs

    def pt(width: int, secs: float, loaded: bool) -> dict[str, object]:
        return {"family": "norm", "width": width, "tokens": 4096, "seconds": secs} | (
            {"preamble": "gemm"} if loaded else {}
        )

    idle = [pt(w, 1e-5 * w / 512, False) for w in (512, 1536, 7168, 12288)]
    ratio = {512: 1.5, 1536: 1.1, 7168: 1.3, 12288: 1.2}
    loaded = [pt(int(p["width"]), float(p["seconds"]) * ratio[int(p["width"])], True) for p in idle]
    assert len(pairs(idle + loaded)) == 4 and pairs(idle) == []
    fit_sets = {"norm": lambda p: p["width"] in (1536, 7168)}
    got = fit_clock_factors(idle + loaded, {"norm": {}}, fit_sets, lambda c, p: 1e-5 * p["width"] / 512)
    assert got["factors"] == {"norm": pytest.approx(1.2)}  # median of 1.1 and 1.3: held-out ratios left out
    rows = {r["width"]: r for r in got["points"]}
    assert rows[512]["set"] == "held-out" and rows[512]["error"] == pytest.approx(1.2 / 1.5 - 1)
    assert rows[7168]["set"] == "fit" and rows[7168]["state"] == "power-capped"


def test_a_set_with_a_clock_factor_prices_every_kernel_that_much_slower() -> None:
    capped = M.KernelModels(load_topology("h200-serving-capped").gpu.kernel_models)
    boost = M.KernelModels(load_topology("h200-serving").gpu.kernel_models)
    assert capped.clock_state == "power-capped" and boost.clock_state == "boost"
    k = capped.consts["norm"]["clock_factor"]
    assert capped.norm(1e8) == pytest.approx(boost.norm(1e8) * k)
    ka = capped.consts["attention_prefix"]["clock_factor"]
    f = M.attention_flops(96, 8192, 8192, 192, 192)
    shape = (96, 8192, 8192, 192, 192, f)
    assert capped.attention(*shape) == pytest.approx(boost.attention(*shape) * ka)
    kr = capped.consts["experts"]["clock_factor"]
    assert capped.routing(1000, 100, 7168, 4.8e12) == pytest.approx(boost.routing(1000, 100, 7168, 4.8e12) * kr)
