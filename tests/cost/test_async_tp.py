"""Async TP (`<plan>+asynctp`): which pairs fuse, the refusals, torch's chunk pipeline by hand, the price
of a real plan, the search with the decoration against brute force, plan files, and verify un-fused."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
from pathlib import Path

import pytest

from tpplan.cost.async_tp import (
    GEMM_BESIDE_COPY,
    AsyncTpCosts,
    all_gather_matmul_seconds,
    matmul_reduce_scatter_seconds,
    pair_seconds,
)
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def graph(model: str):
    return build_model_graph(load_model(model))


@functools.cache
def topo(name: str = "h200x8-ib400", nodes: int = 1):
    from tpplan.cost.topology import select_topology

    return select_topology(name, nodes)


# -- torch's chunk pipeline, by hand (barriers 0 unless said) ------------------------------------


def test_all_gather_matmul_compute_bound_exposes_only_the_shard_copy():
    # own rows into the buffer 0-0.1; own GEMM 0.1-1.1; copy 1 0.1-0.6 (side stream), GEMM 1 1.1-2.1;
    # copy 2 waits for its stream's own GEMM: 1.1-1.6, GEMM 2 2.1-3.1; copy 3 2.1-2.6, GEMM 3 3.1-4.1;
    # the output copy runs beside GEMM 3 on the other stream (3.1-3.2)
    assert all_gather_matmul_seconds(4, gemm=1.0, copy=0.5, local_copy=0.1, barrier=0.0) == pytest.approx(4.1)
    # odd group: the output copy lands on the side stream after GEMM 1 (2.1-2.2), GEMM 2 ends at 3.1
    assert all_gather_matmul_seconds(3, gemm=1.0, copy=0.5, local_copy=0.1, barrier=0.0) == pytest.approx(3.1)
    # three barriers: two before the loop, one after
    assert all_gather_matmul_seconds(4, 1.0, 0.5, 0.1, barrier=0.01) == pytest.approx(4.1 + 0.03)


def test_all_gather_matmul_comm_bound_costs_every_copy_and_the_last_gemm():
    # copies back to back from 0.1 (3 x 1.0), then the last chunk's GEMM (0.2) after the last copy
    assert all_gather_matmul_seconds(4, gemm=0.2, copy=1.0, local_copy=0.1, barrier=0.0) == pytest.approx(3.3)


def test_matmul_reduce_scatter_by_hand():
    # GEMM 1 0-1, copy 1 1-1.5; GEMM 2 1-2, copy 2 2-2.5; GEMM 3 (waits for copy 1's stream: 1.5) 2-3,
    # copy 3 3-3.5; the own rows' GEMM 3-4; the sum of the partials 0.2
    assert matmul_reduce_scatter_seconds(4, gemm=1.0, copy=0.5, reduce=0.2, barrier=0.0) == pytest.approx(4.2)
    # comm bound: GEMM 1 0-0.2, then the copies back to back 0.2-3.2 hide GEMMs 2, 3 and the own one; + sum
    assert matmul_reduce_scatter_seconds(4, gemm=0.2, copy=1.0, reduce=0.2, barrier=0.0) == pytest.approx(3.4)
    # two ranks: GEMM 1 0-1, copy 1-1.5 beside the own GEMM 1-2, + sum
    assert matmul_reduce_scatter_seconds(2, gemm=1.0, copy=0.5, reduce=0.2, barrier=0.0) == pytest.approx(2.2)


# -- which plans fuse, and the refusals --------------------------------------------------------


def test_sequence_parallel_fuses_every_gather_and_scatter_next_to_a_gemm():
    from tpplan.layout.fused_gemm import describe_pair, model_pairs
    from tpplan.layout.propagate import propagate_model

    g = graph("qwen3-32b")
    plan = make_plan("sequence-parallel+asynctp", g, 8)
    assert plan.overlap == "asynctp" and plan.name == "sequence-parallel+asynctp"
    assert plan.describe()["overlap"] == "asynctp"
    results = propagate_model(g, plan, 8).results
    pairs = model_pairs(results)
    first, second = pairs[0], pairs[1]
    # layer 0: its entry reduce-scatter reduces the embedding's partial sum (no GEMM): 3 pairs, then 4
    assert len(first) == 3 and len(second) == 4
    lines = [describe_pair(p, results[1], results[0]) for p in second]
    assert lines == [
        "down_proj of the previous layer fused into RS delta[5120] (fused_matmul_reduce_scatter)",
        "AG x[5120] fused into q_proj, k_proj, v_proj (fused_all_gather_matmul)",
        "o_proj fused into RS attn_out[5120] (fused_matmul_reduce_scatter)",
        "AG y[5120] fused into gate_proj, up_proj (fused_all_gather_matmul)",
    ]
    notes = " ".join(plan.engine_notes)
    assert "127 GEMM -> reduce-scatter" in notes and "128 all-gather -> GEMM" in notes  # 64 layers
    assert "SGLang 0.5.23: --enable-layernorm-sp" in notes and "vLLM 0.34.0: none" in notes


def test_plans_with_nothing_to_fuse_are_refused_naming_why():
    g = graph("qwen3-32b")
    with pytest.raises(TpplanError, match=r"no all-gather feeding a GEMM .*\(its collectives: AR\)"):
        make_plan("baseline+asynctp", g, 8)
    with pytest.raises(TpplanError, match="TP1 issues no collective"):
        make_plan("sequence-parallel+asynctp", g, 1)
    with pytest.raises(TpplanError, match="DP attention"):
        make_plan("dp-attention+asynctp", g, 8)
    v3 = graph("deepseek-v3")
    with pytest.raises(TpplanError, match="already runs overlap tbo"):
        make_plan("dp-attention+a2a+tbo+asynctp", v3, 8)
    # the MLA latent's all-gather feeds a norm, not a GEMM; input-scattered still has GEMM -> RS
    assert make_plan("input-scattered+asynctp", v3, 8).overlap == "asynctp"


def test_a_tp_group_across_nodes_is_refused_at_the_cli(monkeypatch, capsys):
    from tests.cli_helpers import run_cli

    code, out, err = run_cli(monkeypatch, capsys, "audit", "--model", "qwen3-32b", "--tp", "16", "--plan",
                             "sequence-parallel+asynctp", "--topology", "h200x8-ib400", "--nodes", "2")  # fmt: skip
    assert code == 2, (out, err)
    line = err.strip().splitlines()[-1]
    assert "spans 2 nodes" in line and "NVLink" in line and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, "audit", "-m", "qwen3-32b", "--tp", "8", "--plan", "baseline+asynctp")
    assert code == 2 and "no all-gather feeding a GEMM" in err and "Traceback" not in err


# -- the price of a real plan ------------------------------------------------------------------


def test_a_pair_is_priced_as_the_chunk_pipeline_of_its_chunk_gemms_and_link_copies():
    from tpplan.cost.kernel_pricer import KERNEL_FLOOR_S
    from tpplan.cost.predictor import cached_predictor

    g, t = graph("qwen3-32b"), topo()
    plan = make_plan("sequence-parallel+asynctp", g, 8)
    p = cached_predictor(g, plan, t, Mesh(8, pp=1), "bf16", None)
    r0, r1 = p.audit.layer_results[:2]
    segs = ((32768, 0),)
    kt0, kt1 = p.kind_time(r0, segs), p.kind_time(r1, segs)
    lg = g.kinds[r1.kind]
    link, lat = t.intra.bandwidth_GBps * 1e9, t.intra.latency_us * 1e-6
    rows = 32768 // 8
    chunk_bytes = rows * 5120 * 2
    seen = set()
    for pair in [x for x in p.outline(segs).fused if x.layer == 1]:  # the lowering's async TP pass names them
        src = kt0 if pair.from_previous else kt1
        ops = [next(o for o in src.ops if o.op == name) for name in pair.gemms]
        gemm = sum(
            p.kernels.gemm_at(lg.kind, next(o for o in lg.ops if o.name == x.op), rows, *x.shape[1:]) for x in ops
        )
        gemm = max(gemm, sum(o.seconds for o in ops) / 8)  # never faster than its share of the whole GEMM
        gemm *= GEMM_BESIDE_COPY  # each chunk GEMM beside a copy, as measured on one H200
        copy = lat + chunk_bytes / link
        if pair.pattern == "ag_gemm":
            want = all_gather_matmul_seconds(8, gemm, copy, max(2 * chunk_bytes / p.kernels.hbm, KERNEL_FLOOR_S), lat)
        else:
            want = matmul_reduce_scatter_seconds(
                8, gemm, copy, max(9 * chunk_bytes / p.kernels.hbm, KERNEL_FLOOR_S), lat
            )
        fused, unfused = pair_seconds(p.kernels, pair, r1, kt1, src, AsyncTpCosts())
        assert fused == pytest.approx(want)
        label = next(c.label for c in r1.comms if c.value == pair.collective)
        coll = next(c.seconds for c in kt1.collectives if c.label == label)
        assert unfused == pytest.approx(sum(o.seconds for o in ops) + coll)
        # a pipeline, not max(compute, comm): at least the chunk GEMMs and the peer copies, and at 32K
        # tokens on NVLink cheaper than the GEMM and NCCL's collective one after the other
        assert max(8 * gemm, 7 * copy) < fused < unfused
        assert fused != pytest.approx(max(sum(o.seconds for o in ops), coll))
        seen.add(pair.pattern)
        # a slower GEMM beside the copies (the named parameter) costs time
        slow, _ = pair_seconds(p.kernels, pair, r1, kt1, src, AsyncTpCosts(gemm_beside_copy=1.2))
        assert slow > fused
    assert seen == {"ag_gemm", "gemm_rs"}


def test_forward_time_is_the_plan_with_each_pair_replaced_by_its_pipeline():
    from tpplan.cost.predict import predict_plan
    from tpplan.cost.predictor import cached_predictor

    g, t = graph("qwen3-32b"), topo()
    base, fused = make_plan("sequence-parallel", g, 8), make_plan("sequence-parallel+asynctp", g, 8)
    tokens = 16384
    t0 = predict_plan(g, base, t, mesh=Mesh(8), tokens=tokens).forward_s
    t1 = predict_plan(g, fused, t, mesh=Mesh(8), tokens=tokens).forward_s
    p = cached_predictor(g, fused, t, Mesh(8, pp=1), "bf16", None)
    res, segs = p.audit.layer_results, ((tokens, 0),)
    delta = 0.0
    pairs = p.outline(segs).fused
    assert {pair.layer for pair in pairs} == set(range(len(res)))  # every layer fuses (one stage)
    for pair in pairs:
        i = pair.layer
        kt = p.kind_time(res[i], segs)
        src = p.kind_time(res[i - 1], segs) if pair.from_previous else kt
        f, u = pair_seconds(p.kernels, pair, res[i], kt, src, AsyncTpCosts())
        delta += f - u
    assert t1 == pytest.approx(t0 + delta) and t1 < t0
    # same bytes: the fusion changes how they move, not how many
    from tpplan.audit import audit_plan

    assert audit_plan(g, base, 8).comm_bytes_per_token == audit_plan(g, fused, 8).comm_bytes_per_token


# -- the search with the decoration, against brute force ---------------------------------------


@pytest.mark.slow  # a proof over the whole space: ~2900 leaves audited, ~490 distinct plans priced twice
def test_search_with_asynctp_finds_the_brute_force_best(tmp_path):
    """Every leaf of the space, audited whole, each distinct legal plan priced plain and (where it has a
    pair) fused: the search's best with --overlap asynctp is the best of all of them, and fused. The model
    is Llama-3-70B's layer at two layers (the space is tiny-llama's; the widths make the fusion pay)."""
    from tpplan.audit import audit_plan
    from tpplan.cost.predict import predict_plan
    from tpplan.placement import P, R
    from tpplan.plans.named import async_tp
    from tpplan.search import MeshAsk, SpaceOptions, enumerate_kind, global_choices, make_search_plan, search_plans
    from tpplan.search.naming import behaviour

    cfg = {**json.loads((ROOT / "tpplan/models/presets/llama-3-70b.json").read_text()), "num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    g, t, n, tokens = build_model_graph(load_model(str(tmp_path / "config.json"))), topo("h200x2"), 2, 32768
    opts = SpaceOptions()
    distinct = {}
    for gc in global_choices(g, n, streams=opts.streams):
        if gc.moe not in opts.moe_modes or gc.reduce not in opts.reduces:
            continue
        leaves = [[cfg for cfg, _ in enumerate_kind(lg, gc, n, opts)] for lg in g.kinds.values()]
        for combo in itertools.product(*leaves):
            plan = make_search_plan(gc, combo)
            pa = audit_plan(g, plan, n)
            if pa.legal and all(r.exit_delta in (P, R, gc.stream) for r in pa.layer_results[:-1]):
                distinct.setdefault(behaviour(pa), plan)
    best, best_fused = math.inf, False
    for plan in distinct.values():
        variants = [plan]
        with contextlib.suppress(TpplanError):  # nothing to fuse
            variants.append(async_tp(plan.with_(name="x"), g, n))
        for v in variants:
            secs = predict_plan(g, v, t, mesh=Mesh(n), tokens=tokens).forward_s
            if secs < best:
                best, best_fused = secs, v.overlap == "asynctp"
    out = search_plans(
        g, t, ask=MeshAsk(tp=n, pp=1), top=4, tokens=tokens, overlap="asynctp", memory_cap_gib=None, all_plans=True
    )
    assert best_fused and out.ranked[0].plan.overlap == "asynctp"
    assert out.ranked[0].score == pytest.approx(best, rel=1e-9)
    # without --all: each family's best, fused; here the fused best is the 5th plain plan, not among them
    quick = search_plans(g, t, ask=MeshAsk(tp=n, pp=1), top=4, tokens=tokens, overlap="asynctp", memory_cap_gib=None)
    assert quick.ranked[0].plan.overlap == "asynctp" and quick.ranked[0].score >= best


# -- plan files --------------------------------------------------------------------------------


def test_plan_file_round_trip_keeps_the_fusion_and_rechecks_it(tmp_path):
    from tpplan.plans.decisions import exact_decisions
    from tpplan.plans.files import Deployment, load_plan_file, plan_file_data

    g = graph("tiny-qwen3")
    plan = make_plan("sequence-parallel+asynctp", g, 2)
    pf = plan_file_data(plan, g, {"topology": "h200x2"}, Deployment(tp=2))
    path = tmp_path / "plan.json"
    path.write_text(pf.model_dump_json())
    back = load_plan_file(str(path), g, 2)
    assert back.overlap == "asynctp" and back.describe() == exact_decisions(plan, g).describe()
    assert any("verify" in n for n in back.notes)
    # the same file with the stream replicated (baseline's decisions) leaves nothing to fuse: refused
    data = json.loads(path.read_text())
    data["decisions"].update(stream="R", reduce="R", gather=[])
    path.write_text(json.dumps(data))
    with pytest.raises(TpplanError, match=r"its async TP fuses .* no all-gather feeding a GEMM"):
        load_plan_file(str(path), g, 2)


# -- runtime: the un-fused plan, for real ------------------------------------------------------


@pytest.mark.slow
def test_verify_runs_the_fused_plan_unfused_and_equal():
    from tpplan.runtime.verify import VerifyCase, verify_cases

    cases = [VerifyCase("tiny-qwen3", p, tokens=6) for p in ("sequence-parallel", "sequence-parallel+asynctp")]
    plain, fused = verify_cases(cases, nproc=2, timeout_s=120)
    assert plain.passed and fused.passed
    assert [c.key() for c in fused.traced[0]] == [c.key() for c in plain.traced[0]]  # the same collectives
    assert any(c.kind == "reduce_scatter" for c in fused.traced[0])


def test_the_engine_flags_that_realise_it_per_model():
    from tpplan.engines.async_tp import SGLANG_ASYNC_TP, launch_flags

    assert launch_flags("qwen3")["SGLang 0.5.23"] == ("--enable-layernorm-sp",)
    assert "only for qwen3" in launch_flags("llama")["SGLang 0.5.23"]
    assert "pipeline stages" in str(launch_flags("qwen3", Mesh(8, pp=2))["SGLang 0.5.23"])
    vllm = launch_flags("qwen3")["vLLM 0.34.0"]
    assert isinstance(vllm, str) and "no async-TP compile pass" in vllm
    assert "SM100" in str(launch_flags("kimi_k3")["vLLM 0.34.0"])  # a Blackwell CUTLASS kernel, not priced
    # the fusion's gates follow the mode's (--enable-layernorm-sp's own checks come first)
    assert SGLANG_ASYNC_TP.all_gates[0].text.startswith("architecture in SP_SUPPORTED_ARCHITECTURES")


def test_the_gemm_slowdown_beside_a_copy_is_the_h200_measurement():
    """GEMM_BESIDE_COPY is the median slowdown of the multi-wave GEMMs (over 0.12 ms) beside a paced
    copy-engine copy, two runs on one H200: a new measurement that moves it must move the constant.
    One-wave GEMMs (under 0.12 ms) lose an SM to the pacing kernel and are left out."""
    import json
    import statistics
    from pathlib import Path

    runs = Path(__file__).parents[2] / "docs/benchmarks/h200-2026-12-02d"
    rows = [r for f in ("copy.json", "copy-repeat.json") for r in json.loads((runs / f).read_text())["rows"]]
    gemms = [r["op_slowdown"] for r in rows if r["op"].startswith("gemm") and r["op_alone_s"] > 1.2e-4]
    assert len(gemms) == 28 and round(statistics.median(gemms), 2) == GEMM_BESIDE_COPY
