"""Micro-batch overlap (`plan.overlap` tbo/dbo, `tpplan.engines.overlap`): the batch cut into the two
micro-batches the engine makes of it, run interleaved so each one's MoE all-to-all hides behind the
other's compute. The program lists both micro-batches; the cost model simulates their interleaving
(`tpplan.cost.overlap`). Async TP is the async_tp pass's."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tpplan.engines import overlap_named
from tpplan.engines.schema import MicroBatchOverlap
from tpplan.lower.batch import Segments
from tpplan.lower.program import MicroBatch, Program
from tpplan.lower.registry import Pass, register

if TYPE_CHECKING:
    from tpplan.lower.context import Lowering


def _cut(segs: Segments, at: int) -> tuple[Segments, Segments]:
    """Split a batch at token `at`: a request that straddles it is cut in two, and the second part
    sees the first part as context (what both engines' attention metadata give the second half)."""
    left: list[tuple[int, int]] = []
    right: list[tuple[int, int]] = []
    seen = 0
    for n, ctx in segs:
        if seen + n <= at:
            left.append((n, ctx))
        elif seen >= at:
            right.append((n, ctx))
        else:
            k = at - seen
            left.append((k, ctx))
            right.append((n - k, ctx + k))
        seen += n
    return tuple(left), tuple(right)


def split_batch(segs: Segments, engine: MicroBatchOverlap) -> tuple[Segments, Segments] | None:
    """The two micro-batches the engine makes of a prefill batch (None: it runs the batch whole).

    SGLang (`_split_extend_seqs`): between requests at the most balanced token sum, unless that
    leaves a side outside [0.48, 0.52] of the tokens: then at the token midpoint. vLLM
    (`maybe_create_ubatch_slices`): at the token midpoint, from `dbo_prefill_token_threshold` tokens."""
    total = sum(n for n, _ in segs)
    if total < max(2, engine.min_tokens):
        return None
    if engine.balance is None:
        return _cut(segs, total // 2)
    best, best_diff, acc = 0, float("inf"), 0
    for i in range(1, len(segs)):
        acc += segs[i - 1][0]
        diff = abs(acc - (total - acc))
        if diff > best_diff:
            break
        best, best_diff = i, diff
    left = sum(n for n, _ in segs[:best])
    if left < total * engine.balance or left > total * (1 - engine.balance):
        return _cut(segs, total // 2)
    return tuple(segs[:best]), tuple(segs[best:])


def _program(ctx: Lowering, prog: Program) -> Program:
    name = ctx.plan.overlap
    if name is None or name == "asynctp":
        return prog
    halves = split_batch(ctx.batch.segments, overlap_named(name))  # cut before CP deals each its share
    if halves is None:  # the engine runs this batch whole
        return prog
    micro = tuple(MicroBatch(i, h, name) for i, h in enumerate(halves))
    return replace(prog, stages=tuple(replace(s, micro_batches=micro) for s in prog.stages))


OVERLAP = register(Pass("overlap", 60, "micro-batch overlap: the two micro-batches the engine cuts", program=_program))

__all__ = ["OVERLAP", "split_batch"]
