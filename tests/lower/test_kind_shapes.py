"""Each op kind states its own per-rank kernel shape (`OpKindDef.shape`, `.expert_share`; issue 30):
the lowering asks the kind, so a kind the cost model prices by shape must state one, and the shapes
it states follow its weight split."""

from __future__ import annotations

import pytest

from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.models.opkinds import RankCtx, cost_class, op_kind
from tpplan.models.ops import Op, OpKind
from tpplan.placement import S_COL, P, R


@pytest.mark.parametrize("preset", ["tiny-deepseek-v3", "tiny-qwen3-next", "tiny-gpt-oss", "tiny-kimi-linear"])
def test_a_kind_states_a_shape_exactly_where_its_cost_class_is_priced_by_one(preset: str) -> None:
    graph = build_model_graph(load_model(preset))
    rc = RankCtx("col", R, rows=64, tokens=64, shards=2, weight_elements=1024)
    for lg in graph.kinds.values():
        for op in lg.ops:
            kind = op_kind(op.kind)
            shaped = cost_class(op) in ("gemm", "experts")
            assert (kind.shape(op, rc) is not None) is shaped, (preset, op.name, cost_class(op))
            assert (kind.expert_share(op, rc) is not None) is kind.routed_experts, (preset, op.name)


def _linear(out: int, inp: int) -> Op:
    return Op("proj", OpKind.LINEAR, ("x",), "y", "attn", weight="w", weight_shape=(out, inp))


def test_a_linear_runs_its_weight_slice_on_its_rows() -> None:
    shape = op_kind(OpKind.LINEAR).shape
    col = RankCtx("col", S_COL, rows=32, tokens=32, shards=4, weight_elements=256 * 128 // 4)
    row = RankCtx("row", P, rows=32, tokens=32, shards=4, weight_elements=256 * 128 // 4)
    local = RankCtx("col", S_COL, rows=8, tokens=32, shards=4, weight_elements=256 * 128)  # token rows only
    replicated = RankCtx("replicated", R, rows=32, tokens=32, shards=4, weight_elements=256 * 128)
    assert shape(_linear(256, 128), col) == (32, 128, 64)
    assert shape(_linear(256, 128), row) == (32, 32, 256)
    assert shape(_linear(256, 128), local) == (8, 128, 256)
    assert shape(_linear(256, 128), replicated) == (32, 128, 256)


def test_routed_experts_share_by_moe_mode() -> None:
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    op = next(o for lg in graph.kinds.values() for o in lg.ops if op_kind(o.kind).routed_experts)
    kind = op_kind(op.kind)
    e, k, inter = op.int_attr("experts"), op.int_attr("top_k"), op.int_attr("intermediate")
    t, n = 64, 4
    a2a = RankCtx("a2a", P, rows=t, tokens=t, shards=n, weight_elements=1)
    ep = RankCtx("ep", P, rows=t, tokens=t, shards=n, weight_elements=1, expert_groups=2)
    tp = RankCtx("tp", P, rows=t, tokens=t, shards=n, weight_elements=1)
    assert kind.expert_share(op, a2a) == (e // n, inter, t * k / n)
    assert kind.expert_share(op, ep) == (e // 2, inter // 2, t * k / 2)
    assert kind.expert_share(op, tp) == (e, inter // n, float(t * k))
    assert kind.shape(op, tp) == (t * k, op.int_attr("width"), 2 * (inter // n))
    redundant = RankCtx("a2a", P, rows=t, tokens=t, shards=n, weight_elements=1, redundant_experts=n)
    assert kind.expert_share(op, redundant) == ((e + n) // n, inter, t * k / n)  # the plan's physical experts
