"""Context parallelism priced: a CP rank's share of a batch, and what CP adds to a layer.

Under CP `c` (`tpplan.layout.context_parallel`) every op of a layer runs on the rank's own tokens,
so a layer is priced at the slowest CP rank's batch (`local_segments`), written as the segments its
attention calls see: under the zigzag split two chunks of n/2c tokens per request, each after the
keys before it (its context: the gathered K/V of earlier chunks), 1/c of the request's causal pairs
on every rank; under the contiguous split a hybrid with linear attention uses, the last rank's n/c
tokens after (c-1)n/c keys, (2c-1)/c^2 of the pairs. Every attention pricer (roofline, kernel
models, kernel sources) then reads the right work, and every other op the rank's rows.

What CP adds (`cp_extras`), per layer, on the CP group (peers `tp` GPUs apart, so `c` ranks
share a node only while tp x c fits in one):
- every all-gather of K/V or of the MLA latent: the c ranks' rows padded to the longest rank (as
  SGLang's `cp_all_gather_reorganized_into_tensor` pads to `max_rank_len`), through the collective
  pricer (`cost.comm.price_collective`);
- the linear-attention state: the two-pass scan's all-gather of each rank's state and chunk
  transition plus a correction pass priced as one more local recurrence (an assumption: the
  correction applies the incoming state to every local token, about the inter-chunk half of a
  chunked scan, counted whole), or the serial chain: c-1 further local recurrences and c-1 sends
  one after another on the critical path;
- the short convolution's halo: one send/recv of conv_kernel-1 rows per request.

Under `--cp-layers mla` (CP inside the TP group, `layout.context_parallel`) no layer's batch is split
(`OpPrices.cp` is 1): every op keeps its TP price on the full sequence, which is what the MLA
attention's own ops cost too (1/c of the queries x c times the heads per rank: the same FLOPs, at
TP-shaped GEMMs, an approximation), except the K/V expansion each rank runs for every key with
A = tp/c ranks' heads (`CpKind.replicated`: c times its TP share, the extra priced as an op). The
plan's collective on the attention output is dropped (`CpKind.replaces`) for an all-reduce over the
A attention-TP ranks of the rank's ceil(n/c) rows (none at A = 1) and the all-gather of those rows
over the c CP ranks, peers A GPUs apart. Memory: a rank holds the attention half's weights at
attention TP A, c times the plan's TP share of each sharded one (`cp_weight_elements`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpplan.cost.comm import price_collective
from tpplan.cost.prediction import CollectiveTime, OpTime
from tpplan.cost.segments import Segments
from tpplan.layout.context_parallel import CpKind
from tpplan.layout.propagate import OpDecision
from tpplan.lower.batch import local_segments
from tpplan.lower.passes.cp import cp_ranks_per_node, exchange_bytes

if TYPE_CHECKING:
    from tpplan.cost.op_prices import OpPrices


def cp_weight_elements(ck: CpKind, cp: int, d: OpDecision) -> float:
    """Weight elements one rank holds for an op decision: under `--cp-layers mla` an MLA layer's attention
    ops run at attention TP tp/cp, so a rank holds cp times the plan's TP share of a sharded weight (all of
    it at tp = cp); every other op its plan share."""
    w = d.weight_elements_per_rank
    if d.op.name not in ck.attention_ops:
        return w
    return min(float(d.op.weight_numel), w * cp)


def cp_extras(
    prices: OpPrices, ck: CpKind, local_ops: list[OpTime], segs: Segments
) -> tuple[list[OpTime], list[CollectiveTime]]:
    """The ops and collectives CP adds to one layer of kind `ck` (the layer's own ops already priced
    at the local batch, `local_ops`)."""
    audit = prices.cp_audit
    cp, gpn = audit.cp, prices.topo.gpus_per_node
    ops: list[OpTime] = []
    colls: list[CollectiveTime] = []
    rpn = cp_ranks_per_node(audit.attn_tp, cp, gpn)  # peers attn_tp GPUs apart (`all`: attn_tp is tp)
    for x in ck.exchanges:
        nbytes = exchange_bytes(x, cp, segs, prices.b)
        kind = x.collective
        if x.group == "attn_tp":
            ranks, on_node = audit.attn_tp, min(audit.attn_tp, gpn)
        else:
            ranks, on_node = (2, min(rpn, 2)) if kind == "send_recv" else (cp, rpn)
        est = price_collective(kind, nbytes, ranks, prices.topo, ranks_per_node=on_node,
                               sources=prices.compute.sources)  # fmt: skip
        steps = max(1, x.chain)
        colls.append(CollectiveTime(ck.kind, x.label(), kind, "cp", nbytes, est.time_s * steps, est.algorithm))
        if x.method in ("state_scan", "state_serial"):
            rec = next((o for o in local_ops if o.op == x.op), None)
            if rec is None:
                continue
            factor = cp - 1 if x.method == "state_serial" else 1
            name = "cp_chain_wait" if x.method == "state_serial" else "cp_scan_correction"
            ops.append(OpTime(ck.kind, f"{x.op}:{name}", rec.role, rec.category, rec.flops_per_rank * factor,
                              rec.bytes_per_rank * factor, rec.seconds * factor, False, None, None,
                              rec.seconds * factor, rec.extrapolated, rec.source))  # fmt: skip
    for name, times in ck.replicated:  # `mla`: each rank expands K/V for every key with A ranks' heads
        rec = next((o for o in local_ops if o.op == name), None)
        if rec is None or times <= 1:
            continue
        f = times - 1
        ops.append(OpTime(ck.kind, f"{name}:cp_replicated", rec.role, rec.category, rec.flops_per_rank * f,
                          rec.bytes_per_rank * f, rec.seconds * f, True, None, None, rec.seconds * f,
                          rec.extrapolated, rec.source))  # fmt: skip
    return ops, colls


__all__ = ["cp_extras", "cp_ranks_per_node", "cp_weight_elements", "exchange_bytes", "local_segments"]
