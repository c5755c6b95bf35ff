"""Decode MoE's rows (issue 32): the engines' fused-MoE row tile as read from their default configs, the
experts a batch reaches, and the padded rows the grouped GEMMs are priced at."""

from __future__ import annotations

import itertools
import math

import pytest

from tpplan.cost.expert_rows import RUNTIME_TILE, active_experts, below_measured_rows, expert_rows
from tpplan.cost.kernel_models import KernelModels
from tpplan.cost.topology import load_gpu
from tpplan.engines.fused_moe import SGLANG_DEFAULT, UNREAD_TILE, VLLM_DEFAULT, row_tile


@pytest.mark.parametrize(
    ("engine", "tokens", "experts", "fmt", "rows"),
    [
        ("sglang@0.5.23", 8, 256, "fp8_block", 64),  # block-quant fp8: 64 at every M
        ("sglang@0.5.23", 4096, 256, "fp8_block", 64),
        ("sglang@0.5.23", 256, 256, "bf16", 16),  # other dtypes: 16 while M <= E
        ("sglang@0.5.23", 257, 256, "bf16", 64),
        ("sglang@0.5.23", 256, 256, "fp8", 64),  # per-tensor fp8: 64 while M <= E, else 128
        ("sglang@0.5.23", 257, 256, "fp8", 128),
        ("vllm@0.34.0", 64, 256, "fp8_block", 16),  # block-quant fp8: 16 up to M = 64
        ("vllm@0.34.0", 65, 256, "fp8_block", 64),
        ("vllm@0.34.0", 32, 8, "bf16", 16),  # general: 16 / 32 / 64 / 128 at M <= 32 / 96 / 512 / more
        ("vllm@0.34.0", 33, 8, "bf16", 32),
        ("vllm@0.34.0", 512, 8, "bf16", 64),
        ("vllm@0.34.0", 513, 8, "bf16", 128),
        ("vllm", 20, 8, "int4", 16),  # wna16: 16 / 32 / 64 at M <= 20 / 40 / more
        ("vllm", 41, 8, "int4", 64),
    ],
)
def test_row_tile_follows_each_engines_default_config(engine: str, tokens: int, experts: int, fmt: str, rows: int):
    tile = row_tile(engine, tokens, experts, fmt)
    assert tile.rows == rows
    assert tile.source == (SGLANG_DEFAULT if engine.startswith("sglang") else VLLM_DEFAULT)
    assert tile.source.read


@pytest.mark.parametrize(("engine", "fmt"), [("trtllm@1.2", "bf16"), ("vllm", "mxfp4"), ("sglang", "nvfp4")])
def test_a_tile_nobody_read_stays_128_and_says_unread(engine: str, fmt: str):
    tile = row_tile(engine, 8, 32, fmt)
    assert tile.rows == UNREAD_TILE == 128
    assert not tile.source.read and "unread" in tile.source.cite()


def test_active_experts_equals_the_exact_expectation_by_enumeration():
    """Every way 3 tokens can each pick 2 distinct experts of 5: the mean count of experts 0-1 (a rank's
    two local experts) that some token reaches equals the closed form."""
    picks = list(itertools.combinations(range(5), 2))
    counts = [len({x for p in draw for x in p} & {0, 1}) for draw in itertools.product(picks, repeat=3)]
    assert active_experts(2, 5, 2, 3) == pytest.approx(sum(counts) / len(counts))
    assert active_experts(256, 256, 8, 10_000) == pytest.approx(256)  # prefill: every expert
    assert active_experts(256, 256, 8, 1) == pytest.approx(8)  # one token: its top-k


def test_decode_rows_pad_to_the_engines_tile_not_128():
    """DeepSeek-V3 at TP8, 8 decode tokens: 64 rows over the ~57 experts they reach, one tile each."""
    share = expert_rows("vllm@0.34.0", 256, 256, 8, 8, 64.0, "fp8_block")
    assert share.active == round(256 * (1 - (1 - 8 / 256) ** 8)) == 57
    assert share.padded == 57 * 16 < 57 * 128
    runtime = expert_rows(None, 256, 256, 8, 8, 64.0, "fp8_block")  # tpplan's own runtime, re-predicted
    assert runtime.tile == RUNTIME_TILE and runtime.padded == 57 * 128
    big = expert_rows("vllm@0.34.0", 256, 256, 8, 8192, 65536.0, "fp8_block")  # prefill: 256 rows each
    assert big.active == 256 and big.padded == 256 * 64 * math.ceil(256 / 64)


def test_below_the_experts_models_rows_the_engines_fused_kernel_is_priced():
    models = KernelModels(load_gpu("h200-measured").kernel_models)
    floor = models.consts["experts"]["min_rows_per_expert"]
    assert isinstance(floor, float)
    assert below_measured_rows(models, floor / 2)
    assert not below_measured_rows(models, floor)
    assert not below_measured_rows(None, 1.0)  # no model: the roofline prices it anyway


def test_decode_experts_are_labelled_fused_only_where_the_tile_was_read() -> None:
    """`fused-moe-decode` (the label the decode band's MoE error applies to) marks experts padded to a tile read
    from the engine; mxfp4 experts (a kernel whose tile was not read) keep the GEMM table's label."""
    from tpplan.cost.predictor import cached_predictor
    from tpplan.cost.topology import select_topology
    from tpplan.mesh import Mesh
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.models.opkinds import op_kind
    from tpplan.plans.named import baseline

    topo = select_topology("h200x8-ib400", 1)
    graph = build_model_graph(load_model("tiny-mixtral"))
    seen = {}
    for expert_dtype in (None, "mxfp4"):
        pred = cached_predictor(graph, baseline(), topo, Mesh(2), "bf16", expert_dtype)
        res = next(r for r in pred.audit.layer_results if any(op_kind(d.op.kind).routed_experts for d in r.decisions))
        seen[expert_dtype] = {o.source for o in pred.kind_time(res, ((1, 512),) * 4).ops if o.category == "moe"}
    assert seen[None] == {"fused-moe-decode"}
    assert "fused-moe-decode" not in seen["mxfp4"]
