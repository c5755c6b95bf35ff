"""Context parallelism priced: a CP rank's share of a batch, and what CP adds to a layer.

Under CP `c` (`tpplan.layout.context_parallel`) every op of a layer runs on the rank's own tokens,
so a layer is priced at the slowest CP rank's batch (`local_segments`), written as the segments its
attention calls see: under the zigzag split two chunks of n/2c tokens per request, each after the
keys before it (its context: the gathered K/V of earlier chunks), 1/c of the request's causal pairs
on every rank; under the contiguous split a hybrid with linear attention uses, the last rank's n/c
tokens after (c-1)n/c keys, (2c-1)/c^2 of the pairs. Every attention pricer (roofline, kernel
models, kernel sources) then reads the right work, and every other op the rank's rows.

What CP adds (the lowering's CP pass, `tpplan.lower.passes.cp`, priced by the predictor), per layer,
on the CP group (peers `tp` GPUs apart, so `c` ranks share a node only while tp x c fits in one):
- every all-gather of K/V or of the MLA latent: the c ranks' rows padded to the longest rank (as
  SGLang's `cp_all_gather_reorganized_into_tensor` pads to `max_rank_len`), through the collective
  pricer (`cost.collective_pricer.price_collective`);
- the linear-attention state: the two-pass scan's all-gather of each rank's state and chunk
  transition plus a correction pass priced as one more local recurrence (an assumption: the
  correction applies the incoming state to every local token, about the inter-chunk half of a
  chunked scan, counted whole), or the serial chain: c-1 further local recurrences and c-1 sends
  one after another on the critical path;
- the short convolution's halo: one send/recv of conv_kernel-1 rows per request.

Under `--cp-layers mla` (CP inside the TP group, `layout.context_parallel`) no layer's batch is split
(`Predictor.cp` is 1): every op keeps its TP price on the full sequence, which is what the MLA
attention's own ops cost too (1/c of the queries x c times the heads per rank: the same FLOPs, at
TP-shaped GEMMs, an approximation), except the K/V expansion each rank runs for every key with
A = tp/c ranks' heads (`CpKind.replicated`: c times its TP share, the extra priced as an op). The
plan's collective on the attention output is dropped (`CpKind.replaces`) for an all-reduce over the
A attention-TP ranks of the rank's ceil(n/c) rows (none at A = 1) and the all-gather of those rows
over the c CP ranks, peers A GPUs apart. Memory: a rank holds the attention half's weights at
attention TP A, c times the plan's TP share of each sharded one (`cp_weight_elements`).
"""

from __future__ import annotations

from tpplan.layout.context_parallel import CpAudit
from tpplan.layout.propagate import OpDecision


def cp_weight_elements(audit: CpAudit, kind: str, d: OpDecision) -> float:
    """Weight elements one rank holds for an op decision of layer kind `kind`: under `--cp-layers mla` an MLA
    layer's attention ops run at attention TP tp/cp, so a rank holds cp times the plan's TP share of a sharded
    weight (all of it at tp = cp); every other op its plan share."""
    w = d.weight_elements_per_rank
    if d.op.name not in audit.kinds[kind].attention_ops:
        return w
    return min(float(d.op.weight_numel), w * audit.cp)


__all__ = ["cp_weight_elements"]
