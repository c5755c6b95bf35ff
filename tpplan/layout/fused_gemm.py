"""Which collectives of a propagated plan async TP fuses with a GEMM (`tpplan.engines.async_tp`).

Two patterns, read off the layer's own collectives and op decisions (nothing per model):

- all-gather -> GEMM: an all-gather of a token-sharded value (S(tok) -> R) that linear ops read whole;
  every such linear becomes one `fused_all_gather_matmul` B (torch runs each chunk through all of them);
- GEMM -> reduce-scatter: a reduce-scatter (P -> S(tok)) of a row-parallel linear's partial sum. The
  reduce-scatter at a layer's entry reduces the previous layer's block output (`delta`), so its GEMM is
  the previous layer's producer of `mlp_out`; the first layer's (the embedding's partial sum) has none.

These are the sequence-parallel plans' collectives; an all-reduce, an all-to-all, a gather of a GEMM's
output for a norm (the MLA latent) or a collective next to a non-GEMM op is not fused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tpplan.layout.plan import Plan
from tpplan.layout.propagate import LayerResult
from tpplan.models.opkinds import op_kind
from tpplan.placement import S_TOK, Collective, P, R

BLOCK_OUTPUT = "mlp_out"  # the value a layer hands the next one as `delta`


@dataclass(frozen=True)
class FusedPair:
    """One collective fused with the GEMMs on its side, as indices into the layer results."""

    pattern: Literal["ag_gemm", "gemm_rs"]
    comm: int  # index into this layer's `comms`
    gemms: tuple[int, ...]  # indices into `decisions` (of the previous layer when `from_previous`)
    from_previous: bool = False  # the reduce-scatter of `delta`: the GEMM ran in the previous layer


def _linear(res: LayerResult, i: int) -> bool:
    return op_kind(res.decisions[i].op.kind).linear


def fused_pairs(res: LayerResult, prev: LayerResult | None = None) -> list[FusedPair]:
    """The fused pairs of one layer (`prev`: the layer before it, for the reduce-scatter of `delta`)."""
    out = []
    for ci, c in enumerate(res.comms):
        if c.internal:
            continue
        if c.collective is Collective.ALL_GATHER and c.src is S_TOK and c.dst is R:
            readers = tuple(
                i for i, d in enumerate(res.decisions)
                if _linear(res, i) and c.value in d.op.inputs and d.strategy.inputs[d.op.inputs.index(c.value)] is R
            )  # fmt: skip
            if readers:
                out.append(FusedPair("ag_gemm", ci, readers))
        elif c.collective is Collective.REDUCE_SCATTER and c.src is P and c.dst is S_TOK:
            here = [i for i, d in enumerate(res.decisions) if d.op.name == c.producer]
            if here:
                if _linear(res, here[0]) and res.decisions[here[0]].split == "row":
                    out.append(FusedPair("gemm_rs", ci, (here[0],)))
            elif c.value == "delta" and prev is not None:
                src = [i for i, d in enumerate(prev.decisions) if d.op.output == BLOCK_OUTPUT]
                if src and _linear(prev, src[0]) and prev.decisions[src[0]].split == "row":
                    out.append(FusedPair("gemm_rs", ci, (src[0],), from_previous=True))
    return out


def model_pairs(results: list[LayerResult]) -> list[list[FusedPair]]:
    """Per layer in order, its fused pairs (each layer seeing the one before it)."""
    return [fused_pairs(r, results[i - 1] if i else None) for i, r in enumerate(results)]


def describe_pair(pair: FusedPair, res: LayerResult, prev: LayerResult | None) -> str:
    """One line for `explain`: the collective and the GEMMs it runs inside."""
    c = res.comms[pair.comm]
    if pair.pattern == "ag_gemm":
        names = ", ".join(res.decisions[i].op.name for i in pair.gemms)
        return f"AG {c.value}[{c.width}] fused into {names} (fused_all_gather_matmul)"
    owner = prev if pair.from_previous else res
    assert owner is not None
    gemm = owner.decisions[pair.gemms[0]].op.name
    where = " of the previous layer" if pair.from_previous else ""
    return f"{gemm}{where} fused into RS {c.value}[{c.width}] (fused_matmul_reduce_scatter)"


def async_tp_refusal(plan: Plan, n: int, results: list[LayerResult]) -> str | None:
    """Why `plan` at TP `n` has nothing for async TP to fuse (None: it has); `results` its propagated layers."""
    if n < 2:
        return f"TP{n} issues no collective to fuse"
    if plan.dp_attention:
        return ("DP attention gathers and scatters padded per-rank buffers of other requests around the MLP, "
                "not a sequence-parallel stream")  # fmt: skip
    if not any(model_pairs(results)):
        kinds = sorted({c.collective.short for r in results for c in r.comms if not c.internal})
        return (f"plan {plan.name} has no all-gather feeding a GEMM and no GEMM feeding a reduce-scatter "
                f"(its collectives: {', '.join(kinds) or 'none'})")  # fmt: skip
    return None


__all__ = ["FusedPair", "async_tp_refusal", "describe_pair", "fused_pairs", "model_pairs"]
