"""The program `lower` builds, checked against what it is made from: one kernel per op decision at the
per-rank shape its weight split gives, collectives that carry the audit's volume, CP exchanges as the
CP audit lists them, pipeline stages and boundaries, micro-batches and fused pairs; on tiny presets and
real configs under TP, SP, EP, MoE all-to-all, DP attention, CP, PP and overlap.

The cost model (`Predictor.kind_time`) and the runtime's expected trace (`lower.schedule`) read this
program, so they are not compared with it here. Before they read it, both were asserted equal to it:
the kind times and stage times of the old cost code byte-identical on 3,780 cases (15 models, 7
meshes with PP, CP all/mla, scan/serial, 14 plans, 3 batches, and the search's `Pricer`), and the old
schedule's calls on 9,408 schedules (the commits that made them read it say how)."""

from __future__ import annotations

import math

import pytest

from tpplan.audit import audit_plan
from tpplan.errors import TpplanError
from tpplan.layout.context_parallel import audit_cp
from tpplan.lower import Batch, Collective, KernelCall, lower, lower_outline, lower_program, lowering
from tpplan.lower.passes.cp import exchange_bytes
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import OpKind, build_model_graph
from tpplan.plans.named import make_plan

PLANS = ("baseline", "input-scattered", "sequence-parallel", "gate-aware", "sp-moe", "ep2", "dp-attention",
         "dp-attention-maxlen", "sp-moe+tbo", "sequence-parallel+asynctp", "input-scattered+restore")  # fmt: skip
MODELS = ("tiny-deepseek-v3", "tiny-kimi-k3", "tiny-qwen3-next", "tiny-llama", "tiny-qwen3-moe", "tiny-gpt-oss",
          "tiny-kimi-linear", "tiny-gemma3", "kimi-k3", "deepseek-v3")  # fmt: skip


def _legal(graph, n):  # type: ignore[no-untyped-def]
    for name in PLANS:
        try:
            plan = make_plan(name, graph, n)
            pa = audit_plan(graph, plan, n, "bf16")
        except TpplanError:
            continue
        if pa.legal:
            yield name, plan, pa


@pytest.mark.parametrize("model", MODELS)
def test_one_kernel_per_decision_at_its_weight_split(model: str) -> None:
    """Each layer runs one kernel per op decision, in order; a linear GEMM on all T rows multiplies by
    the rank's weight share (K x N = its weight elements), a token-sharded one by the whole weight on
    ceil(T/N) rows; routed experts never count as repeated work."""
    graph = build_model_graph(load_model(model))
    seen = 0
    for n in (2, 4, 8):
        for name, plan, pa in _legal(graph, n):
            t = 5 * n + 3
            prog = lower(graph, plan, Mesh(n), Batch(((t, 0),)), results=pa.layer_results)
            for layer in prog.layers:
                res = pa.layer_results[layer.index]
                kernels = [k for k in layer.kernels() if k.repeat_of is None]
                assert [k.decision for k in kernels] == res.decisions
                for k in kernels:
                    d = k.decision
                    if k.cost_class == "experts":
                        assert not k.redundant
                    if k.cost_class != "gemm" or d.op.kind is not OpKind.LINEAR or d.split == "replicated":
                        continue
                    assert k.shape is not None
                    m, kk, nn = k.shape
                    if m == t:
                        assert kk * nn == d.weight_elements_per_rank, (model, name, n, k.op)
                    else:
                        assert m == math.ceil(t / n) and kk * nn == d.op.weight_numel, (model, name, n, k.op)
                    seen += 1
    assert seen


@pytest.mark.parametrize("model", MODELS)
def test_collectives_carry_the_audits_volume(model: str) -> None:
    """At T a multiple of N, what a rank sends over the program's collectives is the audit's volume per
    token times T (MoE all-to-all, data-dependent, aside), and every collective's priced bytes are the
    bytes of its buffer where no value is wider than the activations."""
    graph = build_model_graph(load_model(model))
    for n in (2, 4):
        for name, plan, pa in _legal(graph, n):
            if plan.moe == "a2a":
                continue
            t = 3 * n
            prog = lower(graph, plan, Mesh(n), Batch(((t, 0),), "bf16"), results=pa.layer_results)
            colls = prog.collectives()
            assert sum(c.sent_bytes for c in colls) == pytest.approx(pa.comm_bytes_per_token * t, rel=1e-12)
            for c in colls:
                if c.dtype == "bfloat16":
                    assert c.priced_bytes == pytest.approx(c.bytes, rel=1e-12), (model, name, c.label)


@pytest.mark.parametrize(("model", "cp", "layers", "n"), [("tiny-deepseek-v3", 2, "all", 2),
    ("tiny-qwen3-next", 2, "all", 2), ("tiny-kimi-linear", 4, "all", 2), ("tiny-deepseek-v3", 2, "mla", 4),
    ("tiny-kimi-k3", 2, "mla", 2), ("tiny-qwen3-next", 2, "all", 1)])  # fmt: skip
def test_context_parallel_steps_are_the_cp_audits(model: str, cp: int, layers: str, n: int) -> None:
    """Under CP: each layer's CP steps are its kind's exchanges in order, on the CP group (or, `mla`, the
    attention-TP ranks), sized for the batch; a recurrence's hand-off adds its extra passes; the planned
    collective an `mla` exchange replaces is gone, with its layout copies."""
    graph = build_model_graph(load_model(model))
    segs = ((37, 0), (20, 11))
    for recurrence in ("scan", "serial"):
        mesh = Mesh(n, cp=cp, cp_layers=layers, cp_recurrence=recurrence)
        prog = lower(graph, make_plan("baseline", graph, n), mesh, Batch(segs, "bf16"), gpus_per_node=8)
        audit = audit_cp(graph, mesh)
        for layer in prog.layers:
            ck = audit.kinds[layer.kind]
            steps = [c for c in layer.collectives() if c.origin == "cp"]
            assert [c.label for c in steps] == [x.label() for x in ck.exchanges]
            for c, x in zip(steps, ck.exchanges, strict=True):
                assert c.priced_bytes == exchange_bytes(x, cp, segs, 2)
                assert c.group == (audit.attn_tp if x.group == "attn_tp" else 2 if x.collective == "send_recv" else cp)
            assert not {c.value for c in layer.collectives() if c.origin != "cp"} & set(ck.replaces)
            assert not {c.value for c in layer.copies()} & set(ck.replaces)
            extra = [k for k in layer.kernels() if k.repeat_of is not None]
            states = [x for x in ck.exchanges if x.method in ("state_scan", "state_serial")]
            assert [k.repeat_of for k in extra if not k.redundant] == [x.op for x in states]
            for k in extra:
                if k.op.endswith("cp_chain_wait"):
                    assert k.times == cp - 1


PIPELINES = [("tiny-kimi-k3", "baseline", 2, 2), ("tiny-deepseek-v3", "sequence-parallel", 4, 2),
             ("tiny-llama", "baseline", 4, 2), ("kimi-k3", "sp-moe", 8, 4)]  # fmt: skip


@pytest.mark.parametrize(("model", "plan", "tp", "pp"), PIPELINES)
def test_pipeline_stages_and_boundaries(model: str, plan: str, tp: int, pp: int) -> None:
    """Contiguous stages covering every layer once, the final reduction in the last, a send into every
    other stage of the rank's 1/TP slice of what crosses (2H, or K3's H plus its bank)."""
    graph = build_model_graph(load_model(model))
    prog = lower(graph, make_plan(plan, graph, tp), Mesh(tp, pp), Batch(((1000, 0),), "bf16"), gpus_per_node=8)
    assert [layer.index for s in prog.stages for layer in s.layers] == list(range(graph.spec.num_layers))
    assert len(prog.stages) == pp and all(not s.final for s in prog.stages[:-1])
    for s in prog.stages[:-1]:
        assert s.send is not None and s.send.layer == s.layers[-1].index + 1
        h = graph.hidden
        assert s.send.width > h and s.send.width % h == 0 if graph.spec.attn_res_block_size else s.send.width == 2 * h
        assert s.send.bytes == 1000 * s.send.width * 2 / tp
        assert s.send.gather is not None and s.send.gather.bytes == 1000 * s.send.width * 2
    assert prog.stages[-1].send is None


@pytest.mark.parametrize(("model", "plan", "tp", "pp"), PIPELINES)
def test_the_outline_has_the_programs_stages_sends_and_final(model: str, plan: str, tp: int, pp: int) -> None:
    """What the cost model prices stage sends and the final reduction from equals the full program's."""
    graph = build_model_graph(load_model(model))
    ctx = lowering(graph, make_plan(plan, graph, tp), Mesh(tp, pp), Batch(((999, 0),)), gpus_per_node=8)
    full, outline = lower_program(ctx), lower_outline(ctx)
    assert [(s.send, s.final, s.micro_batches) for s in full.stages] == [
        (s.send, s.final, s.micro_batches) for s in outline.stages
    ]
    assert [[x.index for x in s.layers] for s in full.stages] == [[x.index for x in s.layers] for s in outline.stages]
    assert not any(x.steps for x in outline.layers) and all(x.steps for x in full.layers)


def test_overlap_and_async_tp_are_named_in_the_program() -> None:
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    tbo = lower(graph, make_plan("sp-moe+tbo", graph, 4), Mesh(4), Batch(((600, 0), (600, 0)), "bf16"))
    assert [m.segments for m in tbo.stages[0].micro_batches] == [((600, 0),), ((600, 0),)]
    fused = lower(graph, make_plan("sequence-parallel+asynctp", graph, 4), Mesh(4), Batch(((64, 0),)))
    assert fused.fused and {f.pattern for f in fused.fused} == {"ag_gemm", "gemm_rs"}
    gemms = {k.op for k in fused.layers[0].steps if isinstance(k, KernelCall) and k.cost_class == "gemm"}
    assert {g for f in fused.fused if f.layer == 0 and not f.from_previous for g in f.gemms} <= gemms
    values = {c.value for c in fused.layers[0].steps if isinstance(c, Collective)}
    assert {f.collective for f in fused.fused if f.layer == 0} <= values


def test_moe_all_to_all_rows_follow_the_routing() -> None:
    """With a routing, rank 0 of two dispatches each of its tokens once to every rank hosting one of its
    experts, its rows widened by the routing weights, and combines what its experts computed."""
    graph = build_model_graph(load_model("tiny-qwen3-moe"))  # 8 experts, top-2
    routes = {layer: [[0, 1], [0, 5], [6, 7], [2, 7]] for layer in range(graph.spec.num_layers)}
    prog = lower(graph, make_plan("sp-moe", graph, 2), Mesh(2), Batch(((4, 0),), "float32", 0, routes))
    counts, dispatch, combine = [c for c in prog.layers[0].collectives() if c.origin == "ep_a2a"]
    assert counts.shape == (2,) and not counts.priced
    assert dispatch.shape == (3, graph.hidden + 4) and combine.shape == (3, graph.hidden)
    steps = prog.layers[0].steps
    experts = next(i for i, s in enumerate(steps) if isinstance(s, KernelCall) and s.cost_class == "experts")
    assert steps.index(dispatch) < experts < steps.index(combine)


def test_a_collective_cp_replaces_is_not_fused() -> None:
    """Under `--cp-layers mla` the attention output's planned collective does not run (the CP exchanges
    take its place), so async TP fuses no GEMM with it; without CP it does."""
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    plan = make_plan("sequence-parallel+asynctp", graph, 4)
    plain = lower(graph, plan, Mesh(4), Batch(((64, 0),)))
    mla = lower(graph, plan, Mesh(4, cp=2, cp_layers="mla"), Batch(((64, 0),)))
    assert "attn_out" in {f.collective for f in plain.fused}
    assert "attn_out" not in {f.collective for f in mla.fused} and mla.fused
