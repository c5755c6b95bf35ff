"""The program `lower` builds, beside what the cost model prices and what the runtime's expected
trace lists: the same kernels at the same per-rank shapes, the same collectives with the same bytes,
the same CP exchanges and stage boundaries, on tiny presets and real configs under TP, SP, EP, MoE
all-to-all, DP attention, CP, PP and micro-batch overlap."""

from __future__ import annotations

import pytest

from tpplan.cost.predictor import Predictor
from tpplan.cost.topology import load_topology
from tpplan.errors import TpplanError
from tpplan.layout.schedule import predict_schedule
from tpplan.lower import Batch, KernelCall, lower
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan

TOPO = load_topology("h200x8-ib400")
PLANS = ("baseline", "input-scattered", "sequence-parallel", "gate-aware", "sp-moe", "sglang-sp-moe", "ep2",
         "dp-attention", "dp-attention-maxlen", "sp-moe+tbo", "sequence-parallel+asynctp",
         "input-scattered+restore")  # fmt: skip
MODELS = ("tiny-deepseek-v3", "tiny-kimi-k3", "tiny-qwen3-next", "tiny-llama", "tiny-qwen3-moe", "tiny-gpt-oss",
          "tiny-kimi-linear", "tiny-gemma3", "kimi-k3", "deepseek-v3", "qwen3-next-80b")  # fmt: skip


def _plans(graph, n):  # type: ignore[no-untyped-def]
    for name in PLANS:
        try:
            plan = make_plan(name, graph, n)
        except TpplanError:
            continue
        yield name, plan


def _predictor(graph, plan, dep):  # type: ignore[no-untyped-def]
    try:
        p = Predictor(graph, plan, TOPO, dep, "bf16", None)
    except TpplanError:  # the model does not split this way
        return None
    return p if p.audit.legal else None


@pytest.mark.parametrize("model", MODELS)
def test_kernels_and_collectives_equal_the_cost_models(model: str) -> None:
    """Per layer: the kernels' per-rank shapes and redundancy equal `OpPrices.op_time`'s, the layout
    copies equal the priced ones, and the collectives (kind, label, priced bytes) equal the priced ones."""
    graph = build_model_graph(load_model(model))
    checked = 0
    for n in (2, 4, 8):
        for name, plan in _plans(graph, n):
            p = _predictor(graph, plan, Mesh(n))
            if p is None:
                continue
            segs = ((5 * n + 3, 0), (2 * n, 7))
            prog = lower(graph, plan, p.deployment, Batch(segs, "bf16"), results=p.audit.layer_results,
                         gpus_per_node=TOPO.gpus_per_node)  # fmt: skip
            for layer in prog.layers:
                kt = p.kind_time(p.audit.layer_results[layer.index], segs)
                priced = [o for o in kt.ops if o.role != "layout"]
                kernels = [k for k in layer.kernels() if k.repeat_of is None]
                assert [k.op for k in kernels] == [o.op for o in priced], (model, name, n)
                for k, o in zip(kernels, priced, strict=True):
                    assert k.shape == o.shape, (model, name, n, k.op)
                    assert k.redundant == o.redundant or not (o.flops_per_rank or o.bytes_per_rank), (name, k.op)
                copies = [o.op for o in kt.ops if o.role == "layout"]
                assert [c.name for c in layer.copies()] == copies, (model, name, n)
                colls = [c for c in layer.collectives() if c.priced]
                assert [(c.kind, c.label) for c in colls] == [(c.kind, c.label) for c in kt.collectives]
                for c, ct in zip(colls, kt.collectives, strict=True):
                    assert c.priced_bytes == ct.nbytes, (model, name, n, c.label)
                checked += 1
    assert checked


@pytest.mark.parametrize("model", [m for m in MODELS if m.startswith("tiny-")] + ["kimi-k3"])
def test_collectives_equal_the_runtime_schedule(model: str) -> None:
    """The program's collectives, in order, are the calls `predict_schedule` lists for the runtime's
    trace (kind, value, shape, dtype, bytes, bytes sent), MoE all-to-all rows from a routing included."""
    graph = build_model_graph(load_model(model))
    checked = 0
    for n in (2, 4):
        for name, plan in _plans(graph, n):
            if _predictor(graph, plan, Mesh(n)) is None:
                continue
            for tokens in (4 * n, 4 * n + 1):
                sched = predict_schedule(graph, plan, n, tokens, dtype="float32", rank=1)[0]
                if sched.fallback:
                    continue
                prog = lower(graph, plan, Mesh(n), Batch(((tokens, 0),), "float32", rank=1))
                got = [(c.kind, c.value, c.shape, c.dtype, c.bytes, c.sent_bytes) for c in prog.collectives()]
                want = [(c.kind, c.value, c.shape, c.dtype, c.bytes, c.sent_bytes) for c in sched.calls]
                assert got == want, (model, name, n, tokens)
                checked += 1
    assert checked


def test_moe_all_to_all_rows_from_routing_equal_the_schedule() -> None:
    graph = build_model_graph(load_model("tiny-qwen3-moe"))
    plan = make_plan("sp-moe", graph, 2)
    routes = {layer: [[0, 1], [0, 5], [6, 7], [2, 7]] for layer in range(graph.spec.num_layers)}
    (s,) = predict_schedule(graph, plan, 2, 4, rank=0, routes={(0, k): v for k, v in routes.items()})
    prog = lower(graph, plan, Mesh(2), Batch(((4, 0),), "float32", rank=0, routes=routes))
    assert [(c.value, c.shape, c.bytes, c.sent_bytes) for c in prog.collectives()] == [
        (c.value, c.shape, c.bytes, c.sent_bytes) for c in s.calls
    ]


@pytest.mark.parametrize(("model", "cp", "layers", "n"), [("tiny-deepseek-v3", 2, "all", 2),
    ("tiny-qwen3-next", 2, "all", 2), ("tiny-kimi-linear", 4, "all", 2), ("tiny-deepseek-v3", 2, "mla", 4),
    ("tiny-kimi-k3", 2, "mla", 2), ("tiny-qwen3-next", 2, "all", 1)])  # fmt: skip
def test_context_parallel_steps_equal_the_cost_models(model: str, cp: int, layers: str, n: int) -> None:
    """Under CP: the CP exchanges (kind, label, bytes, group), the extra local passes and the
    collectives an MLA layer's exchanges replace, as the cost model lists them."""
    graph = build_model_graph(load_model(model))
    for recurrence in ("scan", "serial"):
        dep = Mesh(n, cp=cp, cp_layers=layers, cp_recurrence=recurrence)
        p = _predictor(graph, make_plan("baseline", graph, n), dep)
        assert p is not None
        segs = ((37, 0), (20, 11))
        prog = lower(graph, p.plan, dep, Batch(segs, "bf16"), results=p.audit.layer_results, gpus_per_node=8)
        for layer in prog.layers:
            kt = p.kind_time(p.audit.layer_results[layer.index], segs)
            colls = [(c.kind, c.label, c.priced_bytes) for c in layer.collectives() if c.priced]
            assert colls == [(c.kind, c.label, c.nbytes) for c in kt.collectives], (model, layers, layer.index)
            extra = [(k.op, k.redundant) for k in layer.kernels() if k.repeat_of is not None]
            assert extra == [(o.op, o.redundant) for o in kt.ops if ":cp_" in o.op]
            assert [c.name for c in layer.copies()] == [o.op for o in kt.ops if o.role == "layout"]


PIPELINES = [("tiny-kimi-k3", "baseline", 2, 2), ("tiny-deepseek-v3", "sequence-parallel", 4, 2),
             ("tiny-llama", "baseline", 4, 2), ("kimi-k3", "sp-moe", 8, 4)]  # fmt: skip


@pytest.mark.parametrize(("model", "plan", "tp", "pp"), PIPELINES)
def test_pipeline_stages_and_boundaries_equal_the_cost_models(model: str, plan: str, tp: int, pp: int) -> None:
    graph = build_model_graph(load_model(model))
    dep = Mesh(tp, pp)
    p = _predictor(graph, make_plan(plan, graph, tp), dep)
    assert p is not None
    prog = lower(graph, p.plan, dep, Batch(((1000, 0),), "bf16"), results=p.audit.layer_results, gpus_per_node=8)
    assert [tuple(layer.index for layer in s.layers) for s in prog.stages] == [tuple(r) for r in p.stages]
    for s, r in zip(prog.stages[:-1], p.stages, strict=False):
        assert s.send is not None and s.send.layer == r.stop
        assert s.send.bytes == 1000 * s.send.width * 2 / tp
    assert prog.stages[-1].send is None


def test_overlap_and_async_tp_are_named_in_the_program() -> None:
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    tbo = lower(graph, make_plan("sp-moe+tbo", graph, 4), Mesh(4), Batch(((600, 0), (600, 0)), "bf16"))
    assert [m.segments for m in tbo.stages[0].micro_batches] == [((600, 0),), ((600, 0),)]
    fused = lower(graph, make_plan("sequence-parallel+asynctp", graph, 4), Mesh(4), Batch(((64, 0),)))
    assert fused.fused and {f.pattern for f in fused.fused} == {"ag_gemm", "gemm_rs"}
    gemms = {k.op for k in fused.layers[0].steps if isinstance(k, KernelCall) and k.cost_class == "gemm"}
    assert {g for f in fused.fused if f.layer == 0 and not f.from_previous for g in f.gemms} <= gemms
