"""A P/D decode pool chooses its own plan by its own phase's price (issue 32): beside the prefill search's best
plan at each decode mesh, the named plans a decode pool may run there (`DECODE_PLANS`, e.g. DP attention) are
candidates, and the pair ranking picks by the decode side of the bound. Checked by brute force on a small
case: every (prefill mesh, decode mesh and plan, n_P:n_D) bound per GPU, against the pair ranked first."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.search import search_plans
from tpplan.search.disagg_targets import _key, _pairs, decode_variants, meshes
from tpplan.search.grid import MeshAsk
from tpplan.search.results import RankedPlan
from tpplan.search.serving_points import Ask, predictor_of, shapes_of
from tpplan.search.targets import Target, Targets
from tpplan.simulate.disagg import DisaggDeployment, PoolSpec, capacity, ratios
from tpplan.simulate.requests import closed_loop


@pytest.fixture(scope="module")
def ask(tmp_path_factory: pytest.TempPathFactory) -> Ask:
    path: Path = tmp_path_factory.mktemp("wl") / "chat.toml"
    path.write_text('name = "chat"\ninput_len = 256\noutput_len = 64\nconcurrency = 4\nchunk_size = 1024\n')
    graph, topo, wl = (
        build_model_graph(load_model("tiny-deepseek-v3")),
        load_topology("h200x8-ib400"),
        load_workload(str(path)),
    )
    outcome = search_plans(graph, topo, workload=wl, top=1, every_deployment=True, ask=MeshAsk(replicas="all"))
    targets = Targets(Target("ttft", 1.0, "p90"), Target("tpot", 0.002, "p90"))
    return Ask(graph, topo, wl, targets, outcome.dtype, outcome.expert_dtype, outcome.cp_layers, outcome.cp_kv,
               None, None, outcome.deployment_best)  # fmt: skip


def test_decode_variants_are_the_searched_plan_and_the_legal_named_ones(ask: Ask) -> None:
    from tpplan.audit import Audits

    first = meshes(ask.deployments)[0]
    r = replace(first, mesh=Mesh(first.tp))  # plain TP, where SGLang's DP attention runs (not beside CP or PP)
    got = decode_variants(ask, r, Audits(ask.graph))
    assert got[0] is r and len(got) >= 2
    names = [v.plan.name for v in got[1:]]
    assert "dp-attention" in names  # an MLA model: DP attention is a decode pool's candidate
    assert all(math.isnan(v.score) and v.prediction is None and v.audit.legal for v in got[1:])
    assert all(v.mesh == r.mesh for v in got)


def _plain_tp(ask: Ask) -> list[RankedPlan]:
    """One candidate per TP size of the search's deployments, as plain TP meshes (the small case's pools:
    SGLang's DP attention runs there, not beside CP or PP)."""
    by_tp = {r.tp: replace(r, mesh=Mesh(r.tp)) for r in meshes(ask.deployments)}
    return [by_tp[tp] for tp in sorted(by_tp, reverse=True)]


def test_the_first_pair_has_the_best_bound_per_gpu_over_every_decode_plan(ask: Ask) -> None:
    from tpplan.audit import Audits

    every = _plain_tp(ask)
    audits = Audits(ask.graph)
    decode = [v for r in every for v in decode_variants(ask, r, audits)]
    predictor = {_key(r): predictor_of(ask, r, False) for r in (*every, *decode)}
    pairs = _pairs(ask, every, decode, predictor)
    probe = closed_loop(1, shapes_of(ask.workload), len(shapes_of(ask.workload)))
    tpot = ask.targets.tpot.seconds if ask.targets.tpot is not None else None
    chunk = ask.workload.chunk_size
    brute: list[tuple[float, str]] = []
    for p in every:  # every pair, every ratio: the bound per GPU
        for d in decode:
            try:
                base = DisaggDeployment(PoolSpec(predictor[_key(p)], 1, chunk), PoolSpec(predictor[_key(d)], 1, chunk))
            except TpplanError:
                continue
            bound = capacity(base, probe, tpot)
            for n_p, n_d in ratios(base, ask.topo.world_size):
                brute.append((bound.of(n_p, n_d) / base.with_ratio(n_p, n_d).gpus, d.plan.name))
    best = max(x for x, _ in brute)
    assert pairs[0].per_gpu == pytest.approx(best)
    assert pairs[0].decode.plan.name in {name for x, name in brute if x == pytest.approx(best)}
    assert {name for _, name in brute} > {r.plan.name for r in every}  # the variants were in the contest
    labels = [x.label for x in pairs]
    assert len(set(labels)) == len(labels)  # a variant's label names its decode plan


def test_without_variants_the_pairs_are_the_searched_plans_only(ask: Ask) -> None:
    every = _plain_tp(ask)
    predictor = {_key(r): predictor_of(ask, r, False) for r in every}
    pairs = _pairs(ask, every, every, predictor)
    assert all(not math.isnan(x.decode.score) for x in pairs)
    assert all(" dp-attention" not in x.label for x in pairs)
    assert replace(pairs[0].decode, score=math.nan).plan is pairs[0].decode.plan
