"""One GQA + MoE decode step worked by hand from the config (issue 32): tiny-mixtral at TP 2 on an H100
priced by its datasheet (analytic GEMMs, roofline attention, the cluster's NCCL curve), 24 requests each
reading 16,384 cached tokens. Every term is computed here from the config numbers: the projections' GEMM
shapes at M = the batch, the routed experts at decode size (rows routed per rank, the experts a batch
reaches, each padded to the row tile of SGLang 0.5.23's fused-MoE kernel, the default engine), each
request's attention over its own KV, the two all-reduces per layer; and the step is their sum per layer
times the layers, plus the final reduction."""

from __future__ import annotations

import math

import pytest

from tpplan.cost.gemm import gemm_bytes, gemm_time
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import select_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline

B, CTX, TP = 24, 16384, 2


@pytest.fixture(scope="module")
def step():  # type: ignore[no-untyped-def]
    graph = build_model_graph(load_model("tiny-mixtral"))
    topo = select_topology("h100x8-ib400", 1, gpu="h100-datasheet")
    p = cached_predictor(graph, baseline(), topo, Mesh(TP), "bf16", None)
    segs = ((1, CTX),) * B
    res = p.audit.layer_results[0]
    return p, res, p.kind_time(res, segs), segs


def _ops(kt) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {o.op: o for o in kt.ops}


def test_projections_run_at_m_equal_the_batch_with_the_config_widths(step) -> None:  # type: ignore[no-untyped-def]
    p, _, kt, _ = step
    spec = p.graph.spec
    a = spec.layers[0].attn
    h = p.graph.hidden
    want = {"q_proj": (B, h, a.heads // TP * a.head_dim), "k_proj": (B, h, a.kv_heads // TP * a.head_dim),
            "v_proj": (B, h, a.kv_heads // TP * a.head_dim), "o_proj": (B, a.heads // TP * a.head_dim, h)}  # fmt: skip
    ops = _ops(kt)
    for name, shape in want.items():
        o = ops[name]
        assert o.shape == shape, name  # type: ignore[attr-defined]
        assert o.seconds == pytest.approx(gemm_time(*shape, p.topo.gpu, "bf16")), name  # type: ignore[attr-defined]


def test_routed_experts_at_decode_size_by_hand(step) -> None:  # type: ignore[no-untyped-def]
    """Every rank runs every expert on its 1/TP slice of the intermediate (baseline: TP experts); B x top_k
    rows over the experts B tokens reach under uniform routing (E (1 - (1 - k/E)^B)), each padded to SGLang
    0.5.23's bf16 row tile (`get_default_config`: 16 rows for M <= E tokens, else 64); per GEMM the larger
    of the padded compute and the weights + activations read."""
    p, res, kt, _ = step
    d = next(d for d in res.decisions if d.op.name == "experts")
    e, k, width, inter = (d.op.int_attr(x) for x in ("experts", "top_k", "width", "intermediate"))
    rows = B * k
    active = round(e * (1 - (1 - k / e) ** B))
    tile = 16 if e >= B else 64
    m_pad = active * tile * math.ceil(rows / active / tile)
    assert rows < m_pad < active * 128  # the tile pads, less than the 128-row tile charged before
    i_loc, hbm, gpu = inter // TP, p.topo.gpu.hbm_TBps * 1e12, p.topo.gpu
    by_hand = 0.0
    for kk, nn in ((width, 2 * i_loc), (i_loc, width)):
        weights = active * kk * nn * 2  # bf16
        act = gemm_bytes(rows, kk, nn, "bf16") - kk * nn * 2
        by_hand += max(gemm_time(m_pad, kk, nn, gpu, "bf16"), (act + weights) / hbm)
    assert _ops(kt)["experts"].seconds == pytest.approx(by_hand)  # type: ignore[attr-defined]


def test_attention_reads_each_requests_kv_by_hand(step) -> None:  # type: ignore[no-untyped-def]
    """Each new token attends its CTX cached keys and itself: flops over B (CTX + 1) pairs, bytes the cached
    K and V of this rank's KV heads for B x CTX tokens plus the step's own q, k, v and output rows."""
    p, res, kt, _ = step
    a = p.graph.spec.layers[0].attn
    d = next(d for d in res.decisions if d.op.name == "attention")
    share = d.compute_share
    pairs = B * (CTX + 1)
    flops = 2 * 2 * a.heads * a.head_dim * pairs * share  # QK^T and PV
    kv_width = 2 * a.kv_heads * a.head_dim  # K and V, every head (the op's inputs), this rank's share below
    rows_width = (a.heads + 2 * a.kv_heads + a.heads) * a.head_dim  # q, k, v in; attention out
    nbytes = (rows_width * B + CTX * B * kv_width) * 2 * share
    gpu = p.topo.gpu
    by_hand = max(flops / (gpu.peak_tflops("bf16") * 1e12 * gpu.attn_efficiency), nbytes / (gpu.hbm_TBps * 1e12), 3e-6)
    assert nbytes / (gpu.hbm_TBps * 1e12) > 3e-6  # past the kernel floor: the KV read sets it
    assert _ops(kt)["attention"].seconds == pytest.approx(by_hand)  # type: ignore[attr-defined]


def test_the_step_is_its_layers_parts_plus_the_final_reduction(step) -> None:  # type: ignore[no-untyped-def]
    p, _, kt, segs = step
    h = p.graph.hidden
    assert [c.kind for c in kt.collectives] == ["all_reduce", "all_reduce"]  # attention out, MoE out
    assert all(c.nbytes == B * h * 2 for c in kt.collectives)  # B rows of the bf16 stream
    per_layer = math.fsum(o.seconds for o in kt.ops) + math.fsum(c.seconds for c in kt.collectives)
    layers = len(p.graph.spec.layers)
    assert p.counts[kt.kind] == layers
    stages, sends, final = p.stage_times(segs)
    assert sends == [0.0] and final >= 0
    assert stages[0] == pytest.approx(layers * per_layer + final)
