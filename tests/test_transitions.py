"""Every placement transition, walked pair by pair: the planner's volume, the schedule's buffer and
the cost model's bytes agree, and the runtime runs each declared transition moving exactly the
predicted bytes (gloo, 2 ranks)."""

from __future__ import annotations

import math

import pytest

from tpplan.cost.predict import cached_predictor
from tpplan.cost.topology import load_topology
from tpplan.layout.schedule import ring_sent_bytes
from tpplan.layout.transitions import TRANSITIONS, transition
from tpplan.lower.schedule import predict_schedule
from tpplan.lower.sizes import nccl_bytes
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.placement import S_COL, S_TOK, Collective, P, Placement, R
from tpplan.plans.named import make_plan

# (width, heads, n, tokens): heads dividing N, shared GQA heads (2 heads on 4 ranks), a value
# without heads, token counts that do and do not divide N.
CASES = [(64, 8, 2, 6), (64, 8, 4, 8), (64, 2, 4, 12), (48, 0, 2, 4), (64, 8, 4, 10), (64, 2, 4, 7)]
ISZ = 2  # bf16


def _collective_pairs() -> list[tuple[Placement, Placement]]:
    return [k for k, t in TRANSITIONS.items() if not t.free]


def test_the_table_is_what_the_planner_can_emit() -> None:
    """Free steps only out of R; a collective for every other declared pair; S(col) -> S(tok) and
    P -> S(col) are not declared (no plan decision asks for them: docs/design.md)."""
    assert {k for k, t in TRANSITIONS.items() if t.free} == {(R, S_TOK), (R, S_COL), (R, P)}
    assert set(_collective_pairs()) == {(P, R), (P, S_TOK), (S_TOK, R), (S_COL, R), (S_TOK, S_COL)}
    assert transition(S_COL, S_TOK) is None and transition(P, S_COL) is None
    assert all(transition(p, p).free for p in Placement)


@pytest.mark.parametrize(("src", "dst"), _collective_pairs(), ids=lambda p: str(p))
def test_volume_equals_schedule_bytes_equals_cost_bytes(src: Placement, dst: Placement) -> None:
    """Three formulas: the planner's ring volume over the logical [T, wire] tensor, the schedule's
    per-rank buffer with ring_sent_bytes, the cost model's nccl size from the volume. Equal when T
    divides over N; otherwise the schedule pads token-sharded buffers to N*ceil(T/N) rows."""
    move = TRANSITIONS[(src, dst)]
    assert move.collective is not None
    cases = [c for c in CASES if c[1]] if move.heads_side else CASES
    for width, heads, n, tokens in cases:
        shape = move.call_shape(width, heads, n, tokens)
        call_bytes = math.prod(shape) * ISZ
        padded = move.collective is not Collective.ALL_REDUCE and not (move.collective is Collective.ALL_GATHER
                                                                       and src is S_COL)  # fmt: skip
        t_eff = -(-tokens // n) * n if padded else tokens
        volume = move.elements_per_rank(width, heads, n, t_eff) * ISZ
        assert ring_sent_bytes(move.collective, call_bytes, n) == pytest.approx(volume, rel=1e-12), (width, n, tokens)
        assert call_bytes == pytest.approx(nccl_bytes(move.collective.value, volume / ISZ, n, ISZ), rel=1e-12)
        if tokens % n == 0:
            assert t_eff == tokens  # no padding: the unpadded volume is the schedule's
    # Shared heads: 2 KV heads on 4 ranks move 4 heads' columns, not 2.
    if move.heads_side:
        assert move.wire_width(64, 2, 4) == 128 and move.wire_width(64, 8, 4) == 64


REAL = [("tiny-kimi-k3", "gate-aware", 2), ("tiny-kimi-k3", "input-scattered+restore", 4),
        ("tiny-llama", "sequence-parallel", 4), ("tiny-qwen3-next", "baseline", 2)]  # fmt: skip


@pytest.mark.parametrize(("model", "plan", "n"), REAL)
def test_real_plans_event_by_event(model: str, plan: str, n: int) -> None:
    """On real graphs: each planned collective's volume (audit), its scheduled call and the cost
    model's bytes and layout copy agree, event by event, at T a multiple of N and at T that is not."""
    graph = build_model_graph(load_model(model))
    p = make_plan(plan, graph, n)
    pred = cached_predictor(graph, p, load_topology("h200x8-ib400"), Mesh(n, pp=1), "bf16", None)
    seen = set()
    for tokens in (4 * n, 4 * n + 1):
        calls = [c for c in predict_schedule(graph, p, n, tokens, dtype="bf16")[0].calls if ":" not in c.value]
        events = [(i, c) for i, r in enumerate(pred.audit.layer_results) for c in r.comms if not c.internal]
        assert len(calls) == len(events) + (pred.audit.final_elements_per_token > 0)
        for (i, ev), call in zip(events, calls, strict=False):
            assert (call.layer, call.value, call.kind) == (i, ev.value, ev.collective.value)
            seen.add((ev.src, ev.dst))
            kt = pred.kind_time(pred.audit.layer_results[i], ((tokens, 0),))
            cost = next(c for c in kt.collectives if c.label == ev.label)
            if tokens % n == 0:
                assert call.sent_bytes == pytest.approx(ev.elements_per_token * tokens * 2, rel=1e-12)
                assert cost.nbytes == pytest.approx(call.bytes, rel=1e-12)
            else:  # the schedule pads token-sharded buffers; the cost model prices the real rows
                assert call.bytes >= cost.nbytes
            val = graph.kinds[graph.layer_kinds[i]].values[ev.value]
            want = TRANSITIONS[(ev.src, ev.dst)].layout_copy(ev.value, val.width, val.heads, n, tokens)
            copies = [o for o in kt.ops if o.role == "layout" and o.op.split(":", 1)[1] == ev.value]
            assert [o.op for o in copies] == ([want.name] if want else [])
            if want:
                assert copies[0].bytes_per_rank == want.elements * 2
    assert seen  # the plan issued collectives


def test_named_plans_cover_every_collective_transition() -> None:
    """Together, a few named plans on tiny models issue every declared collective transition, so the
    runtime test below exercises transitions that plans really use."""
    used = set()
    for model, plan, n in REAL:
        graph = build_model_graph(load_model(model))
        pa = cached_predictor(
            graph, make_plan(plan, graph, n), load_topology("h200x8-ib400"), Mesh(n, pp=1), "bf16", None
        ).audit
        used |= {(c.src, c.dst) for r in pa.layer_results for c in r.comms if not c.internal}
    assert used >= {(P, R), (P, S_TOK), (S_TOK, R), (S_TOK, S_COL)}
    assert used <= set(_collective_pairs())


# -- the runtime ------------------------------------------------------------------------------


def _local(full, pl: Placement, heads: int, n: int, rank: int):  # type: ignore[no-untyped-def]
    """This rank's tensor of the true value `full` [T, W] held as `pl`."""
    import torch

    from tpplan.runtime.shard import head_range

    t = full.shape[0]
    per = -(-t // n)
    if pl is R:
        return full.clone()
    if pl is S_TOK:
        rows = full[rank * per : (rank + 1) * per]
        return torch.cat([rows, rows.new_zeros(per - rows.shape[0], full.shape[1])])
    if pl is S_COL:
        lo, hi = head_range(heads, n, rank)
        w = full.shape[1] // heads
        return full[:, lo * w : hi * w].clone()
    return full * (rank + 1) / (n * (n + 1) / 2)  # P: summands adding up to the value


def _run_every_transition(rank: int, world: int, device: object, cases: list[tuple[int, int, int]]) -> list[str]:
    """On each rank: every declared transition on every case; raises on the first disagreement."""
    import torch

    from tpplan.runtime.distributed import Held, full_value
    from tpplan.runtime.trace import Comm, Tracer
    from tpplan.runtime.transitions import RUNTIME_TRANSITIONS, Move

    checked = []
    for (src, dst), move in TRANSITIONS.items():
        for width, heads, tokens in cases:
            if (src is S_COL or dst is S_COL) and not heads:
                continue
            torch.manual_seed(tokens * 1000 + width)
            full = torch.randn(tokens, width)
            comm = Comm(rank, world, Tracer(rank, world))
            copies: list[str] = []

            def layout(name, copy, *args, _copies=copies):  # type: ignore[no-untyped-def]
                _copies.append(name)
                return copy(*args)

            m = Move(comm, "x", heads, tokens, layout=layout)
            out = RUNTIME_TRANSITIONS[(src, dst)](m, _local(full, src, heads, world, rank))
            got = full_value(comm, Held(out, dst), heads, tokens)
            where = f"{src}->{dst} W={width} heads={heads} T={tokens} rank {rank}"
            assert torch.allclose(got, full, atol=1e-6), f"{where}: value changed"
            calls = comm.tracer.calls
            if move.collective is None:
                assert not calls and not copies, f"{where}: a free step moved data"
            else:
                assert [c.kind for c in calls] == [move.collective.value], where
                nbytes = math.prod(move.call_shape(width, heads, world, tokens)) * 4
                assert calls[0].bytes == nbytes, f"{where}: moved {calls[0].bytes} B, predicted {nbytes}"
                assert calls[0].sent_bytes == ring_sent_bytes(move.collective.value, nbytes, world), where
                want = move.layout_copy("x", width, heads, world, tokens)
                assert copies == ([want.name] if want else []), f"{where}: copies {copies}"
            checked.append(f"{src}->{dst}")
    return checked


@pytest.mark.slow
def test_runtime_runs_every_declared_transition_moving_the_predicted_bytes() -> None:
    pytest.importorskip("torch")
    from tpplan.runtime.group import GroupSpec, run_group

    cases = [(16, 4, 6), (16, 4, 5), (16, 1, 4), (12, 0, 3)]  # heads dividing N, one head, no heads; T odd
    checked = run_group(_run_every_transition, GroupSpec("gloo", 2, 120), cases)
    assert set(checked) == {f"{s}->{d}" for s, d in TRANSITIONS}


def test_runtime_table_has_the_planner_keys() -> None:
    pytest.importorskip("torch")
    from tpplan.runtime.transitions import RUNTIME_TRANSITIONS

    assert RUNTIME_TRANSITIONS.keys() == TRANSITIONS.keys()
