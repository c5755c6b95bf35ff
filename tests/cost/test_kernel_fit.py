"""Kernel profiles: the curve, the fit from bench results, the prediction through them, the CLI."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpplan.bench.model_slice import build_slice
from tpplan.bench_results import OpResult, load_bench_results
from tpplan.cost.kernel_fit import curve, fit_kernel_profiles, profile_samples, with_kernel_profiles
from tpplan.cost.predict import cached_predictor
from tpplan.cost.topology import KernelProfile, load_topology, topology_to_toml
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.plans.named import make_plan

REPO = Path(__file__).resolve().parents[2]
GPU_RUN = REPO / "docs" / "benchmarks" / "h200x2-2026-11-30"


def test_profile_hits_its_points_interpolates_log_log_and_keeps_the_end_ratios() -> None:
    prof = KernelProfile(points=[(1e-5, 4e-5), (1e-4, 1e-4), (1e-3, 2e-3)])
    assert prof.apply(1e-4) == pytest.approx(1e-4)
    mid = math.sqrt(1e-5 * 1e-4)  # halfway in log space -> geometric mean of the measurements
    assert prof.apply(mid) == pytest.approx(math.sqrt(4e-5 * 1e-4))
    assert prof.apply(1e-6) == pytest.approx(4e-6)  # below: the first point's ratio (4x)
    assert prof.apply(1e-2) == pytest.approx(2e-2)  # above: the last point's ratio (2x)
    assert prof.apply(0.0) == 0.0


@pytest.mark.parametrize("points", [[(2e-5, 1e-5), (1e-5, 1e-5)], [(1e-5, 1e-5), (1e-5, 2e-5)], [(0.0, 1e-5)]])
def test_profile_rejects_unsorted_repeated_or_non_positive_points(points: list[tuple[float, float]]) -> None:
    with pytest.raises(ValueError, match="rising"):
        KernelProfile(points=points)


def test_curve_merges_near_equal_estimates_into_their_median() -> None:
    pts = curve([(1.0, 5.0), (1.01, 7.0), (1.005, 6.0), (2.0, 9.0)])
    assert len(pts) == 2 and pts[0][1] == 6.0 and pts[1] == (2.0, 9.0)


def _slice_ops(topo, plan_name: str, tokens: int, scale: dict[str, float]) -> list[OpResult]:
    """The predictor's ops for the K3 slice at `tokens`, 'measured' at `scale[kernel]` x the estimate."""
    sl = build_slice("kimi-k3", None, 64)
    plan = make_plan(plan_name, sl.graph, 2)
    p = cached_predictor(sl.graph, plan, topo, Mesh(2, pp=1), "bf16", None)
    out = []
    for res in p.audit.layer_results[:2]:
        for o in p.kind_time(res, ((tokens, 0),)).ops:
            if o.seconds > 0:
                m = o.seconds * scale.get(o.kernel or "", 1.0)
                out.append(OpResult(layer_kind=o.layer_kind, op=o.op, tokens=tokens, measured_s=m,
                                    predicted_s=o.seconds, kernel=o.kernel, modelled_s=o.modelled_s))  # fmt: skip
    return out


def test_profiles_fitted_on_a_sweep_predict_other_sizes_and_plans() -> None:
    """Kernels 'measured' at a fixed multiple of the estimate at 2K and 16K tokens under baseline:
    the fitted profiles predict that multiple at 8K and for another plan (other shares), and leave
    plain GEMMs (priced by the GEMM table) alone."""
    base = load_topology("h200x2-calibrated")
    scale = {"token_mix.kda": 40.0, "attn_res": 30.0, "norm": 10.0, "experts.tp": 2.0, "router": 19.0}
    ref = load_bench_results(GPU_RUN / "k3-baseline.json")
    ops = _slice_ops(base, "baseline", 2048, scale) + _slice_ops(base, "baseline", 16384, scale)
    profiles = fit_kernel_profiles([ref.model_copy(update={"ops": ops})], "test")
    assert {"token_mix.kda", "token_mix.kda:kda", "attn_res", "experts.tp", "router", "norm"} <= set(profiles)
    topo = with_kernel_profiles(base, profiles)
    for plan in ("baseline", "gate-aware"):
        for o in _slice_ops(topo, plan, 8192, {}):
            assert o.modelled_s is not None
            want = o.modelled_s * scale.get(o.kernel or "", 1.0)
            assert o.predicted_s == pytest.approx(want, rel=1e-6), (plan, o.op)


def test_topology_with_profiles_round_trips_through_toml(tmp_path: Path) -> None:
    prof = {
        "norm": KernelProfile(points=[(1e-5, 2e-5)], samples=3),
        "norm:o_norm": KernelProfile(points=[(1e-5, 3e-5)]),
    }
    topo = with_kernel_profiles(load_topology("h200x2"), prof, "fitted")
    path = tmp_path / "t.toml"
    path.write_text(topology_to_toml(topo))
    assert load_topology(str(path)) == topo


def test_samples_of_an_older_file_take_kernels_from_the_graph() -> None:
    res = load_bench_results(GPU_RUN / "k3-baseline.json")
    assert all(o.kernel is None and o.modelled_s is None for o in res.ops)  # written before profiles
    samples = profile_samples([res])
    assert len(samples["token_mix.short_conv"]) == 3  # q, k, v convs of the KDA layer
    assert not any(k.startswith("linear") for k in samples)


def test_fit_without_timed_ops_is_a_clear_error() -> None:
    res = load_bench_results(GPU_RUN / "k3-baseline.json").model_copy(update={"ops": []})
    with pytest.raises(TpplanError, match="no timed non-GEMM ops"):
        fit_kernel_profiles([res], "x")


def _calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "tpplan", "calibrate", *args], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip


def test_cli_writes_the_base_topology_with_profiles_and_fails_cleanly_on_a_bad_file(tmp_path: Path) -> None:
    out = tmp_path / "k.toml"
    ok = _calibrate("--kernels-from", str(GPU_RUN / "k3-baseline.json"), "--base-topology", "h200x2-calibrated",
                    "--out", str(out))  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    topo = load_topology(str(out))
    assert topo.fitted == load_topology("h200x2-calibrated").fitted and "token_mix.kda" in topo.gpu.kernel_profiles
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out2 = tmp_path / "k2.toml"
    fail = _calibrate("--kernels-from", str(bad), "--base-topology", "h200x2-calibrated", "--out", str(out2))
    assert fail.returncode == 2 and "--kernels-from" in fail.stderr and "bad.json" in fail.stderr and not out2.exists()


def test_gemm_shapes_of_a_model_s_plans_cover_column_split_token_sharded_and_expert_gemms() -> None:
    from tpplan.cost.predict import plan_gemm_shapes

    sl = build_slice("kimi-k3", None, 64)
    shapes = set(plan_gemm_shapes(sl.graph, Mesh(2), load_topology("h200x2-calibrated")))
    assert (7168, 6144) in shapes  # baseline: q_proj split by heads at TP2
    assert (7168, 12288) in shapes  # gate-aware / sp-moe: the whole projection on half the tokens
    assert {(3584, 3072), (1536, 3584)} <= shapes  # TP experts: gate+up and down on half the intermediate
    assert {(3584, 6144), (3072, 3584)} <= shapes  # all-to-all experts: whole experts
