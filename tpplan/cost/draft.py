"""The draft of speculative decoding as the engines load and run it (`tpplan.engines.speculative`, where the
rules are read): its weights per rank and its KV layers, which come out of the KV pool
(`tpplan.cost.kv_capacity`), and its seconds per decode step on the last stage, through the target's own
pricers: a draft layer's lowered program (`Predictor.kind_time`), the GEMM pricer (`KernelPricer.gemm_seconds`)
and the collective pricer (`price_collective`). No second cost path: the draft's decoder layer is the
target's last layer, lowered and priced as the target's is.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.audit import layer_weight_bytes
from tpplan.cost.collective_pricer import price_collective
from tpplan.cost.predictor import Predictor
from tpplan.engines.speculative import Speculative

NORMS = 3  # a nextn layer's enorm, hnorm and shared_head.norm, one hidden-wide weight each


@dataclass(frozen=True)
class DraftMemory:
    """The MTP draft on one rank: `layers` nextn layers (the config's num_nextn_predict_layers), each the
    target's last decoder layer sharded as the target's (`layer_bytes`) plus its unsharded eh_proj and
    norms (`glue_bytes`); the embedding and lm_head are the target's, shared. Each layer caches every token
    as the target's last layer does, in the target's pool."""

    layers: int
    layer_bytes: float
    glue_bytes: float

    @property
    def weights(self) -> float:
        """The draft's weight bytes on one rank."""
        return self.layers * (self.layer_bytes + self.glue_bytes)

    def to_json(self) -> dict[str, object]:
        return {"layers": self.layers, "weights_bytes_per_rank": self.weights}


def draft_memory(p: Predictor, spec: Speculative | None) -> DraftMemory | None:
    """The draft's memory on `p`'s deployment; None without speculative decoding, and for EAGLE, whose
    draft checkpoint's config tpplan does not read (`EAGLE_NOT_MODELLED`)."""
    if spec is None or spec.method != "mtp":
        return None
    model = p.graph.spec
    spec.check_model(model)
    stored = p.kernels.stored
    layer = layer_weight_bytes(p.audit.layer_results[-1], stored, p.audit.n)
    glue = (2 * model.hidden * model.hidden + NORMS * model.hidden) * stored.dtype_bytes  # eh_proj: 2H -> H
    return DraftMemory(model.mtp_layers, layer, glue)


def draft_rows(p: Predictor, tokens: int) -> int:
    """The rows a rank's replicated GEMM (the eh_proj) runs for `tokens` of the replica: DP attention
    spreads the requests over the ranks, each running its own; TP runs every token on every rank."""
    return -(-tokens // p.tp) if p.plan.dp_attention else tokens


def draft_pass_extras(p: Predictor, batch: int, width: int) -> float:
    """Seconds of one draft pass beside its decoder layer, for `batch` requests of `width` tokens: the eh_proj
    (hidden x 2 -> hidden, every rank whole) over the pass's tokens, and the shared lm_head (vocab-parallel over
    TP) over one token per request, with the logits' all-gather over the TP group."""
    model = p.graph.spec
    h = model.hidden
    eh = p.kernels.gemm_seconds(draft_rows(p, batch * width), 2 * h, h)
    head = p.kernels.gemm_seconds(batch, h, -(-model.vocab // p.tp))
    gather = 0.0
    if p.tp > 1:
        est = price_collective("all_gather", batch * model.vocab * p.b, p.tp, p.topo, ranks_per_node=p.rpn,
                               sources=p.comms.sources)  # fmt: skip
        gather = est.time_s
    return eh + head + gather


def draft_step_seconds(p: Predictor, spec: Speculative, batch: int, context: int) -> float:
    """A speculative step's draft on the last stage: one pass over the verify width per request (SGLang's
    draft extend, vLLM's draft prefill) and k - 1 one-token passes, each `draft_layers` of the target's last
    decoder layer at that batch and context plus the pass's eh_proj, lm_head and logits' gather."""
    last = p.audit.layer_results[-1]
    wide_layer = p.kind_time(last, ((spec.verify_tokens, context),) * batch).total_s
    wide = spec.draft_layers * wide_layer + draft_pass_extras(p, batch, spec.verify_tokens)
    if spec.draft_tokens == 1:
        return wide
    one_layer = p.kind_time(last, ((1, context),) * batch).total_s
    one = spec.draft_layers * one_layer + draft_pass_extras(p, batch, 1)
    return wide + (spec.draft_tokens - 1) * one


__all__ = ["DraftMemory", "draft_memory", "draft_pass_extras", "draft_rows", "draft_step_seconds"]
