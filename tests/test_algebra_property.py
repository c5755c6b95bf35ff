"""Property tests of the placement algebra, checked by simulating N virtual ranks with numpy.

For random small layer graphs and random plans:
- a plan `propagate` calls legal computes, rank by rank, exactly the values of the unsharded
  graph (every collective it applies is one the result records);
- every root violation it names really breaks the values: running the op the naive way (each rank
  uses the buffer it has as if it held the needed placement, no collective) gives a wrong output.

Restriction: a root violation whose only broken edges are S(tok)→P or S(col)→P is skipped. There a
naive run (own rows/columns, zeros elsewhere, read as a summand) is in fact correct: the table
lacks that free step, so the algebra is conservative there rather than wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tpplan.layout.plan import Plan
from tpplan.layout.propagate import propagate
from tpplan.layout.transitions import transition
from tpplan.models.graph import Block, LayerGraph, Op, OpKind, Value, WeightSplit
from tpplan.placement import S_COL, S_TOK, Collective, P, Placement, R

H = 8  # hidden width
T = 8  # tokens (divisible by every N drawn)
KIND = "rand"


# ----------------------------------------------------------------------------------------------
# Random graphs and plans


@st.composite
def cases(draw):
    n = draw(st.sampled_from([2, 4]))
    values: dict[str, Value] = {"resid": Value("resid", H), "delta": Value("delta", H)}
    ops: list[Op] = []
    weights: dict[str, tuple[int, int]] = {}  # op name -> (out, in)
    pool = ["resid", "delta"]

    def new(
        kind: OpKind,
        inputs: tuple[str, ...],
        width: int,
        heads: int = 0,
        role: str | None = None,
        split: WeightSplit = WeightSplit.NONE,
        split_heads: int = 0,
        weight_shape: tuple[int, ...] = (),
    ):
        i = len(ops)
        name, out = f"op{i}", f"v{i}"
        values[out] = Value(out, width, heads)
        ops.append(
            Op(
                name=name,
                kind=kind,
                inputs=inputs,
                output=out,
                role=role or f"r.{name}",
                split=split,
                split_heads=split_heads,
                weight_shape=weight_shape,
                attrs={"width": width},
            )
        )
        pool.append(out)

    if draw(st.booleans()):  # the residual add of the layer inputs
        new(OpKind.ADD, ("resid", "delta"), H, role="layer.attn_add")
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["norm", "col", "row", "rep", "unary", "mul", "add", "mix"]))
        x = draw(st.sampled_from(pool))
        vx = values[x]
        if kind == "norm":
            new(OpKind.NORM, (x,), vx.width)
        elif kind in ("col", "row", "rep"):
            out_w = H if kind == "row" else draw(st.sampled_from([8, 16]))
            split = {"col": WeightSplit.COL, "row": WeightSplit.ROW, "rep": WeightSplit.REPLICATED}[kind]
            heads = out_w if kind == "col" else 0
            split_heads = out_w if kind == "col" else (vx.width if kind == "row" else 0)
            new(OpKind.LINEAR, (x,), out_w, heads, split=split, split_heads=split_heads, weight_shape=(out_w, vx.width))
            weights[ops[-1].name] = (out_w, vx.width)
        elif kind == "unary":
            new(OpKind.UNARY, (x,), vx.width, vx.heads)
        elif kind == "mix":
            # Only head-structured inputs: the rule needs a non-head input (MLA's shared rope key,
            # read by every head) whole, which a column-local cumsum does not model.
            heads_pool = [v for v in pool if values[v].heads]
            if heads_pool:
                x = draw(st.sampled_from(heads_pool))
                new(OpKind.TOKEN_MIX, (x,), values[x].width, values[x].heads)
        else:
            y = draw(st.sampled_from([v for v in pool if values[v].width == vx.width]))
            new(OpKind.MUL if kind == "mul" else OpKind.ADD, (x, y), vx.width, vx.heads)

    lg = LayerGraph(
        kind=KIND,
        spec=None,
        hidden=H,
        values=values,
        entry=tuple(ops),  # type: ignore[arg-type]
        attn=Block("attn", "x", ()),
        middle=(),
        mlp=Block("mlp", "x", ()),
    )
    roles = [op.role for op in ops]
    producers = [*roles, "layer.resid", "layer.delta"]

    def subset(xs: list[str]) -> frozenset[str]:
        return frozenset(f"{KIND}/{x}" for x in draw(st.lists(st.sampled_from(xs), unique=True))) if xs else frozenset()

    plan = Plan(
        name="rand",
        title="",
        summary="",
        stream=draw(st.sampled_from([R, S_TOK])),
        reduce=draw(st.sampled_from([R, S_TOK])),
        gather=subset(producers),
        a2a=subset(producers),
        replicate=subset(roles),
        token_shard=subset(roles),
    )
    delta = draw(st.sampled_from([P, P, R, S_TOK]))
    seed = draw(st.integers(0, 2**31 - 1))
    return lg, plan, n, delta, weights, seed


# ----------------------------------------------------------------------------------------------
# Placements on N virtual ranks


def rows(r: int, n: int) -> slice:
    return slice(r * T // n, (r + 1) * T // n)


def cols(width: int, r: int, n: int) -> slice:
    return slice(r * width // n, (r + 1) * width // n)


def shard(full: np.ndarray, p: Placement, r: int, n: int) -> np.ndarray:
    """What rank r holds of the true value `full` in placement p (P: rank 0 keeps it, others 0)."""
    if p is R:
        return full.copy()
    if p is S_TOK:
        return full[rows(r, n)].copy()
    if p is S_COL:
        return full[:, cols(full.shape[1], r, n)].copy()
    return full.copy() if r == 0 else np.zeros_like(full)


def assemble(locs: list[np.ndarray], p: Placement) -> np.ndarray:
    """The true value the ranks' buffers stand for under placement p."""
    if p is R:
        return locs[0]
    if p is S_TOK:
        return np.concatenate(locs, axis=0)
    if p is S_COL:
        return np.concatenate(locs, axis=1)
    return np.sum(locs, axis=0)


def collective(locs: list[np.ndarray], src: Placement, dst: Placement, n: int) -> list[np.ndarray]:
    """One collective per the placement definitions: AR (P→R), RS (P→S(tok), by token rows),
    AG (S(tok)/S(col)→R), A2A (S(tok)↔S(col))."""
    if src is P and dst is R:  # all-reduce
        s = np.sum(locs, axis=0)
        return [s.copy() for _ in range(n)]
    if src is P and dst is S_TOK:  # reduce-scatter
        return [np.sum([loc[rows(r, n)] for loc in locs], axis=0) for r in range(n)]
    if dst is R and src in (S_TOK, S_COL):  # all-gather
        g = np.concatenate(locs, axis=0 if src is S_TOK else 1)
        return [g.copy() for _ in range(n)]
    if src is S_TOK and dst is S_COL:  # all-to-all: send my rows of your columns
        w = locs[0].shape[1]
        return [np.concatenate([locs[s][:, cols(w, r, n)] for s in range(n)], axis=0) for r in range(n)]
    raise AssertionError(f"no collective {src}->{dst}")


def naive_as(loc: np.ndarray, got: Placement, need: Placement, r: int, n: int, width: int) -> np.ndarray:
    """A naive rank's reading of its buffer as `need`, with no collective: missing rows/columns are
    zeros (a buffer never filled), a partial summand is taken for the true value."""
    if got == need:
        return loc
    step = transition(got, need)
    if step is not None and step.free:
        return shard(loc, need, r, n)
    if got is P:
        return shard(loc, need, r, n) if need is not P else loc
    full = np.zeros((T, width))
    if got is S_TOK:
        full[rows(r, n)] = loc
    else:  # S_COL
        full[:, cols(width, r, n)] = loc
    return full if need in (R, P) else shard(full, need, r, n)


def rmsnorm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6)


def apply(
    op: Op, xs: list[np.ndarray], w: np.ndarray | None, split: str, r: int, n: int, out: Placement = R
) -> np.ndarray:
    """Run `op` on one rank's local inputs; a linear weight is placed per `split`. A token mix with
    a head-sharded output computes only its rank's heads, even from an input it needs whole (a
    non-head input, like MLA's shared rope key, is needed as R)."""
    k = op.kind
    if k is OpKind.NORM:
        return rmsnorm(xs[0])
    if k is OpKind.LINEAR:
        assert w is not None
        if split == WeightSplit.COL:
            w = w[cols(w.shape[0], r, n), :]  # my output columns
        elif split == WeightSplit.ROW:
            w = w[:, cols(w.shape[1], r, n)]  # my input columns
        return xs[0] @ w.T
    if k is OpKind.UNARY:
        return 1.0 / (1.0 + np.exp(-xs[0]))
    if k is OpKind.MUL:
        return xs[0] * xs[1]
    if k is OpKind.ADD:
        return xs[0] + xs[1]
    if k is OpKind.TOKEN_MIX:
        y = np.cumsum(xs[0], axis=0)  # causal mix over tokens, column by column
        if out is S_COL and xs[0].shape[1] == op.attrs["width"]:
            y = y[:, cols(y.shape[1], r, n)]
        return y
    raise AssertionError(k)


# ----------------------------------------------------------------------------------------------
# The property


@pytest.mark.slow
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_legal_plans_compute_the_unsharded_values_and_violations_break_them(case):
    lg, plan, n, delta_pl, wshapes, seed = case
    rng = np.random.default_rng(seed)
    res = propagate(lg, plan, n, delta=delta_pl)
    pl = res.placements

    # Unsharded reference.
    weights = {name: rng.standard_normal(shape) for name, shape in wshapes.items()}
    resid = rng.standard_normal((T, H))
    delta_parts = [rng.standard_normal((T, H)) for _ in range(n)]
    ref = {"resid": resid, "delta": np.sum(delta_parts, axis=0)}
    for op in lg.ops:
        ref[op.output] = apply(op, [ref[v] for v in op.inputs], weights.get(op.name), WeightSplit.REPLICATED, 0, 1)

    # Per-rank buffers of the layer inputs.
    local: dict[str, list[np.ndarray]] = {"resid": [shard(resid, plan.stream, r, n) for r in range(n)]}
    local["delta"] = delta_parts if delta_pl is P else [shard(ref["delta"], delta_pl, r, n) for r in range(n)]

    recorded = {(c.value, c.collective, c.dst) for c in res.comms}
    assert [d.op for d in res.decisions] == list(lg.ops)
    roots = {v.op for v in res.violations if v.consequence_of is None}
    event("legal" if res.legal else "illegal")
    if res.legal:
        for c in sorted({c.collective.short for c in res.comms}):
            event(f"legal plan uses {c}")
        for p in sorted({str(p) for p in pl.values()}):
            event(f"legal plan has a {p} value")

    for d in res.decisions:
        op, strat = d.op, d.strategy
        w = weights.get(op.name)
        # 1. the conversions the plan names (gather / all-to-all), then the ones the strategy needs
        ins: list[list[np.ndarray]] = []
        for v, got in zip(op.inputs, d.inputs_received, strict=True):
            locs = local[v]
            if got != pl[v]:
                coll = Collective.ALL_GATHER if got is R else Collective.ALL_TO_ALL
                assert (v, coll, got) in recorded, f"{coll} of {v} applied but not recorded"
                locs = collective(locs, pl[v], got, n)
            ins.append(locs)

        if d.legal:
            xs_by_rank: list[list[np.ndarray]] = [[] for _ in range(n)]
            for v, locs, got, need in zip(op.inputs, ins, d.inputs_received, strat.inputs, strict=True):
                if got != need:
                    step = transition(got, need)
                    if step is not None and step.free:
                        locs = [shard(locs[r], need, r, n) for r in range(n)]
                    else:
                        assert got is P and need in (R, S_TOK), (op.name, got, need)
                        coll = Collective.ALL_REDUCE if need is R else Collective.REDUCE_SCATTER
                        assert (v, coll, need) in recorded, f"{coll} of {v} applied but not recorded"
                        locs = collective(locs, P, need, n)
                for r in range(n):
                    xs_by_rank[r].append(locs[r])
            assert pl[op.output] is strat.output
            local[op.output] = [apply(op, xs_by_rank[r], w, d.split, r, n, strat.output) for r in range(n)]
            if not res.violations:
                got_val = assemble(local[op.output], strat.output)
                np.testing.assert_allclose(
                    got_val,
                    ref[op.output],
                    rtol=1e-9,
                    atol=1e-9,
                    err_msg=f"legal plan, wrong value {op.output} at {op.name}",
                )
            continue

        # 2. an illegal op: if it is a root, the naive run must give a wrong value
        if op.name in roots:
            broken = [
                (got, need)
                for got, need in zip(d.inputs_received, strat.inputs, strict=True)
                if got != need and not getattr(transition(got, need), "free", False)
            ]
            if not all(got in (S_TOK, S_COL) and need is P for got, need in broken):
                widths = [lg.values[v].width for v in op.inputs]
                outs = []
                for r in range(n):
                    xs = [
                        naive_as(locs[r], got, need, r, n, wd)
                        for locs, got, need, wd in zip(ins, d.inputs_received, strat.inputs, widths, strict=True)
                    ]
                    outs.append(apply(op, xs, w, d.split, r, n, strat.output))
                naive = assemble(outs, strat.output)
                assert not np.allclose(naive, ref[op.output], rtol=1e-6, atol=1e-6), (
                    f"violation at {op.name} ({[(str(g), str(nd)) for g, nd in broken]}) but the naive run is right"
                )
                event(f"root violation checked: {sorted({f'{g}->{nd}' for g, nd in broken})}")
            else:
                event("root violation skipped: only S->P edges (conservative, see module doc)")
        # keep going with the true values, placed as the propagation says the output is
        local[op.output] = [shard(ref[op.output], pl[op.output], r, n) for r in range(n)]

    # every value, assembled from the ranks, is the reference value (legal plans only)
    if not res.violations:
        for v, p in pl.items():
            if v in local:
                np.testing.assert_allclose(assemble(local[v], p), ref[v], rtol=1e-9, atol=1e-9, err_msg=v)
