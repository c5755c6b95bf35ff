"""Layout copies around collectives: steps of their own in the runtime, ops of their own in the cost model.

The all-to-all to head-sharded sends per-destination column blocks (`pack:<value>`), a head
all-gather returns per-rank blocks to interleave (`unpack:<value>`), a reduce-scatter of T rows
not divisible by N needs padding (`pack:<value>`). The runtime runs each as its own step
(`PlanRunner._layout`, listed in `Tracer.copies`), never inside the traced collective call, and
the cost model prices the same copies (`Predictor.layout_copy`, by `CollectivePricer.copy`).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tpplan.audit import audit  # noqa: E402
from tpplan.cost.predict import cached_predictor  # noqa: E402
from tpplan.cost.topology import load_topology  # noqa: E402
from tpplan.layout.schedule import chunk_sizes, falls_back  # noqa: E402
from tpplan.mesh import Mesh  # noqa: E402
from tpplan.models.config import load_model  # noqa: E402
from tpplan.models.graph import build_model_graph  # noqa: E402
from tpplan.plans.named import make_plan  # noqa: E402
from tpplan.runtime.shard import head_range  # noqa: E402
from tpplan.runtime.trace import Comm, Tracer  # noqa: E402
from tpplan.runtime.verify import VerifyCase, verify_cases  # noqa: E402

PLANS = ["baseline", "gate-aware", "sequence-parallel"]


def _predicted_copies(model: str, plan_name: str, n: int, tokens: int, chunk: int) -> list[tuple[int, int, str]]:
    """(chunk, layer, op) of every layout op the cost model prices, for the chunks that run the plan."""
    graph = build_model_graph(load_model(model))
    plan = make_plan(plan_name, graph, n)
    p = cached_predictor(graph, plan, load_topology("h200x8-ib400"), Mesh(n, pp=1), "fp32", None)
    out = []
    for c, t in enumerate(chunk_sizes(tokens, chunk)):
        if falls_back(graph, plan, n, t):
            continue  # the baseline plan runs this chunk: no layout copies
        for i, res in enumerate(p.audit.layer_results):
            out += [(c, i, o.op) for o in p.kind_time(res, ((t, 0),)).ops if o.role == "layout"]
    return sorted(out)


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_layout_copies_run_outside_the_collectives_and_are_the_priced_ones(n: int) -> None:
    # tiny-llama at N = 4: 2 KV heads, so the all-to-all of k and v packs shared heads
    models = ["tiny-kimi-k3", "tiny-llama"]
    assert all(pa.legal for m in models for pa in audit(m, n, PLANS).plans)
    cases = [VerifyCase(m, p, tokens=6, chunk=5) for m in models for p in PLANS]
    results = verify_cases(cases, nproc=n, timeout_s=120)
    assert len(results) == len(cases)
    for r in results:
        m, name = r.case.model, r.case.plan
        assert r.trace_matches, f"{r.case.label}: traced collectives differ from the predicted schedule"
        assert r.numbers_match and r.max_rel < 1e-4, r.case.label
        layers = build_model_graph(load_model(m)).spec.num_layers
        got = sorted(x for x in r.copies if x[1] < layers)  # the padding before the final norm is not a layer's
        assert got == _predicted_copies(m, name, n, 6, 5), r.case.label
        if name == "baseline":
            assert r.copies == []
        # From the trace: one pack per all-to-all to head-sharded, one per reduce-scatter whose chunk (5
        # tokens, then 1 run by the baseline plan) is not a multiple of N, the one before the final norm too.
        sizes = chunk_sizes(6, 5)
        want = [(c.chunk, c.layer, f"pack:{c.value}") for c in r.traced[0]
                if c.kind == "all_to_all" or (c.kind == "reduce_scatter" and sizes[c.chunk] % n)]  # fmt: skip
        assert sorted(r.copies) == sorted(want), r.case.label
        if name == "gate-aware":
            assert any(c.kind == "all_to_all" for c in r.traced[0]) and not any(x[0] == 1 for x in r.copies)


def test_pack_and_unpack_are_the_only_copies() -> None:
    """The pure layout steps (no process group needed): blocks per destination, interleaving with
    shared heads, and no copy where the layout is already right."""
    full = torch.arange(6 * 16, dtype=torch.float32).reshape(6, 16)  # [T, W]
    for n, heads in ((2, 4), (4, 8), (4, 2), (4, 1)):
        comm = Comm(0, n, Tracer(0, n))
        per_head = 16 // heads
        cols = [slice(head_range(heads, n, r)[0] * per_head, head_range(heads, n, r)[1] * per_head) for r in range(n)]
        rows = full[:3]
        packed = comm.pack_heads(rows, heads)
        assert packed.shape == (n, 3, cols[0].stop - cols[0].start) and packed.is_contiguous()
        for j in range(n):
            assert torch.equal(packed[j], rows[:, cols[j]])
        gathered = torch.stack([full[:, cols[r]] for r in range(n)])  # what the head all-gather returns
        value = comm.unpack_heads(gathered, heads)
        assert torch.equal(value, full)
        assert comm.unpack_copies(heads) == (heads > 1)
        if heads == 1:
            assert value.untyped_storage().data_ptr() == gathered.untyped_storage().data_ptr()  # a view, no copy
    one = Comm(0, 1, Tracer(0, 1))
    assert one.pack_heads(full, 4) is full and one.pad_tokens(full, 6) is full and not one.unpack_copies(4)
    two = Comm(0, 2, Tracer(0, 2))
    assert two.pad_tokens(full, 6) is full
    padded = two.pad_tokens(full[:5], 5)
    assert padded.shape == (6, 16) and torch.equal(padded[:5], full[:5]) and not padded[5].any()
    assert not Tracer(0, 2).calls  # layout steps record no collective
