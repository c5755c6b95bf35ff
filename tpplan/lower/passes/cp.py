"""Context parallelism (`layout.context_parallel`): a rank's share of the batch, the exchanges CP adds
to a layer on the CP group (peers `tp` GPUs apart) or, under `--cp-layers mla`, on the attention-TP
ranks, the extra local passes of a recurrence's state hand-off (scan correction, serial chain) and of
`--cp-layers mla`'s K/V expansion, and the planned collective an MLA layer's CP exchange replaces.

Sizes (`exchange_bytes`): an all-gather's whole output (every rank's rows, padded to the longest, as
SGLang's `cp_all_gather_reorganized_into_tensor` pads to `max_rank_len`), an all-reduce's buffer or a
send/recv's message (the rank's rows). docs/cost-model.md, "Context parallelism"."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from tpplan.layout.context_parallel import CpExchange
from tpplan.lower.batch import Segments
from tpplan.lower.program import Collective, LayerProgram, LayoutCopy, Step
from tpplan.lower.registry import Pass, register

if TYPE_CHECKING:
    from tpplan.lower.context import Lowering

STATE_DTYPES = {4: "float32", 2: "bfloat16", 1: "float8_e4m3fn"}


def cp_ranks_per_node(stride: int, ranks: int, gpus_per_node: int) -> int:
    """Peers of a CP group of `ranks` that share a node: they sit `stride` GPUs apart (the TP group's
    size: TP innermost)."""
    if stride >= gpus_per_node:
        return 1
    return max(1, min(ranks, gpus_per_node // stride))


def exchange_bytes(x: CpExchange, ranks: int, segs: Segments, b: float) -> float:
    """nccl-tests size of one exchange for a batch over `ranks` CP ranks: an all-gather's whole output
    (every rank's rows, padded to the longest), an all-reduce's buffer or a send/recv's message (the
    rank's rows)."""
    eb = x.elem_bytes if x.elem_bytes is not None else b
    rows = sum(math.ceil(n / ranks) for n, _ in segs)
    seqs = len(segs)
    if x.collective == "all_gather":
        return ranks * (x.per_token * rows + x.per_seq * seqs) * eb
    return (x.per_token * rows + x.per_seq * seqs) * eb


def exchange_call(ctx: Lowering, x: CpExchange) -> Collective:
    """One exchange as a collective step on its group, sized for the batch."""
    audit, gpn = ctx.cp_audit, ctx.gpus_per_node
    cp = audit.cp
    nbytes = exchange_bytes(x, cp, ctx.batch.segments, ctx.elem_bytes)
    eb = x.elem_bytes if x.elem_bytes is not None else ctx.elem_bytes
    rpn = cp_ranks_per_node(audit.attn_tp, cp, gpn)  # peers attn_tp GPUs apart (`all`: attn_tp is tp)
    kind = x.collective
    if x.group == "attn_tp":
        ranks, on_node, axis = audit.attn_tp, min(audit.attn_tp, gpn), "attn_tp"
    else:
        ranks, on_node, axis = (2, min(rpn, 2), "cp") if kind == "send_recv" else (cp, rpn, "cp")
    dtype = ctx.act if x.elem_bytes is None else STATE_DTYPES.get(int(eb), ctx.act)
    sent = nbytes * (ranks - 1) / ranks if kind != "send_recv" else nbytes
    return Collective(kind, "+".join(x.values), x.label(), "cp", axis, ranks, on_node, (round(nbytes / eb),), dtype,
                      round(nbytes), sent, nbytes, chain=max(1, x.chain), origin="cp", op=x.op)  # fmt: skip


def _extra_passes(ctx: Lowering, layer: LayerProgram, x: CpExchange) -> list[Step]:
    """A recurrence's state hand-off priced as more local passes of it: the scan's correction (one), or
    the serial chain's wait for the c-1 ranks before it."""
    if x.method not in ("state_scan", "state_serial"):
        return []
    rec = next((k for k in layer.kernels() if k.op == x.op and k.repeat_of is None), None)
    if rec is None:
        return []
    serial = x.method == "state_serial"
    name = "cp_chain_wait" if serial else "cp_scan_correction"
    return [replace(rec, op=f"{x.op}:{name}", redundant=False, origin="cp", repeat_of=x.op,
                    times=ctx.cp_audit.cp - 1 if serial else 1)]  # fmt: skip


def _layer(ctx: Lowering, layer: LayerProgram) -> LayerProgram:
    audit = ctx.cp_audit
    ck = audit.kinds[layer.kind]
    gone = set(ck.replaces)  # `--cp-layers mla`: the CP exchanges take this collective's place

    def kept(s: Step) -> bool:
        return not (isinstance(s, Collective | LayoutCopy) and s.value in gone and s.origin != "cp")

    steps: list[Step] = [s for s in layer.steps if kept(s)] if gone else list(layer.steps)
    layer = replace(layer, steps=tuple(steps))
    if audit.cp <= 1:
        return layer
    for x in ck.exchanges:
        steps += [exchange_call(ctx, x), *_extra_passes(ctx, layer, x)]
    for name, times in ck.replicated:  # `mla`: each rank expands K/V for every key with A ranks' heads
        rec = next((k for k in layer.kernels() if k.op == name and k.repeat_of is None), None)
        if rec is not None and times > 1:
            steps.append(replace(rec, op=f"{name}:cp_replicated", redundant=True, origin="cp", repeat_of=name,
                                 times=times - 1))  # fmt: skip
    return replace(layer, steps=tuple(steps))


CP = register(Pass("cp", 40, "CP exchanges, a recurrence's hand-off passes, the collectives MLA's CP replaces", _layer))

__all__ = ["CP", "cp_ranks_per_node", "exchange_bytes", "exchange_call"]
