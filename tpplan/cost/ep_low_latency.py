"""The MoE all-to-all of a decode step as SGLang runs it with DeepEP (`tpplan.engines.deepep`): under
`--moe-a2a-backend deepep` and the default `--deepep-mode auto`, a batch with no prefill request dispatches
and combines with DeepEP's low-latency kernels. They send one message per (token, selected expert), the
dispatch in FP8 with its scales and the combine in bf16, where the lowered all-to-all (`lower.passes.ep_a2a`,
what tpplan's runtime and DeepEP's normal kernels move) sends a token once to each rank hosting one of its
experts, in the activation dtype with the routing weights as extra columns.

`low_latency_steps` re-prices the lowered dispatch and combine of such a batch at the low-latency bytes:
one rank's send buffer of its tokens x top-k messages, priced as an all-to-all on the EP group by the
topology's collective pricing (latency-bound at decode sizes: the link's per-call and per-hop latency
dominate a few hundred kilobytes). The lowering itself is unchanged: tpplan's runtime does not run DeepEP.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from tpplan.cost.segments import Segments
from tpplan.engines.deepep import DEFAULT_MODE, MAX_TOKENS, Mode, combine_message_bytes, dispatch_message_bytes, mode_at
from tpplan.lower.program import Collective
from tpplan.models.graph import LayerGraph
from tpplan.models.opkinds import op_kind

LL_SUFFIX = " (DeepEP low-latency)"


def runs_low_latency(engine: str, segs: Segments, mode: Mode = DEFAULT_MODE) -> bool:
    """Whether `engine` runs this batch's MoE all-to-all with DeepEP's low-latency kernels: SGLang, a batch
    of decode tokens only (every request one new token: no extend request), `mode` resolving to low latency."""
    decode_only = bool(segs) and all(new == 1 for new, _ in segs)
    return engine.split("@")[0].lower() == "sglang" and mode_at(mode, extend=not decode_only) == "low_latency"


def low_latency_bytes(step: Collective, tokens: int, top_k: int, hidden: int) -> float:
    """One rank's send buffer of a low-latency dispatch or combine: `tokens` x `top_k` messages."""
    per = dispatch_message_bytes(hidden) if step.value.endswith(":dispatch") else combine_message_bytes(hidden)
    return float(tokens * top_k * per)


def low_latency_steps(
    steps: Sequence[Collective], lg: LayerGraph, tokens: int, engine: str, segs: Segments
) -> list[Collective]:
    """`steps` with a decode batch's EP dispatch and combine re-priced as DeepEP's low-latency kernels send
    them (`tokens`: the batch's tokens over the EP group, each rank sending its own share); other steps and
    other batches as they are. A rank's share above `MAX_TOKENS` does not fit the low-latency buffers:
    left as lowered."""
    if not runs_low_latency(engine, segs):
        return list(steps)
    op = next((o for o in lg.ops if op_kind(o.kind).routed_experts), None)
    out = []
    for s in steps:
        routed = s.origin == "ep_a2a" and s.value.endswith((":dispatch", ":combine"))
        mine = math.ceil(tokens / s.group) if routed else 0
        if op is None or not routed or mine > MAX_TOKENS:
            out.append(s)
            continue
        nbytes = low_latency_bytes(s, mine, op.int_attr("top_k"), op.int_attr("width"))
        out.append(replace(s, priced_bytes=nbytes, label=s.label + LL_SUFFIX))
    return out


__all__ = ["LL_SUFFIX", "low_latency_bytes", "low_latency_steps", "runs_low_latency"]
